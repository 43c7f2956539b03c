"""The chat screen's reply in flight: asking the engine, taking its events, streaming the reply
into the history and onto the screen.

* **The history is written first, the screen follows.** A reply row exists (``streaming``) before
  its first token, each piece of its text is checkpointed before it is shown, and it is committed
  ``complete`` / ``stopped`` / ``error`` before its header says so. A kill -9 at any moment loses
  nothing already shown.
* **Esc stops at once.** The reply is finished as ``stopped`` with the text shown so far the moment
  the key is pressed; the engine is told to stop, and its remaining events for that request are
  dropped (each generation resets the target, so the engine's state stays consistent).
* **The engine is an event source.** The app drains `EngineProcess.poll()` on a timer and hands
  each event to `on_engine_event`; nothing here blocks. An engine crash finishes the reply in
  flight as ``error`` (its text kept) and offers a restart; the conversation is untouched.
"""
from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from textual.containers import VerticalScroll

from localspec.app.engine_proc import Calibrating, Crashed, Done, Error, Ready, Token
from localspec.app.progress import measuring_text

from .format import lead_source
from .history_failure import reported
from .notify import notify
from .widgets import MessageView, PromptInput

if TYPE_CHECKING:
    from .chat import ChatScreen

CUT_NOTES = {"length": "cut at max tokens (Ctrl+O)", "context": "the context is full"}


@dataclass
class Reply:
    """The reply being generated."""

    request_id: str
    conversation_id: str
    message_id: int
    view: MessageView | None          # None once the user switched to another conversation
    text: str = ""
    segments: list[tuple[str, str]] = field(default_factory=list)


