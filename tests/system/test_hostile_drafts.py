"""Hostile transformers draft folders (issue 20): each one is refused as a LocalspecError naming
the cause, within a stated time, without allocating what its config claims, and with no file
of the folder changed.

Every case starts from a copy of the tiny PyTorch draft (tests/tiny_models.py) and breaks one
thing: config.json (not JSON, not an object, missing fields, absurd sizes), the safetensors file
(truncated, a header length past the end, a header that is not JSON, a file too short for a
length), the shapes against the config, a weight file missing. The bound is the refusal's wall
time: it reads config.json and the safetensors headers only, so `REFUSE_S` is generous on a
loaded 2-core machine; memory is the process's peak resident size, which a refusal must not
raise by more than `GROWTH_MB` (a 10^9-wide hidden layer alone would be gigabytes).
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import time
from pathlib import Path
from typing import Callable

import pytest

from localspec.engine.errors import LocalspecError
from localspec.engine.torch_lm import TorchLM
from localspec.models import safetensors_file

REFUSE_S = 5.0
GROWTH_MB = 64


def _config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def _header_length(folder: Path) -> int:
    with (folder / "model.safetensors").open("rb") as fh:
        return struct.unpack("<Q", fh.read(8))[0]


def _truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)


def _length_past_end(folder: Path) -> None:
    with (folder / "model.safetensors").open("r+b") as fh:
        fh.write(struct.pack("<Q", 1 << 40))


def _header_not_json(folder: Path) -> None:
    n = _header_length(folder)
    with (folder / "model.safetensors").open("r+b") as fh:
        fh.seek(8)
        fh.write(b"\xff{" * (n // 2) + b"x" * (n % 2))


def _header(folder: Path, text: bytes) -> None:
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text)


def _too_short(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"\x10\x00")


def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        fh.truncate(size)      # nothing written: the size is what counts


def _replace(path: Path, make: Callable[[Path], None]) -> None:
    path.unlink()
    make(path)


def _index_names_missing_shard(folder: Path) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                        "lm_head.weight": "model-00002-of-00002.safetensors"}}))


def _tensor_range_lies(folder: Path) -> None:
    """A well-formed header whose first tensor claims more bytes than its shape holds."""
    weights = folder / "model.safetensors"
    raw = weights.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header["model.embed_tokens.weight"]["data_offsets"][1] += 4
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    if len(text) != n:
        pytest.skip("the edited header does not fit the original's length")
    weights.write_bytes(raw[:8] + text + raw[8 + n:])


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "config-not-json": (lambda f: (f / "config.json").write_bytes(b"{\"vocab_size\": 5"),
                        "config.json is unusable"),
    "config-not-utf8": (lambda f: (f / "config.json").write_bytes(b"\xff\xfe{}"),
                        "config.json is unusable"),
    "config-not-an-object": (lambda f: (f / "config.json").write_text("[64, 2, 512]"),
                             "not an object"),
    "config-missing-hidden-size": (lambda f: _config(f, hidden_size=None), "hidden_size"),
    "config-negative-layers": (lambda f: _config(f, num_hidden_layers=-2), "not a positive integer"),
    "config-string-vocab": (lambda f: _config(f, vocab_size="512"), "not a positive integer"),
    "config-huge-config": (lambda f: (f / "config.json").write_bytes(b" " * (2 << 20) + b"{}"),
                           "a file of this kind is at most 1.0 MiB"),
    # issue 45: read through models/own_files, a regular file only (a FIFO hung, /dev/zero grew)
    "config-a-fifo": (lambda f: _replace(f / "config.json", os.mkfifo), "is a FIFO (named pipe)"),
    "config-dev-zero": (lambda f: _replace(f / "config.json", lambda p: p.symlink_to("/dev/zero")),
                        "is a character device"),
    "safetensors-a-fifo": (lambda f: _replace(f / "model.safetensors", os.mkfifo), "is a FIFO (named pipe)"),
    "index-a-fifo": (lambda f: os.mkfifo(f / "model.safetensors.index.json"), "is a FIFO (named pipe)"),
    "hidden-size-1e9": (lambda f: _config(f, hidden_size=10**9), "do not match config.json"),
    "vocab-1e12": (lambda f: _config(f, vocab_size=10**12), "do not match config.json"),
    # without layer_types, which transformers would check: it then builds 10^6 layers (minutes, GBs)
    "layers-1e6": (lambda f: _config(f, num_hidden_layers=10**6, layer_types=None),
                   "says 1000000 layers"),
    "shapes-disagree": (lambda f: _config(f, intermediate_size=96), "intermediate_size 96"),
    "untied-head-missing": (lambda f: _config(f, tie_word_embeddings=False), "lm_head.weight"),
    "not-qwen-or-llama": (lambda f: _config(f, model_type="gpt2"), "model type 'gpt2'"),
    "safetensors-truncated": (_truncate, "truncated"),
    "safetensors-too-short": (_too_short, "not even a header"),
    "header-length-past-end": (_length_past_end, "the header claims 1099511627776 bytes"),
    "header-not-json": (_header_not_json, "the header is not JSON"),
    "tensor-range-lies": (_tensor_range_lies, "model.embed_tokens.weight"),
    "weights-missing": (lambda f: (f / "model.safetensors").unlink(), "has no model.safetensors"),
    "index-names-missing-shard": (_index_names_missing_shard, "model-00001-of-00002.safetensors"),
    "index-huge": (lambda f: _sparse(f / "model.safetensors.index.json", 1 << 30),
                   "a file of this kind is at most 16.0 MiB"),
    "header-nested-too-deep": (lambda f: _header(f, b"[" * 200_000), "the header is not JSON"),
    "config-nested-too-deep": (lambda f: (f / "config.json").write_bytes(b"[" * 200_000),
                               "config.json is unusable"),
    "index-not-json": (lambda f: (f / "model.safetensors.index.json").write_text("{"),
                       "index is unusable"),
}


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(folder.iterdir())}


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB


@pytest.mark.parametrize("case", CASES)
def test_hostile_draft_folder_is_refused_quickly_and_small(tiny, tmp_path, case):
    folder = tmp_path / "draft"
    shutil.copytree(tiny.draft_torch, folder)
    damage, needle = CASES[case]
    damage(folder)
    before = snapshot(folder)
    peak = peak_mb()
    start = time.perf_counter()
    with pytest.raises(LocalspecError) as err:
        TorchLM.load(folder, max_len=64, device="cpu")
    took = time.perf_counter() - start
    assert needle in f"{err.value.title}: {err.value.cause}", err.value.render()
    assert err.value.fix.startswith(("Re-download", "Use a Qwen2")), err.value.render()
    assert took < REFUSE_S, f"{case}: refused after {took:.1f} s"
    assert peak_mb() - peak < GROWTH_MB, f"{case}: the peak grew by {peak_mb() - peak:.0f} MB"
    assert snapshot(folder) == before


def test_the_untouched_draft_passes_the_checks(tiny):
    """The checks refuse what is broken, not the tiny draft itself, and agree with its loaded sizes."""
    folder = Path(tiny.draft_torch)
    shape = safetensors_file.read_config(folder)
    safetensors_file.check_weights(folder, shape)
    lm = TorchLM.load(folder, max_len=32, device="cpu")
    assert (lm.vocab_size, len(lm.layers), lm.n_heads, lm.n_kv) == (
        shape.vocab_size, shape.num_hidden_layers, shape.num_attention_heads,
        shape.num_key_value_heads)


def test_truncated_gguf_draft_for_pytorch_is_refused_from_its_header(tiny, tmp_path):
    """A .gguf run in PyTorch (--torch-draft) goes through the GGUF validator before transformers
    parses it: a file cut inside its header is named as such, within the same bound."""
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(Path(tiny.draft_gguf).read_bytes()[:4096])
    start = time.perf_counter()
    with pytest.raises(LocalspecError) as err:
        TorchLM.load(draft, max_len=64, device="cpu")
    assert time.perf_counter() - start < REFUSE_S
    assert err.value.title == "Could not load the draft model" and "truncated" in err.value.cause
