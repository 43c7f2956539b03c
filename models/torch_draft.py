"""A PyTorch draft on disk: a transformers folder, and its vocabulary checked against a target GGUF.

The engine runs a folder draft with PyTorch (on the GPU) and checks only that the vocabulary
sizes agree; two tokenizers of one size can still number their tokens differently, and then every
drafted token is wrong. So before such a draft is registered, its tokenizer.json is compared with
the target GGUF's token list id by id (both spell byte-level tokens the same way, `Ġthe`), and
config.json's vocab_size with the GGUF's token count (which includes padding tokens, as the
draft's output layer does). Which files a folder needs: config.json, the safetensors weights
(and their index), the tokenizer and generation files; nothing else in a repo is fetched.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from localspec.models.errors import LocalspecError
from localspec.models.gguf_file import token_texts
from localspec.models.own_files import Unreadable, read_bytes, read_json
from localspec.models.safetensors_file import MAX_CONFIG

WANTED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
          "chat_template.jinja", "model.safetensors.index.json")
_FIX = "Use the draft of the target's model family (same tokenizer), or pull without --torch-draft"
_CONFIG_FIX = "Pick a transformers model repo or folder (config.json with vocab_size, safetensors weights)"
_TOKENIZER_FIX = "Pick a transformers model repo or folder with a tokenizer.json"
# a tokenizer.json: a few MiB for a 150k-token vocabulary with its merges; the largest known ~35 MiB
MAX_TOKENIZER = 64 << 20


@dataclass(frozen=True)
class TorchDraftInfo:
    vocab_size: int      # config.json's vocab_size (the output layer's width)
    dtype: str           # the weights' dtype as config.json names it, upper case (BF16, F32)
    size: int            # bytes, all files


def wanted_files(names: Iterable[str]) -> list[str]:
    """The files of a repo (or folder) a draft needs: top level, config, tokenizer, safetensors."""
    return sorted(n for n in names if "/" not in n and (n in WANTED or n.endswith(".safetensors")))


def is_torch_repo(names: Iterable[str]) -> bool:
    files = wanted_files(names)
    return "config.json" in files and any(n.endswith(".safetensors") for n in files)


def config_vocab_size(raw: bytes, label: str) -> int:
    try:
        if len(raw) > MAX_CONFIG:
            raise ValueError(f"{len(raw):,} bytes: a config.json is a few KiB")
        config = json.loads(raw)
        return int(config["vocab_size"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError,
            RecursionError) as err:   # RecursionError: JSON nested deeper than Python's stack
        raise LocalspecError("The draft's config.json is unusable", f"{label}: {err!r}", _CONFIG_FIX) from None


def check_against(target: Path, files: dict[str, Path], target_name: str,
                  draft_name: str) -> TorchDraftInfo:
    """The draft folder's facts if its vocabulary is the target GGUF's; LocalspecError naming
    both vocabularies otherwise. `files` maps each file name in the folder to where it is now."""
    if "config.json" not in files or not any(n.endswith(".safetensors") for n in files):
        raise LocalspecError("Not a transformers draft", f"'{draft_name}' has no config.json or "
                             "no .safetensors weights", "Pick a transformers model repo or folder")
    try:                                             # a regular file, a larger one refused unread
        config_raw = read_bytes(files["config.json"], MAX_CONFIG)
    except Unreadable as err:
        raise LocalspecError("The draft's config.json is unusable", str(err), _CONFIG_FIX) from None
    vocab_size = config_vocab_size(config_raw, f"{draft_name}/config.json")
    tokens = token_texts(target)
    if vocab_size != len(tokens):
        raise LocalspecError("Draft vocabulary does not match the target",
                             f"draft '{draft_name}' has {vocab_size} tokens (config.json), target "
                             f"'{target_name}' has {len(tokens)} tokens", _FIX)
    if "tokenizer.json" in files:
        _compare_token_texts(tokens, files["tokenizer.json"], target_name, draft_name)
    config = json.loads(config_raw)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "unknown")
    dtype = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(dtype, dtype.upper())
    return TorchDraftInfo(vocab_size, dtype, sum(p.stat().st_size for p in files.values()))


def _compare_token_texts(tokens: list[str], tokenizer: Path, target_name: str,
                         draft_name: str) -> None:
    try:
        spec = read_json(tokenizer, MAX_TOKENIZER)
        vocab = spec["model"]["vocab"]
        pairs = list(vocab.items()) if isinstance(vocab, dict) else [
            (entry[0], i) for i, entry in enumerate(vocab)]          # Unigram: [[text, score]]
        pairs += [(t["content"], t["id"]) for t in spec.get("added_tokens", [])]
    except Unreadable as err:
        raise LocalspecError("The draft's tokenizer.json is unusable", str(err), _TOKENIZER_FIX) from None
    except (KeyError, TypeError, IndexError, AttributeError) as err:
        raise LocalspecError("The draft's tokenizer.json is unusable",
                             f"{draft_name}/tokenizer.json: {err!r}", _TOKENIZER_FIX) from None
    for text, token_id in sorted(pairs, key=lambda pair: pair[1]):
        theirs = tokens[token_id] if 0 <= token_id < len(tokens) else None
        if theirs != text:
            raise LocalspecError("Draft vocabulary does not match the target",
                                 f"token {token_id} is {theirs!r} in target '{target_name}' but "
                                 f"{text!r} in draft '{draft_name}' (both {len(tokens)} tokens)",
                                 _FIX)
