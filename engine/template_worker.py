"""The chat-template worker: renders Jinja chat templates, one JSON request a line, in its own process.

Run by file path (not as part of the package, whose import loads llama.cpp) by engine/chat.py.
It imports jinja2 only, then caps its own address space, so a template that allocates without end
gets a MemoryError here instead of growing the engine; the parent kills it at its deadline.
Each request is {"template", "messages", "bos_token", "eos_token"}; each answer is {"text"} or
{"error", "kind"}. It exits when its stdin closes (the parent is gone).
"""
from __future__ import annotations

import json
import resource
import sys

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

MEMORY_HEADROOM = 256 << 20     # bytes of address space above what the worker uses when ready
MAX_OUTPUT = 4 << 20            # characters, unless the request says (chat.MAX_PROMPT_CHARS)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _cap_memory() -> None:
    try:
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * resource.getpagesize()
    except OSError:     # not Linux: the parent's deadline still bounds the render
        return
    resource.setrlimit(resource.RLIMIT_AS, (used + MEMORY_HEADROOM, used + MEMORY_HEADROOM))


_ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_ENV.globals["raise_exception"] = _raise_exception
_COMPILED: dict = {}       # template source -> compiled template: a model's one template, reused


def render(request: dict) -> dict:
    try:
        pieces, size, limit = [], 0, request.get("max_output", MAX_OUTPUT)
        template = _COMPILED.get(request["template"])
        if template is None:
            _COMPILED.clear()
            template = _COMPILED[request["template"]] = _ENV.from_string(request["template"])
        stream = template.generate(
            messages=request["messages"], add_generation_prompt=True,
            bos_token=request["bos_token"], eos_token=request["eos_token"])
        for piece in stream:
            size += len(piece)
            if size > limit:
                return {"kind": "output", "error": f"it renders more than {limit:,} characters"}
            pieces.append(piece)
        return {"text": "".join(pieces)}
    except TemplateError as err:
        return {"kind": "template", "error": f"{type(err).__name__}: {err}"}
    except MemoryError:
        return {"kind": "memory", "error": f"it needs more than {MEMORY_HEADROOM >> 20} MiB"}
    except RecursionError:
        return {"kind": "template", "error": "it recurses without end (RecursionError)"}
    except (OverflowError, ValueError, TypeError, ArithmeticError, LookupError) as err:
        return {"kind": "template", "error": f"{type(err).__name__}: {err}"}


def main() -> None:
    _cap_memory()
    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            answer = render(json.loads(line))
        except MemoryError:       # the request itself did not fit
            answer = {"kind": "memory", "error": "the request does not fit the worker's memory"}
        out.write(json.dumps(answer, ensure_ascii=False) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
