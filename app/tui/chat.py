"""The chat screen: conversations on the left, the messages, the prompt, the speculation status.

Why it is shaped so:

* **The history is written first, the screen follows.** A user message is committed before it
  is sent to the engine; a reply row exists (``streaming``) before its first token, each piece
  of its text is checkpointed before it is shown, and it is committed ``complete`` / ``stopped``
  / ``error`` before its header says so. A kill -9 at any moment loses nothing already shown.
* **Esc stops at once.** The reply is finished as ``stopped`` with the text shown so far the moment
  the key is pressed; the engine is told to stop, and its remaining events for that request are
  dropped (each generation resets the target, so the engine's state stays consistent).
* **The engine is an event source.** The app drains `EngineProcess.poll()` on a timer and hands
  each event to `on_engine_event`; nothing here blocks. An engine crash finishes the reply in
  flight as ``error`` (its text kept) and offers a restart; the conversation is untouched.
* **One window writes a conversation.** Opening a conversation claims its lease
  (app/leases.py); one that another window holds is shown read-only with a notice naming it, and
  nothing here writes to it: sending, retry, edit, rename and delete are refused with the text
  kept. Enter tries again: once the other window has let go, the conversation is reloaded with
  what it added, and if anything was added the message waits for a second Enter, so that nothing
  is sent after text the user has not seen. A lease is released when the window moves to another
  conversation, unless a reply of its is still streaming there (then when that reply ends).
* **A history that fails mid-chat ends in the screen, not in a traceback.** Every handler that
  touches the history is `@reported`: a LocalspecError from it (a damaged page that the check
  at open missed, a full disk, a data dir made read-only) goes to `history_failed`, the one place
  that handles it. The screen stays open with everything it shows and the unsent text kept (so
  the user can copy what was not saved); a reply in flight stops, since its next piece could no
  longer be saved before it is shown; the notice says what failed and the fix; quitting then exits
  with status 2 and the error printed again. Staying open rather than exiting at once: a full
  disk or a permission can be fixed while the window is open, and the next write tries again.
"""
from __future__ import annotations

import functools
import inspect
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, ListItem, ListView, Static

from localspec.app.engine_proc import Calibrating, Crashed, Done, Error, Ready, Token
from localspec.app.history import DEFAULT_TITLE, Conversation, History, Message
from localspec.app.inputs import check_prompt
from localspec.app.progress import measuring_text
from localspec.engine.errors import LocalspecError

from .attach import code_blocks, expand_attachments
from .dialogs import ConfirmScreen, TextPromptScreen
from .format import engine_line, lead_source, stages_line
from .widgets import MessageView, PromptInput, StatusBar

CUT_NOTES = {"length": "cut at max tokens (Ctrl+O)", "context": "the context is full"}
WELCOME = ("Type a message and press Enter (Shift+Enter, Alt+Enter or Ctrl+J: new line). "
           "/file PATH attaches a file. Esc stops a reply. Ctrl+O: settings.")


def reported(handler: Callable) -> Callable:
    """A ChatScreen handler (async or not) whose LocalspecError goes to `history_failed` instead
    of ending the app with a traceback."""
    if inspect.iscoroutinefunction(handler):
        @functools.wraps(handler)
        async def run_async(self: ChatScreen, *args):
            try:
                return await handler(self, *args)
            except LocalspecError as err:
                self.history_failed(err)
        return run_async

    @functools.wraps(handler)
    def run(self: ChatScreen, *args):
        try:
            return handler(self, *args)
        except LocalspecError as err:
            self.history_failed(err)
    return run


@dataclass
class Reply:
    """The reply being generated."""

    request_id: str
    conversation_id: str
    message_id: int
    view: MessageView | None          # None once the user switched to another conversation
    text: str = ""
    segments: list[tuple[str, str]] = field(default_factory=list)


