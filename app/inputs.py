"""Text that comes in from outside: stdin, files the user names, and command-line arguments.

Every read here is bounded and every decode follows one policy, so that no input can exhaust the
machine (`yes | localspec ask …`, `< /dev/zero`) or crash a command with a UnicodeError:

* **Bounded.** A read stops one byte past its limit; more than the limit is refused at once with
  the fix, before anything is tokenised. A prompt's limit follows from the context: text averages
  well under BYTES_PER_TOKEN bytes per token (a generous bound, for whitespace-heavy code), so
  more bytes than n_ctx * BYTES_PER_TOKEN cannot fit; the engine still checks the exact token
  count after tokenising. A file's limit is stated where it is read, with its reason.
* **One UTF-8 policy: invalid bytes become U+FFFD.** A stray Latin-1 byte in a pasted log or a
  file should not block a question, a byte typed into the chat screen cannot be refused, and the
  model reads one replacement character where the bytes were. The same rule holds for stdin,
  files, arguments (which Python hands over with surrogate escapes) and the chat screen.
* A file holding NUL bytes (anywhere in it) is binary, not text, and is refused.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import BinaryIO, TextIO

from localspec.engine.errors import LocalspecError
from localspec.models.own_files import Unreadable, open_regular, read_bounded

BYTES_PER_TOKEN = 8     # a text longer than n_ctx * this many bytes cannot fit in n_ctx tokens


def decode(data: bytes) -> str:
    """Bytes from outside as text: invalid UTF-8 becomes U+FFFD (the policy above)."""
    return data.decode("utf-8", errors="replace")


def argument(value: str) -> str:
    """A command-line argument as text. Python decodes argv with surrogate escapes, which no
    tokenizer (nor SQLite, nor JSON) can encode: the escaped bytes become U+FFFD instead."""
    return decode(os.fsencode(value))


# A context left to fit the machine (n_ctx 0) is known only once the model is open; until then
# input is bounded by the longest trained context of the models `pull` knows.
UNFITTED_CTX = 131_072


def prompt_limit(n_ctx: int) -> int:
    """The most bytes of prompt text that could fit in a context of n_ctx tokens (0: fitted)."""
    return max(n_ctx or UNFITTED_CTX, 1) * BYTES_PER_TOKEN


def read_stdin_text(stdin: BinaryIO, n_ctx: int) -> str:
    """Piped stdin as a prompt: at most what a context of n_ctx tokens could hold."""
    data = read_bounded(stdin, prompt_limit(n_ctx))
    if data is None:
        raise _too_long(f"stdin holds more than {_size(prompt_limit(n_ctx))} (reading stopped there)",
                        n_ctx)
    return decode(data)


def text_stdin(stdin: BinaryIO) -> TextIO:
    """Stdin read as text line by line (a line-mode chat), decoded by the policy above."""
    return io.TextIOWrapper(stdin, encoding="utf-8", errors="replace")


def read_line(stdin: TextIO, n_ctx: int) -> str | None:
    """One line of a line-mode chat, None at the end of input; a line longer than a context of
    n_ctx tokens could hold is refused (its rest may never end: `< /dev/zero`)."""
    limit = prompt_limit(n_ctx)
    line = stdin.readline(limit + 1)
    if not line:
        return None
    if len(line) > limit:
        raise _too_long(f"a line of input is longer than {_size(limit)} (reading stopped there)", n_ctx)
    return line


def check_prompt(text: str, n_ctx: int, what: str) -> str:
    """`text` (a prompt argument) if it could fit in n_ctx tokens; LocalspecError otherwise."""
    size = len(text.encode("utf-8", errors="replace"))
    limit = prompt_limit(n_ctx)
    if size > limit:
        raise _too_long(f"{what} is {_size(size)}", n_ctx)
    return text


def read_text_file(path: Path, limit: int, title: str, fix: str) -> str:
    """A text file the user named: refused (LocalspecError with `title`) if it is not a readable
    regular file (opened once, without blocking: models/own_files.py), holds more than `limit`
    bytes (`fix` says what to do then; nothing past the limit is read) or looks binary; invalid
    UTF-8 becomes U+FFFD."""
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise LocalspecError(title, f"'{path}' is {_size(size)}; the limit is {_size(limit)}", fix)
            data = read_bounded(fh, limit)
        if data is None:   # it grew while being read
            raise LocalspecError(title, f"'{path}' is over the limit of {_size(limit)}", fix)
    except FileNotFoundError:
        raise LocalspecError(title, f"'{path}' does not exist", "Pass the path of a text file") from None
    except Unreadable as err:
        raise LocalspecError(title, str(err), "Pass the path of a text file") from None
    except OSError as err:
        raise LocalspecError(title, f"'{path}': {err.strerror or err}",
                             "Check that the file exists and that you may read it") from None
    if b"\0" in data:     # anywhere: a NUL past the first pages is as binary as one in them
        raise LocalspecError(title, f"'{path}' looks binary (it holds NUL bytes)",
                             "Pass a text file (code, notes, ...)")
    return decode(data)


def _too_long(cause: str, n_ctx: int) -> LocalspecError:
    return LocalspecError("Prompt is longer than the context",
                          f"{cause}: more than {n_ctx} tokens can hold",
                          f"Pass the part that matters (head -c, an excerpt), or raise --ctx (a context "
                          f"of {n_ctx} tokens holds at most about {_size(prompt_limit(n_ctx))} of text)")


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"
