"""What localspec prints from a model, or from names and paths a user gave, made safe for the
terminal: `printable(text)`.

A terminal obeys the control characters it is sent. ESC starts sequences that write the
clipboard (OSC 52), retitle the window, move the cursor or hide text; BEL rings, BS and CR rewrite
what a line shows. A model's output (sampling can emit any token) and a file or model name are
text, never commands, so each control character in them is shown instead of sent. Newline and
tab are kept: text needs them, and they only move the cursor forward.

Shown as the Unicode control pictures (ESC as ␛, NUL as ␀, CR as ␍, DEL as ␡), not as backslash
escapes: a coding model writes the four characters `\\x1b` in code all the time, and an escape
could not be told from them; a picture takes one column, as the text around it was laid out. The
C1 controls (U+0080-U+009F) have no pictures, and some terminals obey them as ESC and a letter
(U+009B is CSI, ESC [): each is shown as that 7-bit form (ECMA-48's), so U+009B shows as ␛[.

Character by character and without state, so a stream is made safe piece by piece wherever it
is cut; `str.translate` over one table built at import does it in C. `--json` output needs none
of this: JSON escapes every control character itself.
"""
from __future__ import annotations

_KEPT = {ord("\n"), ord("\t")}
_PICTURES = 0x2400        # U+2400 SYMBOL FOR NULL: the C0 control pictures follow in code order
_DEL_PICTURE = "\u2421"   # SYMBOL FOR DELETE
_ESC_PICTURE = chr(_PICTURES + 0x1B)

_TABLE: dict[int, str] = {
    **{c: chr(_PICTURES + c) for c in range(0x20) if c not in _KEPT},   # C0
    0x7F: _DEL_PICTURE,
    **{c: _ESC_PICTURE + chr(c - 0x40) for c in range(0x80, 0xA0)},     # C1: ESC and its letter
}


def printable(text: str) -> str:
    """`text` with every control character but newline and tab shown as a picture (above)."""
    return text.translate(_TABLE)


def show(line: str, **print_args) -> None:
    """print() a line that quotes names, paths or a file's own strings, made `printable`."""
    print(printable(line), **print_args)
