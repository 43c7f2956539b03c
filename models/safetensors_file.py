"""A transformers draft folder checked before transformers loads it: config.json against the
safetensors headers and the files' sizes.

Why: transformers builds the model from config.json first and reads the weights after, so a
config that claims 10^9 hidden units or 10^6 layers allocates (or tries to) before any weight is
read, and a truncated or malformed weight file fails deep inside it with whatever the parser
raises. Everything needed to refuse such a folder is cheap to read: a safetensors file starts
with an 8-byte little-endian header length and a JSON header giving each tensor's dtype, shape
and byte range, so the config's sizes can be checked against the shapes that are really on disk
and every byte range against the file's size, without reading a weight. Reads are bounded: a
header longer than `MAX_HEADER` or than the file is refused before it is read.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from localspec.models.errors import LocalspecError
from localspec.models.own_files import Unreadable, open_regular, read_json

# A header lists a few hundred bytes per tensor: 16 MiB is tens of thousands of tensors, far more
# than any draft model has, and small enough to parse at once.
MAX_HEADER = 16 << 20
MAX_CONFIG = 1 << 20            # config.json is a few KiB; a larger one is not a config
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# Bytes per element of each safetensors dtype.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_FIX = "Re-download the draft model; the folder needs a complete config.json and *.safetensors"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class DraftShape:
    """The sizes from config.json that the weights must agree with."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    head_dim: int
    tie_word_embeddings: bool


def _refuse(title: str, cause: str, fix: str = _FIX) -> LocalspecError:
    return LocalspecError(title, cause, fix)


def read_header(path: Path) -> dict[str, Tensor]:
    """The tensors a safetensors file holds, each byte range checked against the file's size."""
    try:
        fh = open_regular(path)          # a regular file only: a FIFO would block the read
    except Unreadable as err:
        raise _refuse("Draft weights are not a safetensors file", str(err)) from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise _refuse("Draft weights are truncated", f"{path}: {size} bytes, not even a header")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(MAX_HEADER, size - 8):
            raise _refuse("Draft weights are not a safetensors file",
                          f"{path}: the header claims {length} bytes, the file has {size - 8} "
                          f"after the length (the limit is {MAX_HEADER >> 20} MiB)")
        raw = fh.read(length)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise _refuse("Draft weights are not a safetensors file",
                      f"{path}: the header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise _refuse("Draft weights are not a safetensors file", f"{path}: the header is not an object")
    data = size - 8 - length        # bytes of tensor data
    tensors: dict[str, Tensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor(path, name, entry, data)
    return tensors


def _tensor(path: Path, name: str, entry: object, data: int) -> Tensor:
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPE_BYTES or not all(type(d) is int and d >= 0 for d in shape) \
                or type(begin) is not int or type(end) is not int:
            raise ValueError(entry)
    except (TypeError, KeyError, ValueError) as err:
        raise _refuse("Draft weights are not a safetensors file",
                      f"{path}: tensor '{name}' is described wrongly ({err!r:.200})") from None
    want = math.prod(shape) * DTYPE_BYTES[dtype]
    if not 0 <= begin <= end <= data or end - begin != want:
        raise _refuse("Draft weights are truncated",
                      f"{path}: tensor '{name}' ({dtype} {list(shape)}) needs bytes {begin}..{end} "
                      f"({want} bytes) of the {data} the file holds")
    return Tensor(dtype, tuple(shape))


def read_config(folder: Path) -> DraftShape:
    path = folder / "config.json"
    try:
        config = read_json(path, MAX_CONFIG)
        if not isinstance(config, dict):
            raise TypeError(f"a JSON {type(config).__name__}, not an object")
        sizes = {key: config[key] for key in ("vocab_size", "hidden_size", "num_hidden_layers",
                                               "num_attention_heads", "intermediate_size")}
        sizes["num_key_value_heads"] = config.get("num_key_value_heads", sizes["num_attention_heads"])
        for key, value in sizes.items():
            if type(value) is not int or value <= 0:
                raise ValueError(f"{key} is {value!r}, not a positive integer")
        head_dim = config.get("head_dim") or sizes["hidden_size"] // sizes["num_attention_heads"]
        if type(head_dim) is not int or head_dim <= 0:
            raise ValueError(f"head_dim is {head_dim!r}")
    except KeyError as err:
        raise _refuse("The draft's config.json is unusable", f"{path} has no {err}") from None
    except Unreadable as err:
        raise _refuse("The draft's config.json is unusable", str(err)) from None
    except (TypeError, ValueError) as err:
        raise _refuse("The draft's config.json is unusable", f"{path}: {err!s:.300}") from None
    return DraftShape(model_type=str(config.get("model_type")), head_dim=head_dim,
                      tie_word_embeddings=bool(config.get("tie_word_embeddings")),
                      **sizes)


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files transformers would read: the index's, else model.safetensors."""
    index = folder / INDEX
    if index.exists():
        try:                                    # one line per tensor, like a header
            names = sorted(set(read_json(index, MAX_HEADER)["weight_map"].values()))
            if not all(isinstance(n, str) and "/" not in n for n in names):
                raise ValueError("a weight file name that is not a file in the folder")
        except Unreadable as err:
            raise _refuse("Draft weights index is unusable", str(err)) from None
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise _refuse("Draft weights index is unusable", f"{index}: {err!s:.300}") from None
    else:
        names = [SINGLE]
    files = [folder / n for n in names]
    missing = [f.name for f in files if not f.exists()]    # anything else: read_header says what
    if missing:
        raise _refuse("Draft weights are missing", f"{folder} has no {', '.join(missing[:3])}")
    return files


def expected_shapes(shape: DraftShape) -> dict[str, tuple[int, ...]]:
    """Every weight a Qwen2/Llama decoder of these sizes has, with its shape."""
    h, v, i = shape.hidden_size, shape.vocab_size, shape.intermediate_size
    q, kv = shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
    want = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not shape.tie_word_embeddings:
        want["lm_head.weight"] = (v, h)
    for n in range(shape.num_hidden_layers):
        p = f"model.layers.{n}."
        want |= {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                 p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                 p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                 p + "mlp.down_proj.weight": (h, i), p + "input_layernorm.weight": (h,),
                 p + "post_attention_layernorm.weight": (h,)}
    return want


def check_weights(folder: Path, shape: DraftShape) -> None:
    """Nothing if the folder's weights are whole and agree with config.json's sizes (`shape`,
    from `read_config`); a LocalspecError naming the first disagreement otherwise. Reads the
    headers only."""
    tensors: dict[str, Tensor] = {}
    for file in weight_files(folder):
        tensors |= read_header(file)
    layers = {int(m.group(1)) for name in tensors if (m := _LAYER.match(name))}
    if len(layers) != shape.num_hidden_layers:
        raise _refuse("Draft weights do not match config.json",
                      f"{folder}: config.json says {shape.num_hidden_layers} layers, the weights "
                      f"hold {len(layers)}")
    for name, want in expected_shapes(shape).items():
        got = tensors.get(name)
        if got is None:
            raise _refuse("Draft weights do not match config.json",
                          f"{folder}: no tensor '{name}' in the weights")
        if got.shape != want:
            raise _refuse("Draft weights do not match config.json",
                          f"{folder}: '{name}' is {list(got.shape)} in the weights, config.json "
                          f"(vocab_size {shape.vocab_size}, hidden_size {shape.hidden_size}, "
                          f"intermediate_size {shape.intermediate_size}) makes it {list(want)}")
