"""The chat screen's terminal: keyboard input decoded by app/inputs.py's one UTF-8 policy, and a
SIGTERM, SIGHUP or SIGINT (`kill -INT`; the Ctrl+C key is a key press here) that ends the app the
ordinary way.

Textual's LinuxDriver decodes what the terminal sends strictly, so one byte that is not UTF-8 (a
terminal set to Latin-1, a binary paste, Alt sending a meta byte) raises in its input thread and
the app dies, the unsent text with it. `TolerantDriver` is that driver's input loop with one
change: invalid bytes become U+FFFD, as everywhere else in localspec.

SIGTERM would otherwise kill the app where it stands, leaving the terminal in raw mode on the
alternate screen; handled in the event loop, such a signal exits the app, which restores the terminal, saves
the reply in flight and stops the engine (ChatApp.on_unmount).
"""
from __future__ import annotations

import asyncio
import os
import selectors
import signal
from codecs import getincrementaldecoder

from textual._loop import loop_last
from textual._parser import ParseError
from textual._xterm_parser import XTermParser
from textual.app import App
from textual.drivers.linux_driver import LinuxDriver

# the exit status for each: 128 + the signal, what a shell reports for a process it ended
EXIT_SIGNALLED = {s: 128 + s for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}


class TolerantDriver(LinuxDriver):
    """LinuxDriver whose input thread replaces invalid UTF-8 instead of raising."""

    def run_input_thread(self) -> None:
        """Wait for input and dispatch events (LinuxDriver.run_input_thread, decoding with
        errors="replace")."""
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        fileno = self.fileno
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")(errors="replace").decode

        def process_selector_events(selector_events, final: bool = False) -> None:
            for last, (_key, mask) in loop_last(selector_events):
                if mask & selectors.EVENT_READ:
                    unicode_data = decode(os.read(fileno, 1024 * 4), final=final and last)
                    if not unicode_data:
                        break       # stdin is piped and ended
                    for event in parser.feed(unicode_data):
                        self.process_message(event)
            for event in parser.tick():
                self.process_message(event)

        try:
            while not self.exit_event.is_set():
                process_selector_events(selector.select(0.1))
            selector.unregister(self.fileno)
            process_selector_events(selector.select(0.1), final=True)
        finally:
            selector.close()
            try:
                for _event in parser.feed(""):
                    pass
            except (EOFError, ParseError):
                pass


def exit_on_signals(app: App) -> None:
    """From the running event loop: SIGTERM, SIGHUP and SIGINT exit `app` (status 128 + the
    signal)."""
    loop = asyncio.get_running_loop()
    for signum, status in EXIT_SIGNALLED.items():
        loop.add_signal_handler(signum, app.exit, None, status)
