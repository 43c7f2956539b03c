"""What the chat screen does with the prompt: Enter sends (after `/file` attachments are expanded
and the message is checked against the context), `/copy N` and Ctrl+Y copy code, Ctrl+R
regenerates the last reply and Ctrl+E edits the last message.

A message is committed to the history before it goes to the engine, and the prompt is cleared only
once it is saved; a message that cannot go (too long for the context, an unreadable attachment, a
reply still in flight, a conversation another window holds) stays in the prompt, unsent.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from textual.containers import VerticalScroll

from localspec.app.history import DEFAULT_TITLE, Message
from localspec.app.inputs import check_prompt
from localspec.engine.errors import LocalspecError

from .attach import code_blocks, expand_attachments
from .history_failure import reported
from .notify import notify
from .widgets import MessageView, PromptInput

if TYPE_CHECKING:
    from .chat import ChatScreen


class PromptActions:
    """ChatScreen's prompt handling (mixed into app/tui/chat.ChatScreen, which holds the open
    `conversation` and the message being edited, `editing_seq`)."""

    @reported
    async def on_prompt_input_submitted(self: ChatScreen, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if text.startswith("/copy"):
            self.copy_code(text.removeprefix("/copy").strip())
            self.query_one("#prompt", PromptInput).clear()
            return
        if self.reply is not None:
            notify(self.app, "A reply is still being written: Esc stops it.", severity="warning")
            return
        if self.read_only and not await self.try_to_write():
            return
        # a paste or attachments longer than the context could hold stay unsent: the context the
        # engine opened (a fitted one is known once it is ready), else the one asked for
        n_ctx = (self.ready.n_ctx if self.ready is not None else 0) or self.app.base_spec.n_ctx
        try:
            content = check_prompt(expand_attachments(text), n_ctx, "the message")
        except LocalspecError as err:
            self.show_notice(f"{err.title}: {err.cause}. {err.fix}")
            return
        self.show_notice("")
        await self.send(content)

    async def send(self: ChatScreen, content: str) -> None:
        if self.conversation is None:
            self.conversation = self.history.new_conversation(_title_from(content))
            await self.query_one("#messages", VerticalScroll).remove_children()
            await self.reload_conversations()
        elif self.editing_seq is not None:
            self.history.truncate(self.conversation.id, self.editing_seq)
            await self.open_conversation(self.conversation.id)
        self.editing_seq = None
        if self.conversation.title == DEFAULT_TITLE:
            self.history.rename(self.conversation.id, _title_from(content))
            await self.reload_conversations()
        self.history.add_message(self.conversation.id, "user", content)   # committed first
        self.query_one("#prompt", PromptInput).clear()    # only once it is saved
        await self.query_one("#messages", VerticalScroll).mount(MessageView("user", content))
        await self.generate()

    @reported
    async def action_retry(self: ChatScreen) -> None:
        last = self._last_message()
        if self.reply is not None or last is None or self.refused():
            return
        if last.role == "assistant":
            self.history.truncate(last.conversation_id, last.seq)
        await self.open_conversation(last.conversation_id)
        await self.generate()

    @reported
    def action_edit_last(self: ChatScreen) -> None:
        if self.reply is not None or self.conversation is None or self.refused():
            return
        users = [m for m in self.history.messages(self.conversation.id) if m.role == "user"]
        if not users:
            return
        self.editing_seq = users[-1].seq
        prompt = self.query_one("#prompt", PromptInput)
        prompt.text = users[-1].content
        prompt.focus()
        self.show_notice("Editing your last message: Enter resends it (and drops what followed), "
                         "Esc cancels.")

    @reported
    def action_copy_code(self: ChatScreen) -> None:
        self.copy_code("")

    def copy_code(self: ChatScreen, which: str) -> None:
        """Copy the last reply's code block number `which` (1-based; default the last one)."""
        last = next((m for m in reversed(self.history.messages(self.conversation.id))
                     if m.role == "assistant"), None) if self.conversation else None
        blocks = code_blocks(last.content) if last else []
        if not blocks:
            notify(self.app, "The last reply has no code block.", severity="warning")
            return
        try:
            n = int(which) if which else len(blocks)
            code = blocks[n - 1]
            if n < 1:
                raise IndexError
        except (ValueError, IndexError):
            notify(self.app, f"Use /copy N with N from 1 to {len(blocks)}.", severity="warning")
            return
        self.app.copy_to_clipboard(code)
        notify(self.app, f"Copied code block {n} of {len(blocks)} ({len(code.splitlines())} lines).")

    def _last_message(self: ChatScreen) -> Message | None:
        if self.conversation is None:
            return None
        rows = self.history.messages(self.conversation.id)
        return rows[-1] if rows else None


def _title_from(content: str) -> str:
    first = content.strip().splitlines()[0] if content.strip() else DEFAULT_TITLE
    return first[:40] + ("…" if len(first) > 40 else "")
