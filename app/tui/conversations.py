"""The chat screen's conversations: the sidebar, opening, searching, renaming and deleting them,
and which window may write the one that is open.

* **Opening reads first.** A conversation's rows are read and its lease claimed before anything on
  screen changes, so a history that fails leaves the screen as it was. A reply in flight keeps
  going into its own conversation's history when the user switches away.
* **One window writes a conversation.** Opening a conversation claims its lease
  (app/leases.py); one that another window holds is shown read-only with a notice naming it, and
  nothing here writes to it: sending, retry, edit, rename and delete are refused with the text
  kept. Enter tries again: once the other window has let go, the conversation is reloaded with
  what it added, and if anything was added the message waits for a second Enter, so that nothing
  is sent after text the user has not seen. A lease is released when the window moves to another
  conversation, unless a reply of its is still streaming there (then when that reply ends).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from textual.containers import VerticalScroll
from textual.widgets import Input, Label, ListItem, ListView

from localspec.app.history import Message
from localspec.app.terminal import printable

from .dialogs import ConfirmScreen, TextPromptScreen
from .history_failure import reported
from .notify import notify
from .widgets import MessageView

if TYPE_CHECKING:
    from .chat import ChatScreen


class ConversationList:
    """ChatScreen's conversation handling (mixed into app/tui/chat.ChatScreen, which holds the
    open `conversation`, whether it is `read_only` and the `shown_rows`)."""

    async def reload_conversations(self: ChatScreen) -> None:
        """The sidebar: every conversation, or those matching the search box."""
        view = self.query_one("#conversations", ListView)
        await view.clear()
        await view.extend(ListItem(Label(printable(c.title)), name=c.id)   # the user's own text
                          for c in self.history.search(self.query_one("#search", Input).value))
        self._highlight_current()

    def _highlight_current(self: ChatScreen) -> None:
        view = self.query_one("#conversations", ListView)
        current = self.conversation.id if self.conversation else None
        view.index = next((i for i, item in enumerate(view.children) if item.name == current),
                          None)

    async def open_conversation(self: ChatScreen, conversation_id: str | None) -> None:
        """Show a conversation (None: a new, not yet saved one). A reply in flight keeps going
        into its own conversation's history."""
        # read first: a history that fails leaves the screen as it was
        conversation = self.history.conversation(conversation_id) if conversation_id else None
        rows = self.history.messages(conversation.id) if conversation else []
        writable = conversation is None or self.history.claim(conversation.id)
        if self.reply is not None:
            self.reply.view = None
        if self.conversation is not None and self.conversation.id != conversation_id:
            self._let_go(self.conversation.id)
        self.editing_seq = None
        was_read_only, self.conversation, self.read_only = self.read_only, conversation, not writable
        self.shown_rows = [_shown(m) for m in rows]
        if self.read_only or was_read_only:     # other notices (a crashed engine) stay
            self.show_notice("")
        messages = self.query_one("#messages", VerticalScroll)
        await messages.remove_children()
        self._highlight_current()
        if self.conversation is None:
            await self.show_welcome()
            return
        views = [MessageView(m.role, m.content, m.state, m.segments, m.stats) for m in rows]
        if self.reply is not None and self.reply.conversation_id == self.conversation.id:
            views[-1] = self.reply.view = MessageView("assistant", self.reply.text, "streaming",
                                                      self.reply.segments)
        await messages.mount_all(views)
        messages.scroll_end(animate=False)

    @reported
    async def on_list_view_selected(self: ChatScreen, event: ListView.Selected) -> None:
        if event.list_view.id == "conversations" and event.item.name:
            await self.open_conversation(event.item.name)
            self.query_one("#prompt").focus()

    @reported
    async def on_input_changed(self: ChatScreen, event: Input.Changed) -> None:
        if event.input.id == "search":
            await self.reload_conversations()

    def on_input_submitted(self: ChatScreen, event: Input.Submitted) -> None:
        if event.input.id == "search":
            self.query_one("#conversations", ListView).focus()

    def action_search(self: ChatScreen) -> None:
        self.query_one("#search", Input).focus()

    @reported
    async def action_new_chat(self: ChatScreen) -> None:
        await self.open_conversation(None)
        self.query_one("#prompt").focus()

    def action_rename(self: ChatScreen) -> None:
        if self.conversation is None or self.refused():
            return
        conv = self.conversation

        async def done(title: str | None) -> None:
            if title is not None and title.strip():
                await self.rename(conv.id, title)

        self.app.push_screen(TextPromptScreen("Rename the conversation:", conv.title), done)

    @reported
    async def rename(self: ChatScreen, conversation_id: str, title: str) -> None:
        self.history.rename(conversation_id, title)
        self.conversation = self.history.conversation(conversation_id)
        await self.reload_conversations()

    def action_delete(self: ChatScreen) -> None:
        if self.conversation is None or self.refused():
            return
        conv = self.conversation

        async def done(yes: bool | None) -> None:
            if yes:
                await self.delete_conversation(conv.id)

        self.app.push_screen(ConfirmScreen(f"Delete '{conv.title}' and forget it everywhere, "
                                           "also in the personal drafter?"), done)

    @reported
    async def delete_conversation(self: ChatScreen, conversation_id: str) -> None:
        if self.reply is not None and self.reply.conversation_id == conversation_id:
            self.cancel_reply()
            self.reply = None     # its rows go with the conversation
        self.history.delete(conversation_id)
        self.app.engine_call("forget", conversation_id)
        await self.reload_conversations()
        convs = self.history.conversations()
        await self.open_conversation(convs[0].id if convs else None)
        notify(self.app, "Conversation deleted and forgotten by the personal drafter.")

    # ---- one window per conversation ----------------------------------------------------------
    def _let_go(self: ChatScreen, conversation_id: str) -> None:
        """Leaving a conversation: its lease goes, unless a reply is still streaming into it."""
        if self.reply is None or self.reply.conversation_id != conversation_id:
            self.history.release(conversation_id)

    def held_notice(self: ChatScreen) -> str:
        pid = self.history.holder(self.conversation.id)
        who = f"another localspec window (process {pid})" if pid else "another localspec window"
        return (f"This conversation is open in {who}: read-only here. Ctrl+N starts a new one; "
                "Enter tries again once that window has moved on or closed.")

    def refused(self: ChatScreen) -> bool:
        """Whether the open conversation is read-only here (said in the notice)."""
        if self.read_only:
            self.show_notice(self.held_notice())
        return self.read_only

    async def try_to_write(self: ChatScreen) -> bool:
        """A read-only conversation: reopen it; True if it is writable now and shows nothing the
        user has not seen (else the notice says why the message waits)."""
        before = self.shown_rows
        await self.open_conversation(self.conversation.id)
        if self.read_only:
            return False
        if self.shown_rows != before:
            self.show_notice("The other window has let go of this conversation; it is shown with "
                             "what was added there. Press Enter to send your message.")
            return False
        return True


def _shown(m: Message) -> tuple:
    """What a message looks like on screen, to tell whether another window changed it."""
    return (m.id, m.state, m.content)
