"""The terminal sanitizer (app/terminal.py): no control character but newline and tab survives,
each is shown as one visible form, and a stream cut anywhere comes out as the whole text does."""
from __future__ import annotations

import random
import unicodedata

from localspec.app.terminal import printable

CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]


def test_no_control_character_but_newline_and_tab_survives():
    shown = printable("".join(CONTROLS))
    assert [c for c in shown if unicodedata.category(c) == "Cc"] == ["\t", "\n"]


def test_each_control_has_its_picture_and_c1_its_7_bit_form():
    assert printable("\x1b]52;c;ZXZpbA==\x07") == "␛]52;c;ZXZpbA==␇"     # an OSC 52 clipboard write
    assert printable("a\x00b\rc\x08\x7f") == "a␀b␍c␈␡"
    assert printable("\x9b2J") == "␛[2J"                                 # C1 CSI: ESC [
    assert printable("\x90") == "␛P"


def test_text_without_controls_is_unchanged():
    text = "def f(x):\n\treturn '\\x1b[31m' + x  # café ␛ 数 🙂"
    assert printable(text) == text


def test_pieces_come_out_as_the_whole_does():
    """Piece by piece (a stream), wherever the text is cut: the mapping is per character."""
    rng = random.Random(7)
    text = "".join(rng.choice(CONTROLS + list("ab\n\té数")) for _ in range(2000))
    cuts = sorted(rng.sample(range(1, len(text)), 150))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
    assert "".join(printable(p) for p in pieces) == printable(text)
