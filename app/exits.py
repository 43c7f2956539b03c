"""How a command ends: one place that turns whatever stops a command into an exit status and a
message, so that no path ends in a raw traceback.

* A LocalspecError (a cause the user can fix) prints title / cause / fix: exit 2. Every
  message goes through app/terminal.py's `printable`: it may quote an argument or a file name,
  whose control characters must not reach the terminal.
* Ctrl+C at any moment, model loading included, prints "interrupted": exit 130. Before
  `run_command` runs (the command line still importing), an uncaught KeyboardInterrupt ends the
  same way through `quiet_uncaught_interrupts`, installed when localspec.app is imported. llama.cpp calls
  back into Python while it loads (its log), and a KeyboardInterrupt raised inside a ctypes
  callback is printed as "Exception ignored" and dropped, after which the command would run to
  its end and exit 0; such a dropped interrupt is delivered again until it lands in Python code.
  Once the command is over, a Ctrl+C during the interpreter's exit is ignored, so the process
  ends with the command's status (0 or 130), never killed by the signal half way through its exit.
* A reader that leaves (`localspec generate … | head -c 5`) ends the command quietly (exit 0, as
  when the output was wanted no further); a closed stdout/stderr at start is replaced by
  /dev/null, so the descriptor is never reused for a file that output would then land in; what
  the terminal's encoding cannot show is replaced.
* An OSError the commands did not turn into a LocalspecError is the machine's (permissions, a
  read-only or full disk): its one-line cause and a fix, exit 2. Running out of memory likewise.
* Anything else is a bug: "this is a bug" with the one-line cause, exit 2. LOCALSPEC_DEBUG=1
  prints the traceback as well, for a report. Except after a Ctrl+C: an interrupt that lands
  inside C code (an extension module's import) can come out as another error, so any error once
  a Ctrl+C has arrived ends as the Ctrl+C does.
"""
from __future__ import annotations

import atexit
import errno
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable

from .terminal import printable

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130          # 128 + SIGINT, what shells report for Ctrl+C
DEBUG_VAR = "LOCALSPEC_DEBUG"
_REDELIVER_S = 0.02             # a dropped Ctrl+C is raised again this soon (and again if dropped)

_OS_FIXES = {
    errno.EACCES: "Give your user access to that path, or point localspec elsewhere "
                  "(LOCALSPEC_DATA_DIR for its data)",
    errno.EPERM: "Give your user access to that path, or point localspec elsewhere "
                 "(LOCALSPEC_DATA_DIR for its data)",
    errno.EROFS: "That file system is read-only: make it writable, or set LOCALSPEC_DATA_DIR "
                 "to a writable folder",
    errno.ENOSPC: "Free some disk space, then run the command again",
    errno.EISDIR: "Pass a file there, not a folder",
    errno.EMFILE: "Raise the limit on open files in this shell (`ulimit -n 1024`), then run the "
                  "command again",
    errno.ENFILE: "The system has no open files left: close other programs, then run the command "
                  "again",
}


_CTRL_C = threading.Event()    # a Ctrl+C arrived during this command


def _note_ctrl_c(signum, frame) -> None:
    """Python's own SIGINT handler (raise KeyboardInterrupt), noting that one arrived."""
    _CTRL_C.set()
    raise KeyboardInterrupt


def run_command(body: Callable[[], int]) -> int:
    """Run a command's body and return its exit status, whatever ends it (the module docstring)."""
    status = _run_body(body)
    _ignore_ctrl_c_at_exit()
    return status


def _run_body(body: Callable[[], int]) -> int:
    _prepare_std_streams()
    sys.unraisablehook = _redeliver_interrupts(sys.unraisablehook)
    _CTRL_C.clear()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:   # not where it is ignored
        signal.signal(signal.SIGINT, _note_ctrl_c)
    try:
        # first, so that llama.cpp loads before numpy; inside the guard, as a Ctrl+C may come
        # while it loads
        from localspec.engine.errors import LocalspecError
        try:
            return body()
        except LocalspecError as err:
            return _fail(err.render())
    except KeyboardInterrupt:
        return _interrupted()
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except MemoryError:
        return _fail(_render("Out of memory", "the machine ran out of memory",
                             "Close other programs, or use a smaller model, --ctx or input"))
    except OSError as err:
        where = f": '{err.filename}'" if err.filename else ""
        return _fail(_render("System error", f"{err.strerror or err}{where}",
                             _OS_FIXES.get(err.errno, "Check that path and its permissions, "
                                                      "then run the command again")))
    except Exception as err:   # the last resort this module exists for: a bug, said as one
        if _CTRL_C.is_set():   # unless a Ctrl+C came first: an interrupted import, say
            return _interrupted()
        if os.environ.get(DEBUG_VAR) == "1":
            traceback.print_exc()
        last = traceback.extract_tb(err.__traceback__)[-1:]
        at = f" (at {os.path.basename(last[0].filename)}:{last[0].lineno})" if last else ""
        return _fail(_render("Unexpected failure: this is a bug in localspec",
                             f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}{at}",
                             f"Run it again with {DEBUG_VAR}=1 for the traceback, and report it"))


