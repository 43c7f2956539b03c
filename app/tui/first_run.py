"""The screen shown when there is no usable model: what is wrong, how to get one, what is installed.

A missing, unconfigured or broken model is an explained state here, never a traceback: the
screen names the problem (title, cause, fix), explains `localspec pull` and `localspec import`,
and lists installed models; choosing one saves it as the chat's model.
"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Label, ListItem, ListView, Static

from localspec.app.terminal import printable
from localspec.engine.errors import LocalspecError

INTRO = """\
[b]localspec[/b] chats with a model on this machine. Nothing leaves it.

Get a model in one of two ways, in another terminal:

  [b]localspec pull NAME[/b]                  download a known model pair (the only network use)
  [b]localspec import NAME FILE.gguf[/b] [--draft DRAFT.gguf]   register GGUF files you already have

Then pick it below, or start [b]localspec chat --model NAME|FILE.gguf[/b].
"""


class FirstRunScreen(Screen):
    BINDINGS = [Binding("r", "rescan", "Rescan models"), Binding("ctrl+q", "app.quit", "Quit")]

    class Chosen(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def __init__(self, problem: LocalspecError | None) -> None:
        super().__init__(id="first-run")
        self.problem = problem

    def compose(self) -> ComposeResult:
        with Vertical(classes="first-run"):
            if self.problem is not None:
                yield Static(f"[b red]{self.problem.title}[/]\n  cause: {printable(self.problem.cause)}\n"
                             f"  fix:   {printable(self.problem.fix)}", id="problem", markup=True)
            else:
                yield Static("[b]No model is set up yet.[/b]", id="problem", markup=True)
            yield Static(INTRO, markup=True, classes="intro")
            yield Label("Installed models (Enter picks one):", classes="models-title")
            yield ListView(id="models")
        yield Footer()

    async def on_mount(self) -> None:
        await self.action_rescan()

    async def action_rescan(self) -> None:
        """List the installed models, the first usable one highlighted (and the list focused), so
        that Enter picks it without an arrow key first."""
        view = self.query_one("#models", ListView)
        await view.clear()
        await view.extend(_model_items())
        view.index = next((i for i, item in enumerate(view.children)
                           if item.name and not item.disabled), None)
        view.focus()

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        if event.item.name:
            self.post_message(self.Chosen(event.item.name))


def _model_items() -> list[ListItem]:
    """One row per installed model (those with missing files shown, but not selectable)."""
    from localspec.models import library

    try:
        rows = library.list_models()
    except LocalspecError as err:
        return [ListItem(Label(f"{err.title}: {err.cause}. {err.fix}"))]
    if not rows:
        return [ListItem(Label("(none: localspec list is empty)"), disabled=True)]
    items = []
    for row in rows:
        m = row.model
        draft = f" + draft {m.draft.path.name}" if m.draft else ""
        missing = "  MISSING FILES" if row.missing else ""
        items.append(ListItem(Label(printable(f"{m.name}  {m.size / 1e6:,.1f} MB  {m.quantization}  "
                                              f"{row.fit}{draft}{missing}")), name=m.name,
                              disabled=bool(row.missing)))
    return items
