"""Check a GGUF file before llama.cpp sees it.

llama.cpp answers a truncated or foreign file with a NULL model at best and a GGML_ASSERT that kills
the process at worst, so localspec reads the header itself: the magic, the metadata, and the tensor
table, from which the end of the tensor data follows. A file shorter than that is truncated.
Reading needs no tensor data, so it costs a fraction of a second even for a multi-GB model.
The vocabulary sits near the start of the header, so `header_vocabulary` can fingerprint it from
the first megabytes alone: `localspec pull` compares a target's and a draft's vocabularies from a
Range request before downloading gigabytes.
"""
from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from localspec.models.errors import LocalspecError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# Metadata worth keeping (string arrays such as the vocabulary are kept as a count only).
_KEEP_ARRAY_LEN = ("tokenizer.ggml.tokens",)
# What a vocabulary fingerprint covers: the tokenizer model and the token texts, as raw bytes.
_VOCAB_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.tokens")


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    version: int
    architecture: str
    n_tensors: int
    vocab_size: int
    data_end: int          # bytes the file must have
    file_size: int
    metadata: dict         # scalar and string metadata
    # name -> (shape, innermost first as in GGUF; ggml type; absolute offset of its data)
    tensors: dict = field(default_factory=dict)


def tensor_rows(info: GGUFInfo, name: str, rows=None):
    """Rows of a 2-D tensor (all, or the ids in `rows`) as float32 [n, cols], dequantised from the
    file (memory-mapped: only the rows asked for are read)."""
    import numpy as np
    from gguf.quants import dequantize

    shape, ttype, offset = info.tensors[name]
    cols = shape[0]
    n_rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    qtype = GGMLQuantizationType(ttype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    row_bytes = cols // block * type_size
    data = np.memmap(info.path, dtype=np.uint8, mode="r", offset=offset, shape=(n_rows, row_bytes))
    if rows is None:
        return np.concatenate([dequantize(np.asarray(data[a:a + 8192]), qtype).astype(np.float32, copy=False)
                               .reshape(-1, cols) for a in range(0, n_rows, 8192)])
    picked = np.asarray(data[np.asarray(rows, np.int64)])
    return dequantize(picked, qtype).astype(np.float32, copy=False).reshape(-1, cols)


class _Reader:
    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _Truncated()
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise _Truncated()
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool = True):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, n = self.take("<I"), self.take("<Q")
            if itype in _SCALARS and itype != 7:
                size = struct.calcsize(_SCALARS[itype]) * n
                if self.pos + size > len(self.buf):
                    raise _Truncated()
                self.pos += size
                return n
            for _ in range(n):
                self.value(itype, keep=False)
            return n
        raise _Corrupt(f"unknown metadata value type {vtype}")


class _Truncated(Exception):
    pass


class _Corrupt(Exception):
    pass


@dataclass(frozen=True)
class Vocabulary:
    size: int             # entries of tokenizer.ggml.tokens
    fingerprint: str      # hash of the tokenizer model and token texts (ngram_store.vocab_key)

    def describe(self) -> str:
        return f"{self.size} tokens, fingerprint {self.fingerprint[:12]}"


def header_vocabulary(buf, name: str) -> Vocabulary | None:
    """The vocabulary of a GGUF from its first bytes (the whole file or a Range request's worth);
    None when `buf` ends before the token list does. Raises LocalspecError for a non-GGUF."""
    if len(buf) >= 4 and bytes(buf[:4]) != b"GGUF":
        raise LocalspecError("Not a GGUF model file",
                             f"'{name}' starts with {bytes(buf[:4])!r}, not the GGUF magic b'GGUF'",
                             "Pick a .gguf file (localspec runs GGUF models)")
    r = _Reader(buf, Path(name))
    found: dict[str, bytes] = {}
    size = 0
    try:
        r.pos = 4 + 4 + 8                      # magic, version, tensor count
        for _ in range(r.take("<Q")):
            key = r.string()
            vtype = r.take("<I")
            start = r.pos
            value = r.value(vtype)
            if key in _VOCAB_KEYS:
                found[key] = bytes(buf[start:r.pos])
                if key == "tokenizer.ggml.tokens":
                    size = int(value)
                if len(found) == len(_VOCAB_KEYS):
                    break
    except _Truncated:
        return None
    except _Corrupt as err:
        raise LocalspecError("Model file is corrupt", f"'{name}': {err}", _fix_for(Path(name))) from None
    digest = hashlib.sha256(b"localspec-vocab-v1\0")
    for key in _VOCAB_KEYS:
        digest.update(key.encode() + b"\0" + found.get(key, b"") + b"\0")
    return Vocabulary(size, digest.hexdigest()[:32])


