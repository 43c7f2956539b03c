"""`localspec chat` in line mode: a multi-turn conversation on stdin/stdout.

The Textual chat screen (issue 5) will replace this; until then this is the whole chat: history is
kept for the session only (its tokens feed the personal n-gram drafter after each reply; see
`localspec ngram`), replies stream as they are verified, Ctrl-C stops a reply and keeps the part
already shown.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Iterator, TextIO

from localspec.engine.config import SamplingParams
from localspec.engine.errors import LocalspecError
from localspec.engine.generation import Event, finish
from localspec.engine.session import Session
from localspec.engine.stats import DecodeStats

from .inputs import read_line
from .terminal import printable

HELP = "Type a message and press Enter. /reset starts over, /stats shows the last reply's statistics, /quit leaves."


def chat_loop(session: Session, sampling: SamplingParams, max_tokens: int,
              stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> None:
    """Chat on `stdin` (text, decoded by app/inputs.py's policy) until it ends or /quit. Each turn
    prefills only what the cache does not hold yet; a conversation that outgrows the context goes
    on without its oldest messages; a line longer than the context could hold in bytes ends the
    chat with a LocalspecError (read_line), one too long in tokens is refused and the chat goes on."""
    history: list[dict] = []
    left_out: tuple = ()          # the oldest messages the model no longer reads (engine/conversation.py)
    conversation = f"chat-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    last_stats = None
    print(HELP, file=stdout)
    while True:
        stdout.write("\n> ")
        stdout.flush()
        line = read_line(stdin, session.cfg.n_ctx)
        if line is None or line.strip() == "/quit":
            return
        text = line.strip()
        if not text:
            continue
        if text == "/reset":
            history.clear()
            left_out = ()
            print("(conversation cleared)", file=stdout)
            continue
        if text == "/stats":
            print(last_stats.summary() if last_stats else "(no reply yet)", file=stdout)
            continue
        history.append({"role": "user", "content": text})
        try:
            fitted = session.fit_chat(history, max_tokens, left_out)
        except LocalspecError as err:    # this message alone outgrows the context: not sent
            history.pop()
            print(f"{err.title}: {err.cause}. {err.fix}", file=stdout)
            continue
        if fitted.dropped > len(left_out):
            print(f"(the conversation outgrew the context: the model now reads it without its "
                  f"{fitted.dropped} oldest messages)", file=stdout)
        left_out = fitted.left_out
        # reuse: the cache holds the last turn, which this prompt starts with
        stream = session.generate(fitted.tokens, max_tokens=max_tokens, sampling=sampling, reuse=True)
        reply, stats = stream_reply(stream, stdout)
        if stats is not None:
            last_stats = stats
        history.append({"role": "assistant", "content": reply})
        session.learn(conversation, session.chat_prompt(history))   # the personal drafter learns
        stdout.write("\n")


def stream_reply(stream: Iterator[Event], stdout: TextIO) -> tuple[str, DecodeStats | None]:
    """Write a reply to `stdout` as it streams; (the reply, its statistics). Ctrl-C stops it
    there and keeps the part already shown, marked " [stopped]", without statistics."""
    pieces: list[str] = []

    def show(piece: str) -> None:
        pieces.append(piece)
        stdout.write(printable(piece))   # the model's text, never commands to the terminal
        stdout.flush()

    try:
        stats = finish(stream, show).stats
    except KeyboardInterrupt:
        stream.close()
        pieces.append(" [stopped]")
        stdout.write(" [stopped]")
        stats = None
    return "".join(pieces), stats
