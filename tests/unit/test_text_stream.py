"""Streaming text: UTF-8 split across tokens, stop strings split across tokens, held-back tails."""
from localspec.engine.text import TextStream

PIECES = {1: b"Hel", 2: b"lo ", 3: "wö".encode()[:2], 4: "wö".encode()[2:] + b"rld", 5: b"\n##", 6: b"# end"}


def feed_all(stream: TextStream, tokens) -> str:
    return "".join(stream.feed(t) for t in tokens) + stream.flush()


def test_utf8_split_across_tokens_is_reassembled():
    assert feed_all(TextStream(PIECES.__getitem__), [1, 2, 3, 4]) == "Hello wörld"


def test_stop_string_split_across_tokens_cuts_before_it():
    s = TextStream(PIECES.__getitem__, stop=["###"])
    out = feed_all(s, [1, 2, 3, 4, 5, 6])
    assert out == "Hello wörld\n" and s.stopped


def test_text_that_could_start_a_stop_string_is_held_back_then_released():
    s = TextStream(PIECES.__getitem__, stop=["###"])
    first = s.feed(5)            # "\n##" might become "###": hold the "##"
    assert first == "\n"
    assert s.feed(1) == "##Hel"[:len("##Hel") - 2] and not s.stopped
    assert s.flush() == "el"
