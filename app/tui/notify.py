"""Every pop-up of the chat screen goes through `notify`: its text may quote a file or model name,
a path or an error's cause, so it is shown `printable` (app/terminal.py: Textual passes ESC and
other control characters through to the terminal) and without markup (Textual's notify reads
"[b]…[/]" as styling by default, and a name holding "[/x]" would end the app with a MarkupError).
"""
from __future__ import annotations

from textual.app import App
from textual.notifications import SeverityLevel

from localspec.app.terminal import printable


def notify(app: App, message: str, *, title: str = "", severity: SeverityLevel = "information",
           timeout: float | None = None) -> None:
    app.notify(printable(message), title=printable(title), severity=severity, timeout=timeout, markup=False)
