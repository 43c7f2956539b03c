"""Line-mode chat's reply streaming on a scripted event stream: the text is shown as it arrives
and the reply is what was shown; Ctrl-C ends the stream there and keeps the part shown."""
from __future__ import annotations

import io

from localspec.app.repl import stream_reply
from localspec.engine.generation import Finished, Generation, Round
from localspec.engine.stats import DecodeStats

STATS = DecodeStats(stages=[])


def test_a_reply_is_the_text_shown_with_its_statistics():
    events = [Round("", (1,), ("target",)), Round("Hel", (2,), ("target",)), Round("lo", (3,), ("target",)),
              Finished(Generation("Hello", [1, 2, 3], "stop", STATS, ["target"] * 3))]
    out = io.StringIO()
    assert stream_reply(iter(events), out) == ("Hello", STATS)
    assert out.getvalue() == "Hello"


def test_ctrl_c_in_the_engine_keeps_the_part_shown():
    def interrupted():
        yield Round("Hel", (2,), ("target",))
        raise KeyboardInterrupt                     # Ctrl-C during the next round

    out = io.StringIO()
    assert stream_reply(interrupted(), out) == ("Hel [stopped]", None)
    assert out.getvalue() == "Hel [stopped]"


class InterruptedOutput(io.StringIO):
    """Ctrl-C while "lo" is being written, with the engine's stream suspended between rounds."""

    def write(self, text: str) -> int:
        if text == "lo":
            raise KeyboardInterrupt
        return super().write(text)


def test_ctrl_c_while_showing_closes_the_suspended_stream():
    closed = []

    def events():
        try:
            yield Round("Hel", (2,), ("target",))
            yield Round("lo", (3,), ("target",))
            yield Finished(Generation("Hello", [2, 3], "stop", STATS, ["target"] * 2))
        finally:
            closed.append(True)

    stream, out = events(), InterruptedOutput()
    reply, stats = stream_reply(stream, out)
    assert closed == [True] and stats is None        # closed now, while this test still holds it
    assert out.getvalue() == "Hel [stopped]" and reply.endswith(" [stopped]")