class ReplyStream:
    """ChatScreen's reply in flight (mixed into app/tui/chat.ChatScreen, which holds the `reply`,
    the `dropped` requests and the engine's state for the status bar)."""

    async def generate(self: ChatScreen) -> None:
        """Reply to the conversation as stored."""
        conv = self.conversation
        chat = [m.as_chat() for m in self.history.messages(conv.id) if m.content]
        row = self.history.begin_reply(conv.id)
        view = MessageView("assistant", "", "streaming")
        messages = self.query_one("#messages", VerticalScroll)
        await messages.mount(view)
        messages.scroll_end(animate=False)
        self.reply = Reply(f"r-{uuid.uuid4().hex[:12]}", conv.id, row.id, view)
        s = self.app.run_settings(self.app.settings)   # with this run's flags (chat --temperature, ...)
        seed = s.seed if s.seed is not None else secrets.randbelow(2**31)
        self.app.engine_call("generate", self.reply.request_id, chat, temperature=s.temperature,
                             top_p=s.top_p, top_k=s.top_k, seed=seed, max_tokens=s.max_tokens,
                             system=s.system_prompt or None, conversation=conv.id)

    def cancel_reply(self: ChatScreen) -> Reply | None:
        """Stop the reply in flight, if any: the engine is told to stop and its late events for
        it are dropped. The reply stays `self.reply` (a history that fails while it is finished
        still finds it in flight); the caller finishes it or lets it go."""
        reply = self.reply
        if reply is not None:
            self.app.engine_call("stop", reply.request_id)
            self.dropped.add(reply.request_id)
        return reply

    @reported
    async def action_stop(self: ChatScreen) -> None:
        if self.cancel_reply() is not None:
            await self.finish("stopped")
        elif self.editing_seq is not None:
            self.editing_seq = None
            self.query_one("#prompt", PromptInput).clear()
            self.show_notice("")

    # ---- engine events ------------------------------------------------------------------------
    @reported
    async def on_engine_event(self: ChatScreen, event) -> None:
        if isinstance(event, Calibrating):   # a first run measures this machine before Ready
            self.engine_state = measuring_text(event.what, event.step, event.total)
            self.refresh_status()
        elif isinstance(event, Ready):
            self.ready, self.engine_state, self.last_stats = event, "", None   # a new engine
            self.show_notice(f"The draft head sits out on this machine: {event.head_left_out}."
                             if event.head_left_out else "")
            self.refresh_status()
        elif isinstance(event, Crashed):
            self.ready, self.engine_state = None, "engine stopped"
            self.refresh_status()
            if self.reply is not None:
                await self.finish("error", note="engine crashed")
            self.show_notice(f"The engine stopped: {event.reason}. Your conversation is saved. "
                             f"Press F5 to restart it.\n{_last_lines(event.detail)}")
        elif self.reply is None or event.request_id != self.reply.request_id:
            stale = event.request_id in self.dropped
            if isinstance(event, (Done, Error)):
                self.dropped.discard(event.request_id)
            if isinstance(event, Error) and not stale:
                # a learn/forget of the personal drafter failed
                notify(self.app, f"{event.cause}. {event.fix}", title=event.title,
                                severity="warning", timeout=10)
        elif isinstance(event, Token):
            await self.on_token(event)
        elif isinstance(event, Done):
            dropped = (event.stats or {}).get("dropped_messages", 0)
            if dropped > (self.last_stats or {}).get("dropped_messages", 0):
                notify(self.app, f"The model now reads this conversation without its {dropped} "
                                "oldest messages (they are kept here and in the history)",
                                title="The conversation outgrew the context", timeout=10)
            self.last_stats = event.stats
            await self.finish("stopped" if event.finish_reason == "stopped" else "complete",
                              event.text, event.stats, CUT_NOTES.get(event.finish_reason, ""))
        elif isinstance(event, Error):
            await self.finish("error", note=event.title)
            self.show_notice(f"{event.title}: {event.cause}. {event.fix}")

    async def on_token(self: ChatScreen, event: Token) -> None:
        reply = self.reply
        if not event.text:
            return
        # one segment per token where the engine could split the text, else the round as one
        segments = ([(p, s) for p, s in zip(event.pieces, event.sources) if p]
                    if event.pieces else [(event.text, lead_source(event.sources))])
        reply.text += event.text
        reply.segments.extend(segments)
        self.history.checkpoint(reply.message_id, reply.text, reply.segments)   # saved, then shown
        if reply.view is not None:
            await reply.view.append(event.text, segments)
            if reply.view.is_attached:
                self._follow()

    def _follow(self: ChatScreen) -> None:
        """Keep the reply's end in view: after the next refresh, when the layout holds what was
        just added (scrolled at once, a chunk of several lines left its end below the fold)."""
        messages = self.query_one("#messages", VerticalScroll)
        self.call_after_refresh(messages.scroll_end, animate=False)

    async def finish(self: ChatScreen, state: str, text: str | None = None,
                     stats: dict | None = None, note: str = "") -> None:
        """Commit the reply, then mark it finished on screen; a complete exchange is learnt."""
        reply = self.reply
        content = text if text is not None and state == "complete" else reply.text
        segments = reply.segments if content == reply.text else None
        self.history.finish_reply(reply.message_id, content, state, stats, segments)
        self.reply = None      # not before: a reply that could not be committed is still in flight
        if self.conversation is None or self.conversation.id != reply.conversation_id:
            self.history.release(reply.conversation_id)    # no longer open here
        if reply.view is not None:
            await reply.view.finish(state, content, stats, note)
            if reply.view.is_attached:
                self._follow()
        if state == "complete":
            chat = [m.as_chat() for m in self.history.messages(reply.conversation_id) if m.content]
            self.app.engine_call("learn", reply.conversation_id, chat)
        if stats:
            self.refresh_status()

    @reported
    def save_reply_in_flight(self: ChatScreen) -> None:
        """Leaving (quit, or the model failed): the reply in flight is kept, marked stopped."""
        reply = self.cancel_reply()
        if reply is not None:
            self.history.finish_reply(reply.message_id, reply.text, "stopped", None, reply.segments)
            self.reply = None


def _last_lines(detail: str, n: int = 3) -> str:
    return "\n".join(detail.strip().splitlines()[-n:])