def file_vocabulary(path: str | Path) -> Vocabulary:
    """The vocabulary of a complete, validated GGUF file (read_gguf first)."""
    path = Path(path).expanduser()
    read_gguf(path)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        vocab = header_vocabulary(buf, str(path))
    assert vocab is not None, "read_gguf accepted a file whose header is cut"
    return vocab


def token_texts(path: str | Path) -> list[str]:
    """The token strings of a validated GGUF, by id (tokenizer.ggml.tokens)."""
    path = Path(path).expanduser()
    read_gguf(path)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = _Reader(buf, path)
        r.pos = 4 + 4 + 8
        for _ in range(r.take("<Q")):
            key = r.string()
            vtype = r.take("<I")
            if key == "tokenizer.ggml.tokens" and vtype == _ARRAY:
                itype, n = r.take("<I"), r.take("<Q")
                if itype == _STRING:
                    return [r.string() for _ in range(n)]
                raise LocalspecError("Model file is corrupt", f"'{path}': tokens are not strings",
                                     _fix_for(path))
            r.value(vtype)
    return []


def _fix_for(path: Path) -> str:
    return (f"Re-download the model (localspec pull NAME) or point --model at a complete .gguf "
            f"file; '{path}' cannot be used")


def read_gguf(path: str | Path, require_vocab: bool = True) -> GGUFInfo:
    """Validate `path` as a complete GGUF file; raise LocalspecError naming the problem.
    `require_vocab=False` for the later parts of a split model (only the first carries the
    tokenizer)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise LocalspecError("Model file not found", f"'{path}' does not exist",
                             "Check the path, or run: localspec pull qwen2.5-coder-1.5b")
    if not path.is_file():
        raise LocalspecError("Model path is not a file", f"'{path}' is a directory or special file",
                             "Pass the .gguf file itself")
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(4)
        if head != b"GGUF":
            raise LocalspecError("Not a GGUF model file",
                                 f"'{path}' starts with {head!r}, not the GGUF magic b'GGUF'",
                                 "localspec runs GGUF models; convert it with llama.cpp's "
                                 "convert_hf_to_gguf.py or download a .gguf file")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _parse(_Reader(buf, path), size, require_vocab)
            except _Truncated:
                raise LocalspecError("Model file is truncated",
                                     f"'{path}' ends inside its header ({size} bytes)",
                                     _fix_for(path)) from None
            except _Corrupt as err:
                raise LocalspecError("Model file is corrupt", f"'{path}': {err}",
                                     _fix_for(path)) from None


def _parse(r: _Reader, size: int, require_vocab: bool = True) -> GGUFInfo:
    r.pos = 4
    version = r.take("<I")
    if version not in (2, 3):
        raise _Corrupt(f"unsupported GGUF version {version}")
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    meta: dict = {}
    vocab = 0
    for _ in range(n_kv):
        key = r.string()
        vtype = r.take("<I")
        value = r.value(vtype)
        if vtype != _ARRAY:
            meta[key] = value
        elif key in _KEEP_ARRAY_LEN:
            vocab = int(value)
    alignment = int(meta.get("general.alignment", 32))
    end = 0
    tensors = {}
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.take("<I")
        if n_dims > 8:
            raise _Corrupt(f"tensor '{name}' claims {n_dims} dimensions")
        dims = tuple(r.take("<Q") for _ in range(n_dims))
        n_elems = 1
        for d in dims:
            n_elems *= d
        ttype, offset = r.take("<I"), r.take("<Q")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise _Corrupt(f"tensor '{name}' has unknown type {ttype}") from None
        end = max(end, offset + n_elems // block * type_size)
        tensors[name] = (dims, ttype, offset)
    data_start = -(-r.pos // alignment) * alignment
    tensors = {k: (dims, ttype, data_start + off) for k, (dims, ttype, off) in tensors.items()}
    data_end = data_start + end
    info = GGUFInfo(path=r.path, version=version, architecture=str(meta.get("general.architecture", "")),
                    n_tensors=n_tensors, vocab_size=vocab, data_end=data_end, file_size=size,
                    metadata=meta, tensors=tensors)
    if size < data_end:
        raise LocalspecError("Model file is truncated",
                             f"'{r.path}' has {size:,} bytes but its tensors need {data_end:,} "
                             f"({data_end - size:,} missing; an interrupted download?)",
                             _fix_for(r.path))
    if vocab == 0 and require_vocab:
        raise _Corrupt("no tokenizer vocabulary (tokenizer.ggml.tokens) in its metadata")
    return info
