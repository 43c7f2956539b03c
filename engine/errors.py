"""The engine's errors: `LocalspecError` (from the bottom layer, models/errors.py, which loads
nothing native; importing it from here keeps working) and the ones the engine words itself."""
from __future__ import annotations

from localspec.models.errors import LocalspecError

__all__ = ["LocalspecError", "vocab_mismatch"]


def vocab_mismatch(draft: str, draft_tokens: int, target: str, target_tokens: int) -> LocalspecError:
    return LocalspecError("Draft vocabulary does not match the target",
                          f"draft '{draft}' has {draft_tokens} tokens, target '{target}' has "
                          f"{target_tokens} tokens",
                          "Use a draft from the target's model family (same tokenizer), "
                          "or run with --no-speculation")
