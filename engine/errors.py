"""One error type for everything a user can cause: a title, the cause, and the fix.

The CLI prints these without a traceback; anything else escaping is a bug.
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


def vocab_mismatch(draft: str, draft_tokens: int, target: str, target_tokens: int) -> LocalspecError:
    return LocalspecError("Draft vocabulary does not match the target",
                          f"draft '{draft}' has {draft_tokens} tokens, target '{target}' has "
                          f"{target_tokens} tokens",
                          "Use a draft from the target's model family (same tokenizer), "
                          "or run with --no-speculation")
