"""The engine process cuts each round's text per token so the chat can colour every token by the
drafter that proposed it."""
from __future__ import annotations

from localspec.app.engine_main import split_by_source
from localspec.engine.llama_model import LlamaModel


def test_text_is_cut_per_token_or_left_whole(tiny):
    model = LlamaModel(tiny.target_gguf, n_ctx=64, n_seq_max=1, n_threads=1)
    try:
        text = "def add(a, b):\n    return a + b\n"
        tokens = model.tokenize(text, special=False, add_bos=False)
        pieces = split_by_source(text, tokens, model.piece)
        assert len(pieces) == len(tokens) > 3 and "".join(pieces) == text
        # a character whose bytes straddle tokens cannot be cut: the round stays whole
        emoji = model.tokenize("🙂", special=False, add_bos=False)
        if len(emoji) > 1:
            assert split_by_source("🙂", emoji, model.piece) == []
        # text that is not the tokens' own (a held-back stop prefix): whole
        assert split_by_source(text[:-3], tokens, model.piece) == []
    finally:
        model.close()