class ChatScreen(Screen):
    BINDINGS = [
        # priority: these win over the prompt's own keys (its Ctrl+E, Ctrl+D, Ctrl+Y)
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+n", "new_chat", "New", priority=True),
        Binding("ctrl+r", "retry", "Retry", priority=True),
        Binding("ctrl+e", "edit_last", "Edit", priority=True),
        Binding("ctrl+y", "copy_code", "Copy code", priority=True),
        Binding("ctrl+t", "toggle_sources", "Colours", priority=True),
        Binding("ctrl+o", "app.settings", "Settings", priority=True),
        Binding("f2", "rename", "Rename", priority=True),
        Binding("ctrl+d", "delete", "Delete", priority=True),
        Binding("ctrl+f", "search", "Search", priority=True),
        Binding("f5", "restart_engine", "Restart", priority=True),
        Binding("ctrl+q", "app.quit", "Quit", priority=True),
    ]

    def __init__(self, history: History) -> None:
        super().__init__(id="chat")
        self.history = history
        self.conversation: Conversation | None = None
        self.reply: Reply | None = None
        self.dropped: set[str] = set()            # stopped requests whose late events are ignored
        self.editing_seq: int | None = None        # Ctrl+E: the user message being rewritten
        self.ready: Ready | None = None
        self.engine_state = "starting the engine…"
        self.last_stats: dict | None = None        # the last reply of this engine, for the status bar
        self.read_only = False                     # another window holds the open conversation
        self.shown_rows: list[tuple] = []          # what the open conversation showed when opened

    # ---- layout -------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            with Vertical(id="sidebar"):
                yield Input(placeholder="Search (Ctrl+F)", id="search")
                yield ListView(id="conversations")
            with Vertical(id="main"):
                yield VerticalScroll(id="messages")
                yield Static("", id="notice")
                yield PromptInput(id="prompt", soft_wrap=True, show_line_numbers=False)
        yield StatusBar(id="status")
        yield Footer(compact=True, show_command_palette=False)

    @reported
    async def on_mount(self) -> None:
        if self.app.settings.show_sources:
            self.add_class("-sources")
        self.refresh_status()
        await self.reload_conversations()
        convs = self.history.conversations()
        if convs:
            await self.open_conversation(convs[0].id)
        else:
            await self.show_welcome()
        self.query_one("#prompt").focus()

    async def show_welcome(self) -> None:
        messages = self.query_one("#messages", VerticalScroll)
        await messages.remove_children()
        await messages.mount(Static(WELCOME, classes="welcome"))

    # ---- conversations ------------------------------------------------------------------------
    async def reload_conversations(self) -> None:
        """The sidebar: every conversation, or those matching the search box."""
        view = self.query_one("#conversations", ListView)
        await view.clear()
        await view.extend(ListItem(Label(c.title), name=c.id)
                          for c in self.history.search(self.query_one("#search", Input).value))
        self._highlight_current()

    def _highlight_current(self) -> None:
        view = self.query_one("#conversations", ListView)
        current = self.conversation.id if self.conversation else None
        view.index = next((i for i, item in enumerate(view.children) if item.name == current),
                          None)

    async def open_conversation(self, conversation_id: str | None) -> None:
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
    async def on_list_view_selected(self, event: ListView.Selected) -> None:
        if event.list_view.id == "conversations" and event.item.name:
            await self.open_conversation(event.item.name)
            self.query_one("#prompt").focus()

    @reported
    async def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "search":
            await self.reload_conversations()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "search":
            self.query_one("#conversations", ListView).focus()

    def action_search(self) -> None:
        self.query_one("#search", Input).focus()

    @reported
    async def action_new_chat(self) -> None:
        await self.open_conversation(None)
        self.query_one("#prompt").focus()

    def action_rename(self) -> None:
        if self.conversation is None or self._refused():
            return
        conv = self.conversation

        async def done(title: str | None) -> None:
            if title is not None and title.strip():
                await self.rename(conv.id, title)

        self.app.push_screen(TextPromptScreen("Rename the conversation:", conv.title), done)

    @reported
    async def rename(self, conversation_id: str, title: str) -> None:
        self.history.rename(conversation_id, title)
        self.conversation = self.history.conversation(conversation_id)
        await self.reload_conversations()

    def action_delete(self) -> None:
        if self.conversation is None or self._refused():
            return
        conv = self.conversation

        async def done(yes: bool | None) -> None:
            if yes:
                await self.delete_conversation(conv.id)

        self.app.push_screen(ConfirmScreen(f"Delete '{conv.title}' and forget it everywhere, "
                                           "also in the personal drafter?"), done)

    @reported
    async def delete_conversation(self, conversation_id: str) -> None:
        if self.reply is not None and self.reply.conversation_id == conversation_id:
            self.app.engine_call("stop", self.reply.request_id)
            self.dropped.add(self.reply.request_id)
            self.reply = None
        self.history.delete(conversation_id)
        self.app.engine_call("forget", conversation_id)
        await self.reload_conversations()
        convs = self.history.conversations()
        await self.open_conversation(convs[0].id if convs else None)
        self.app.notify("Conversation deleted and forgotten by the personal drafter.")

    # ---- sending ------------------------------------------------------------------------------
    @reported
    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if text.startswith("/copy"):
            self.copy_code(text.removeprefix("/copy").strip())
            self.query_one("#prompt", PromptInput).clear()
            return
        if self.reply is not None:
            self.app.notify("A reply is still being written: Esc stops it.", severity="warning")
            return
        if self.read_only and not await self._try_to_write():
            return
        try:   # a paste or attachments longer than the context could hold stay unsent
            content = check_prompt(expand_attachments(text), self.app.base_spec.n_ctx, "the message")
        except LocalspecError as err:
            self.show_notice(f"{err.title}: {err.cause}. {err.fix}")
            return
        self.show_notice("")
        await self.send(content)

    async def send(self, content: str) -> None:
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

    async def generate(self) -> None:
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
                             system=s.system_prompt or None)

    @reported
    async def action_stop(self) -> None:
        if self.reply is None:
            if self.editing_seq is not None:
                self.editing_seq = None
                self.query_one("#prompt", PromptInput).clear()
                self.show_notice("")
            return
        self.app.engine_call("stop", self.reply.request_id)
        self.dropped.add(self.reply.request_id)
        await self.finish("stopped")

    @reported
    async def action_retry(self) -> None:
        last = self._last_message()
        if self.reply is not None or last is None or self._refused():
            return
        if last.role == "assistant":
            self.history.truncate(last.conversation_id, last.seq)
        await self.open_conversation(last.conversation_id)
        await self.generate()

    @reported
    def action_edit_last(self) -> None:
        if self.reply is not None or self.conversation is None or self._refused():
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
    def action_copy_code(self) -> None:
        self.copy_code("")

    def copy_code(self, which: str) -> None:
        """Copy the last reply's code block number `which` (1-based; default the last one)."""
        last = next((m for m in reversed(self.history.messages(self.conversation.id))
                     if m.role == "assistant"), None) if self.conversation else None
        blocks = code_blocks(last.content) if last else []
        if not blocks:
            self.app.notify("The last reply has no code block.", severity="warning")
            return
        try:
            n = int(which) if which else len(blocks)
            code = blocks[n - 1]
            if n < 1:
                raise IndexError
        except (ValueError, IndexError):
            self.app.notify(f"Use /copy N with N from 1 to {len(blocks)}.", severity="warning")
            return
        self.app.copy_to_clipboard(code)
        self.app.notify(f"Copied code block {n} of {len(blocks)} ({len(code.splitlines())} lines).")

    def action_toggle_sources(self) -> None:
        self.toggle_class("-sources")
        for view in self.query(MessageView):
            view.refresh_sources()
        self.refresh_status()

    def action_restart_engine(self) -> None:
        self.app.restart_engine()

    def engine_loading(self, state: str) -> None:
        """A new engine is on its way (a restart, another model): the status bar says `state` and
        forgets the old engine's figures, which would pass for the new one's."""
        self.ready, self.engine_state, self.last_stats = None, state, None
        self.refresh_status()

    # ---- engine events ------------------------------------------------------------------------
    @reported
    async def on_engine_event(self, event) -> None:
        if isinstance(event, Calibrating):   # a first run measures this machine before Ready
            self.engine_state = measuring_text(event.what, event.step, event.total)
            self.refresh_status()
        elif isinstance(event, Ready):
            self.ready, self.engine_state, self.last_stats = event, "", None   # a new engine
            self.show_notice("")
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
                self.app.notify(f"{event.cause}. {event.fix}", title=event.title,
                                severity="warning", timeout=10)
        elif isinstance(event, Token):
            await self.on_token(event)
        elif isinstance(event, Done):
            self.last_stats = event.stats
            await self.finish("stopped" if event.finish_reason == "stopped" else "complete",
                              event.text, event.stats, CUT_NOTES.get(event.finish_reason, ""))
        elif isinstance(event, Error):
            await self.finish("error", note=event.title)
            self.show_notice(f"{event.title}: {event.cause}. {event.fix}")

    async def on_token(self, event: Token) -> None:
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
                self.query_one("#messages", VerticalScroll).scroll_end(animate=False)

    async def finish(self, state: str, text: str | None = None, stats: dict | None = None,
                     note: str = "") -> None:
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
        if state == "complete":
            chat = [m.as_chat() for m in self.history.messages(reply.conversation_id) if m.content]
            self.app.engine_call("learn", reply.conversation_id, chat)
        if stats:
            self.refresh_status()

    @reported
    def save_reply_in_flight(self) -> None:
        """Leaving (quit, or the model failed): the reply in flight is kept, marked stopped."""
        reply = self.reply
        if reply is not None:
            self.app.engine_call("stop", reply.request_id)
            self.history.finish_reply(reply.message_id, reply.text, "stopped", None, reply.segments)
            self.reply = None

    def history_failed(self, err: LocalspecError) -> None:
        """The one place a failure of the history (or any LocalspecError a handler let through)
        ends: the app remembers it (quitting exits with status 2 and prints it), a reply in flight
        stops where its text was last saved, and the notice says what failed and the fix. What is
        on screen and the unsent text stay."""
        self.app.history_failure = err
        reply, self.reply = self.reply, None
        if reply is not None:
            self.app.engine_call("stop", reply.request_id)
            self.dropped.add(reply.request_id)
        if not self.query("#notice"):
            return      # the screen is going (a quit saving the reply): said when the command ends
        if reply is not None and reply.view is not None:
            self.call_later(reply.view.finish, "error", None, None, "not saved")
        self.show_notice(f"{err.title}: {err.cause}. {err.fix}\nWhat is shown stays on screen; "
                         "what was not saved is marked. Quitting (Ctrl+Q) exits with status 2.")

    # ---- one window per conversation ----------------------------------------------------------
    def _let_go(self, conversation_id: str) -> None:
        """Leaving a conversation: its lease goes, unless a reply is still streaming into it."""
        if self.reply is None or self.reply.conversation_id != conversation_id:
            self.history.release(conversation_id)

    def _held_notice(self) -> str:
        pid = self.history.holder(self.conversation.id)
        who = f"another localspec window (process {pid})" if pid else "another localspec window"
        return (f"This conversation is open in {who}: read-only here. Ctrl+N starts a new one; "
                "Enter tries again once that window has moved on or closed.")

    def _refused(self) -> bool:
        """Whether the open conversation is read-only here (said in the notice)."""
        if self.read_only:
            self.show_notice(self._held_notice())
        return self.read_only

    async def _try_to_write(self) -> bool:
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

    # ---- helpers ------------------------------------------------------------------------------
    def refresh_status(self) -> None:
        r = self.ready
        line = engine_line(r.model if r else None, r.draft if r else None, r.device if r else None,
                           r.gpu_layers if r else 0, self.engine_state)
        self.query_one("#status", StatusBar).show(line, stages_line(r.stages if r else None),
                                                  self.last_stats, self.has_class("-sources"))

    def show_notice(self, text: str) -> None:
        """Show `text` above the prompt; none: the read-only notice if the conversation is."""
        if not text and self.read_only:
            text = self._held_notice()
        notice = self.query_one("#notice", Static)
        notice.update(text)
        notice.display = bool(text)

    def _last_message(self) -> Message | None:
        if self.conversation is None:
            return None
        rows = self.history.messages(self.conversation.id)
        return rows[-1] if rows else None


def _shown(m: Message) -> tuple:
    """What a message looks like on screen, to tell whether another window changed it."""
    return (m.id, m.state, m.content)


def _title_from(content: str) -> str:
    first = content.strip().splitlines()[0] if content.strip() else DEFAULT_TITLE
    return first[:40] + ("…" if len(first) > 40 else "")


def _last_lines(detail: str, n: int = 3) -> str:
    return "\n".join(detail.strip().splitlines()[-n:])
