"""The chat screen: conversations on the left, the messages, the prompt, the speculation status.

The screen holds the state and the layout; what it does is split by concept, one module each:

* app/tui/conversations.py: the sidebar; opening, searching, renaming and deleting conversations;
  which window may write the open one;
* app/tui/prompt.py: what Enter in the prompt does (attachments, /copy, send), retry and edit;
* app/tui/reply.py: the reply in flight, from the engine's events into the history, then onto the
  screen; Esc; a crashed engine;
* app/tui/history_failure.py: a history that fails mid-chat ends in the screen, not a traceback.

Why mixins rather than helper objects: Textual looks a screen's handlers (``on_*``, ``action_*``)
up on its class and the classes it derives from, so each concept's handlers can live with it, and
the state they share stays in one place, `ChatScreen.__init__`.
"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, ListView, Static

from localspec.app.engine_proc import Ready
from localspec.app.history import Conversation, History
from localspec.app.terminal import printable
from localspec.engine.errors import LocalspecError

from .conversations import ConversationList
from .format import engine_line, stages_line
from .history_failure import HistoryFailure, reported
from .prompt import PromptActions
from .reply import Reply, ReplyStream
from .widgets import MessageView, PromptInput, StatusBar

WELCOME = ("Type a message and press Enter (Shift+Enter, Alt+Enter or Ctrl+J: new line). "
           "/file PATH attaches a file. Esc stops a reply. Ctrl+O: settings.")


class ChatScreen(ConversationList, PromptActions, ReplyStream, HistoryFailure, Screen):
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

    # ---- the engine and the status bar --------------------------------------------------------
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

    def engine_failed(self, err: LocalspecError) -> None:
        """The engine process could not be started: the status bar says so, the notice says why
        and what to do; the conversation stays as it is."""
        self.ready, self.engine_state, self.last_stats = None, "engine not running", None
        self.refresh_status()
        self.show_notice(f"{err.title}: {err.cause}. {err.fix}")

    def refresh_status(self) -> None:
        r = self.ready
        line = engine_line(r.model if r else None, r.draft if r else None, r.device if r else None,
                           r.gpu_layers if r else 0, self.engine_state)
        self.query_one("#status", StatusBar).show(line, stages_line(r.stages if r else None),
                                                  self.last_stats, self.has_class("-sources"))

    def show_notice(self, text: str) -> None:
        """Show `text` above the prompt; none: the read-only notice if the conversation is. It
        may quote file and model names and the engine's stderr: shown `printable`."""
        if not text and self.read_only:
            text = self.held_notice()
        notice = self.query_one("#notice", Static)
        notice.update(printable(text))
        notice.display = bool(text)
