"""Streaming detokenisation with stop strings.

Tokens arrive as byte pieces that may split a UTF-8 character, and a stop string may arrive split
across tokens. `TextStream` decodes incrementally and holds back only the tail that could still
become a stop string, so what it releases is final.
"""
from __future__ import annotations

import codecs
from typing import Callable, Sequence


class TextStream:
    def __init__(self, piece: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""
        self.stopped = False

    def feed(self, token: int) -> str:
        """Add one token; returns text that is now final ('' while held back or after a stop)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(self._piece(token))
        for s in self._stop:
            at = self._pending.find(s)
            if at >= 0:
                self.stopped = True
                out, self._pending = self._pending[:at], ""
                return out
        if self._hold == 0 or len(self._pending) <= self._hold:
            if self._hold == 0:
                out, self._pending = self._pending, ""
                return out
            return ""
        cut = len(self._pending) - self._hold
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

    def flush(self) -> str:
        if self.stopped:
            return ""
        out = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return out
