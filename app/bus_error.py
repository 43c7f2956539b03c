"""SIGBUS said in words: a file this process maps shrank or was replaced in place under it.

llama.cpp maps a model's weights from its file; a page read past the file's new end raises
SIGBUS, which by default kills the process with "Bus error (core dumped)" and nothing else. The
check before each generation (engine/model_files.py) catches a change between generations; one
during a generation lands here. Python's own signal handlers cannot: they run between bytecodes,
and the faulting instruction, inside llama.cpp, would fault again on return. So the handler is a C
function pointer (a ctypes callback) installed with libc's signal(): it writes a title/cause/fix
message to stderr and ends the process with EXIT_ERROR, without returning to the fault. It runs
only when the process cannot go on, so writing with os.write and leaving with os._exit (no
cleanup, no Python locks taken) is all it does.
"""
from __future__ import annotations

import ctypes
import os
import signal

from localspec.engine.model_files import CHANGED_FIX

from .exits import EXIT_ERROR

MESSAGE = ("\nError: A model file changed while in use\n"
           "  cause: a file this process reads its model from was truncated or overwritten while it "
           "ran (SIGBUS: a page of it is gone)\n"
           f"  fix:   {CHANGED_FIX}\n").encode()

_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
_installed: list = []     # the callback, kept alive as long as the process


def _on_bus_error(signum: int) -> None:
    os.write(2, MESSAGE)
    os._exit(EXIT_ERROR)


def explain_bus_errors() -> None:
    """Install the handler (once per process; Linux and other glibc/musl systems)."""
    if _installed:
        return
    callback = _HANDLER(_on_bus_error)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, _HANDLER)
    libc.signal(signal.SIGBUS, callback)
    _installed.append(callback)
