"""Modal screens: confirm, one line of text, and the settings form.

Each returns its answer through `dismiss` (None for cancel); the caller decides what it means.
"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widget import Widget
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Button, Checkbox, Input, Label, Static, Switch, TextArea

from localspec.app.settings import STAGES, Settings
from localspec.engine.errors import LocalspecError


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str) -> None:
        super().__init__(classes="dialog")
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box"):
            yield Label(self.question)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Yes (y)", id="yes", variant="error")
                yield Button("No (n)", id="no")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class TextPromptScreen(ModalScreen[str | None]):
    """One line of text (a conversation's new title)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__(classes="dialog")
        self.question, self.value = question, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box"):
            yield Label(self.question)
            yield Input(self.value, id="answer", compact=True)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SettingsScreen(ModalScreen[Settings | None]):
    """Every setting in one form; Save validates, then returns the new Settings (the caller saves
    them atomically and restarts the engine if the model changed)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, settings: Settings) -> None:
        super().__init__(classes="dialog")
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings
        with VerticalScroll(classes="dialog-box settings"):
            yield Static("Settings", classes="dialog-title")
            names = _installed_names()
            yield from _row("Model (path or name)",
                            Input(s.model or "", id="model", compact=True,
                                  suggester=SuggestFromList(names, case_sensitive=False),
                                  placeholder="installed: " + (", ".join(names) or "none")))
            yield from _row("Draft (empty: the model's own)",
                            Input(s.draft or "", id="draft", compact=True))
            yield from _row("Temperature (0 = greedy)",
                            Input(str(s.temperature), id="temperature", compact=True))
            yield from _row("Top-p", Input(str(s.top_p), id="top_p", compact=True))
            yield from _row("Top-k (0 = off)", Input(str(s.top_k), id="top_k", compact=True))
            yield from _row("Max tokens per reply",
                            Input(str(s.max_tokens), id="max_tokens", compact=True))
            yield from _row("Seed (empty: new each reply)",
                            Input("" if s.seed is None else str(s.seed), id="seed", compact=True))
            yield from _row("Speculation", Switch(s.speculation, id="speculation"))
            yield from _row("Stages (Max-Gram always)",
                            *[Checkbox(stage, stage in s.stages, id=f"stage-{stage}", compact=True)
                              for stage in STAGES],
                            Checkbox("head", s.use_head, id="use_head", compact=True))
            yield from _row("Colour tokens by drafter", Switch(s.show_sources, id="show_sources"))
            yield from _row("Exact numerics (CPU, slower)", Switch(s.exact, id="exact"))
            yield Label("System prompt")
            yield TextArea(s.system_prompt, id="system_prompt", classes="system-prompt")
            yield Label("", id="settings-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save (Ctrl+S)", id="save", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()

    def action_save(self) -> None:
        value = lambda name: self.query_one(f"#{name}", Input).value.strip()   # noqa: E731
        try:
            settings = Settings(
                model=value("model") or None, draft=value("draft") or None,
                temperature=float(value("temperature")), top_p=float(value("top_p")),
                top_k=int(value("top_k")), max_tokens=int(value("max_tokens")),
                seed=int(value("seed")) if value("seed") else None,
                speculation=self.query_one("#speculation", Switch).value,
                stages=tuple(s for s in STAGES if self.query_one(f"#stage-{s}", Checkbox).value),
                use_head=self.query_one("#use_head", Checkbox).value,
                system_prompt=self.query_one("#system_prompt", TextArea).text,
                show_sources=self.query_one("#show_sources", Switch).value,
                exact=self.query_one("#exact", Switch).value)
        except ValueError as err:
            self.query_one("#settings-error", Label).update(f"Not saved: {err}")
            return
        self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)


def _row(label: str, *widgets: Widget) -> ComposeResult:
    with Horizontal(classes="setting"):
        yield Label(label)
        yield from widgets


def _installed_names() -> list[str]:
    """Installed models' names (localspec list), offered as the model field completes."""
    from localspec.models import library

    try:
        return sorted(library.installed())
    except LocalspecError:
        return []   # an unreadable manifest: the first-run screen explains it; typing still works
