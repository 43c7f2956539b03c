"""A history that fails mid-chat ends in the screen, not in a traceback.

Every chat-screen handler that touches the history is `@reported`: a LocalspecError from it (a
damaged page that the check at open missed, a full disk, a data dir made read-only) goes to
`history_failed`, the one place that handles it. The screen stays open with everything it shows
and the unsent text kept (so the user can copy what was not saved); a reply in flight stops, since
its next piece could no longer be saved before it is shown; the notice says what failed and the
fix; quitting then exits with status 2 and the error printed again. Staying open rather than
exiting at once: a full disk or a permission can be fixed while the window is open, and the next
write tries again.
"""
from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Callable

from localspec.engine.errors import LocalspecError

if TYPE_CHECKING:
    from .chat import ChatScreen


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


class HistoryFailure:
    """ChatScreen's handling of a failed history (mixed into app/tui/chat.ChatScreen, which holds
    the reply in flight and the notice)."""

    def history_failed(self: ChatScreen, err: LocalspecError) -> None:
        """The one place a failure of the history (or any LocalspecError a handler let through)
        ends: the app remembers it (quitting exits with status 2 and prints it), a reply in flight
        stops where its text was last saved, and the notice says what failed and the fix. What is
        on screen and the unsent text stay."""
        self.app.history_failure = err
        reply, self.reply = self.cancel_reply(), None
        if not self.query("#notice"):
            return      # the screen is going (a quit saving the reply): said when the command ends
        if reply is not None and reply.view is not None:
            self.call_later(reply.view.finish, "error", None, None, "not saved")
        self.show_notice(f"{err.title}: {err.cause}. {err.fix}\nWhat is shown stays on screen; "
                         "what was not saved is marked. Quitting (Ctrl+Q) exits with status 2.")