def _ignore_ctrl_c_at_exit() -> None:
    """Once the command is over, a Ctrl+C can only land in the interpreter's exit, and there
    CPython hands SIGINT back to the system's default before its last steps: the process would die
    by the signal, its status neither the command's nor 130, nothing said. So the first exit
    handler (registered last, run first) ignores it, and the process ends with the command's
    status. A Ctrl+C before that raises in Python code and ends as anywhere else: 130 with
    "interrupted" (uncaught: `quiet_uncaught_interrupts`), or dropped (0) where Python's exit
    reports it as unraisable (`_redeliver_interrupts`)."""
    global _exit_guarded
    if _exit_guarded:
        return
    _exit_guarded = True

    def ignore() -> None:
        while signal.getsignal(signal.SIGINT) in (_note_ctrl_c, signal.default_int_handler):
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            except KeyboardInterrupt:   # one pending: it ran first; the command is over anyway
                continue

    atexit.register(ignore)


_exit_guarded = False   # the exit handler above is registered (run_command may run more than once)


def _interrupted() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl+C while exiting: no traceback
    _say("\ninterrupted")
    return EXIT_INTERRUPTED


def quiet_uncaught_interrupts() -> None:
    """Make a KeyboardInterrupt that nothing caught end the process as `run_command` ends it
    ("interrupted", exit 130) instead of with a traceback; other exceptions go to the hook that
    was there. Only an uncaught one reaches the hook, so code that catches KeyboardInterrupt
    itself (run_command, the chat UI, a test runner importing localspec) is unaffected."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb) -> None:
        if not issubclass(exc_type, KeyboardInterrupt):
            previous(exc_type, exc, tb)
            return
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl+C while exiting
        _say("\ninterrupted")
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass   # stdout is gone: there is nothing left to flush into
        os._exit(EXIT_INTERRUPTED)   # as the signal itself would end it: no exit handlers run

    sys.excepthook = hook


def _render(title: str, cause: str, fix: str) -> str:
    return f"Error: {title}\n  cause: {cause}\n  fix:   {fix}"


def _fail(message: str) -> int:
    _say(message)
    return EXIT_ERROR


def _say(message: str) -> None:
    """Print `message` to stderr, its control characters shown, not sent: a message quotes
    arguments, file and model names, which may hold any (app/terminal.py)."""
    try:
        print(printable(message), file=sys.stderr, flush=True)
    except OSError:
        pass   # stderr is gone too: the exit status is all that is left to say it


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _prepare_std_streams() -> None:
    """Open /dev/null on a standard descriptor that was closed at start (`>&-`), and give Python a
    stream for it: output goes nowhere instead of into whatever file would get that descriptor.
    Text the terminal's encoding cannot show (a Latin-1 locale) is replaced, not an error."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDONLY if mode == "r" else os.O_WRONLY)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
            setattr(sys, name, open(fd, mode, encoding="utf-8", errors="replace", closefd=False))
    sys.stdout.reconfigure(errors="replace")


def _redeliver_interrupts(previous: Callable) -> Callable:
    """An unraisable-exception hook that has a dropped KeyboardInterrupt raised again in the main
    thread shortly after (by then the C call that called back into Python has returned, or it is
    dropped and delivered again); any other unraisable exception goes to `previous`. The hook
    only writes a byte to a pipe, so that a second Ctrl+C cannot land inside it."""
    import _thread

    wake_r, wake_w = os.pipe()

    def redeliver() -> None:
        while os.read(wake_r, 1):
            time.sleep(_REDELIVER_S)
            _thread.interrupt_main()

    threading.Thread(target=redeliver, name="redeliver-interrupts", daemon=True).start()

    def hook(unraisable) -> None:
        if unraisable.exc_type is KeyboardInterrupt:
            os.write(wake_w, b"!")
            return
        previous(unraisable)

    return hook
