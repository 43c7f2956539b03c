"""The model pairs localspec knows by name: plain frozen data with exact lookups.

A pair is a target GGUF plus the drafts that share its tokenizer: a GGUF draft (llama.cpp) and the
same draft as a transformers repo (PyTorch). Names are looked up exactly, never fuzzily, so a typo
is an error that lists the known names rather than a surprise download.
Large GGUFs on the hub are often split into parts (``-00001-of-00002.gguf``); `files` keeps every
part in order, and llama.cpp loads a split model from its first part.
"""
from __future__ import annotations

from dataclasses import dataclass

from localspec.models.errors import LocalspecError


@dataclass(frozen=True)
class HubFiles:
    repo: str                 # Hugging Face repo id
    files: tuple[str, ...]    # the GGUF file, or every part of a split GGUF in order
    quantization: str = "Q4_K_M"

    @property
    def first(self) -> str:
        return self.files[0]


@dataclass(frozen=True)
class ModelPair:
    name: str
    description: str
    target: HubFiles
    draft: HubFiles | None          # GGUF draft with the target's tokenizer
    torch_draft: str | None         # the same draft as a transformers repo id


DEFAULT_MODEL = "qwen2.5-coder-1.5b"

_QWEN_CODER_05B_DRAFT = HubFiles("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
                                 ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",))

REGISTRY: tuple[ModelPair, ...] = (
    ModelPair("qwen2.5-coder-1.5b", "Qwen2.5-Coder 1.5B Instruct, Q4_K_M (default)",
              HubFiles("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
                       ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",)),
              _QWEN_CODER_05B_DRAFT, "Qwen/Qwen2.5-Coder-0.5B-Instruct"),
    # The official 7B GGUF repos split q4_k_m into two parts.
    ModelPair("qwen2.5-coder-7b", "Qwen2.5-Coder 7B Instruct, Q4_K_M",
              HubFiles("Qwen/Qwen2.5-Coder-7B-Instruct-GGUF",
                       ("qwen2.5-coder-7b-instruct-q4_k_m-00001-of-00002.gguf",
                        "qwen2.5-coder-7b-instruct-q4_k_m-00002-of-00002.gguf")),
              _QWEN_CODER_05B_DRAFT, "Qwen/Qwen2.5-Coder-0.5B-Instruct"),
    # Also split in two; the plain 0.5B Instruct shares Qwen2.5's tokenizer.
    ModelPair("qwen2.5-7b", "Qwen2.5 7B Instruct, Q4_K_M",
              HubFiles("Qwen/Qwen2.5-7B-Instruct-GGUF",
                       ("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf",
                        "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf")),
              HubFiles("Qwen/Qwen2.5-0.5B-Instruct-GGUF", ("qwen2.5-0.5b-instruct-q4_k_m.gguf",)),
              "Qwen/Qwen2.5-0.5B-Instruct"),
    # meta-llama repos are gated: the PyTorch draft needs an accepted licence and a hub token.
    ModelPair("llama-3.1-8b", "Llama 3.1 8B Instruct, Q4_K_M",
              HubFiles("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
                       ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",)),
              HubFiles("bartowski/Llama-3.2-1B-Instruct-GGUF", ("Llama-3.2-1B-Instruct-Q4_K_M.gguf",)),
              "meta-llama/Llama-3.2-1B-Instruct"),
)

_BY_NAME = {pair.name: pair for pair in REGISTRY}


def known_names() -> list[str]:
    return [pair.name for pair in REGISTRY]


def lookup(name: str) -> ModelPair:
    """The pair registered under exactly `name`; LocalspecError listing the known names otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise LocalspecError(f"Unknown model '{name}'",
                             f"localspec knows: {', '.join(known_names())}",
                             f"Use one of those names (default: {DEFAULT_MODEL}), or register "
                             f"your own file with: localspec import NAME FILE.gguf") from None
