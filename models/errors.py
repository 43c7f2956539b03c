"""One error type for everything a user can cause: a title, the cause, and the fix.

The CLI prints these without a traceback; anything else escaping is a bug. It lives in the bottom
layer, importing nothing, so every part of localspec can raise it without loading anything native
(the chat UI process, `pull`); `localspec.engine.errors` re-exports it.
"""
from __future__ import annotations


class LocalspecError(Exception):
    def __init__(self, title: str, cause: str, fix: str) -> None:
        super().__init__(f"{title}: {cause}")
        self.title = title
        self.cause = cause
        self.fix = fix

    def render(self) -> str:
        return f"Error: {self.title}\n  cause: {self.cause}\n  fix:   {self.fix}"
