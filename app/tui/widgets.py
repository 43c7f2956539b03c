"""The chat screen's widgets: the prompt, one message, the speculation status bar.

Each widget renders state it is handed; none talks to the engine or the history (the screen does).
"""
from __future__ import annotations

from rich.text import Text
from textual import events
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Label, Markdown, Static, TextArea
from textual.widgets.markdown import MarkdownStream

from localspec.app.terminal import printable

from .format import STATE_MARKS, context_line, source_style, speculation_summary

NEWLINE_KEYS = ("shift+enter", "alt+enter", "ctrl+j")


class PromptInput(TextArea):
    """Multi-line input: Enter sends; Shift+Enter, Alt+Enter or Ctrl+J start a new line (terminals
    report whichever they can); pasted text keeps its newlines."""

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)


class MessageView(Vertical):
    """One message: a header (who, and how a reply ended) and its text, as Markdown or, with token
    colouring on, as plain text coloured by the drafter that proposed each streamed piece. The
    text is shown `printable` (app/terminal.py): Textual passes ESC and most other control
    characters through to the terminal, and a model's reply must not drive it."""

    def __init__(self, role: str, content: str = "", state: str = "complete",
                 segments: tuple[tuple[str, str], ...] | list = (), stats: dict | None = None,
                 note: str = "") -> None:
        super().__init__(classes=f"message {role}")
        self.role, self.content, self.state = role, content, state
        self.segments: list[tuple[str, str]] = [tuple(s) for s in segments]
        self.stats, self.note = stats, note
        self._stream: MarkdownStream | None = None

    def compose(self):
        yield Label(self._header(), classes="msg-header")
        yield Markdown(printable(self.content), classes="msg-body")
        yield Static(self._coloured(), classes="msg-sources")

    def _header(self) -> Text:
        who = "You" if self.role == "user" else "Assistant"
        text = Text(who, style="bold")
        mark = STATE_MARKS.get(self.state)
        if mark:
            text.append(f"  {mark[0]}", style=mark[1])
        if self.stats and self.state == "complete" and self.role == "assistant":
            text.append(f"  {speculation_summary(self.stats, brief=True)}", style="dim")
        if self.note:
            text.append(f"  {self.note}", style="red")
        return text

    def _coloured(self) -> Text:
        if not self.segments:
            return Text(printable(self.content))
        text = Text()
        for piece, source in self.segments:
            text.append(printable(piece), style=source_style(source))
        shown = sum(len(p) for p, _ in self.segments)
        if shown < len(self.content):      # text the segments do not cover (a final flush)
            text.append(printable(self.content[shown:]))
        return text

    # ---- streaming ----------------------------------------------------------------------------
    async def append(self, piece: str, segments: list[tuple[str, str]]) -> None:
        """Stream `piece`; `segments` are its parts with the drafter each came from."""
        if not piece:
            return
        self.content += piece
        self.segments.extend(segments)
        if self._stream is None:
            self._stream = Markdown.get_stream(self.query_one(".msg-body", Markdown))
        await self._stream.write(printable(piece))
        if self.screen.has_class("-sources"):
            self.query_one(".msg-sources", Static).update(self._coloured())

    async def finish(self, state: str, content: str | None = None, stats: dict | None = None,
                     note: str = "") -> None:
        """The reply ended (and is already committed to the history)."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        if content is not None and content != self.content:
            self.content = content
            await self.query_one(".msg-body", Markdown).update(printable(content))
        self.state, self.stats, self.note = state, stats, note
        self.query_one(".msg-header", Label).update(self._header())
        self.query_one(".msg-sources", Static).update(self._coloured())

    def refresh_sources(self) -> None:
        self.query_one(".msg-sources", Static).update(self._coloured())


class StatusBar(Static):
    """Model, device, and the running engine's last reply's speculation numbers (none from an
    earlier engine or model: figures are the engine's measurements, and only its own say
    anything of it)."""

    def show(self, engine: str, stages: str, stats: dict | None, sources_on: bool) -> None:
        line = Text(printable(engine), style="bold")   # model file names
        line.append("\n")
        line.append(speculation_summary(stats, per_drafter=True) if stats else stages)
        if stats and (context := context_line(stats)):
            line.append(f" · {context}")
        if sources_on:
            line.append("  │  ")
            for name in ("target", "maxgram", "personal-ngram", "draft"):
                line.append(name + " ", style=source_style(name) or "reverse")
        self.update(line)
