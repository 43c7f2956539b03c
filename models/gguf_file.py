"""Check a GGUF file before llama.cpp sees it.

llama.cpp answers a truncated or foreign file with a NULL model at best and a GGML_ASSERT that kills
the process at worst, so localspec reads the header itself: the magic, the metadata, and the tensor
table, from which the end of the tensor data follows. A file shorter than that is truncated.
Reading needs no tensor data, so it costs a fraction of a second even for a multi-GB model, and
no header can make it cost more: every count and length is checked against the bytes that remain
(and a sane maximum) before it drives a loop, fixed-size arrays are skipped in one step, and what
llama.cpp would abort on or read past (a tokenizer array of the wrong type or length, a bad
alignment, a misplaced tensor) is refused here with its cause.
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


from localspec.models.errors import LocalspecError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U32, _I32, _F32 = 4, 5, 6
_U64 = struct.Struct("<Q")
# Bounds that make reading any header cheap. Each is far above what a real model has (tens of
# metadata keys, a few thousand tensors, a tokenizer of at most a few hundred thousand tokens and
# as many merges), and together they keep the worst header a short walk in Python.
_MAX_KV = 1 << 16
_MAX_TENSORS = 1 << 18
_MAX_STRINGS = 1 << 23        # strings walked in all metadata arrays together
# A count or length claiming more bytes than this is corruption, not a cut-short download.
_PLAUSIBLE_BYTES = 1 << 48
_MIN_KV_BYTES = 8 + 1 + 4 + 1          # key length, a 1-byte key, value type, a 1-byte value
_MIN_TENSOR_BYTES = 8 + 1 + 4 + 4 + 8  # name length, a 1-byte name, n_dims, type, offset
# What llama.cpp's GGUF reader allows (GGML_MAX_DIMS, GGML_MAX_NAME - 1, int64 element counts).
_MAX_DIMS, _MAX_NAME, _MAX_ELEMENTS = 4, 63, (1 << 63) - 1
# Tokenizer arrays llama.cpp indexes by token id without checking their type or length: a wrong
# one aborts it (GGML_ASSERT) or reads past the array.
_PER_TOKEN = {"tokenizer.ggml.scores": _F32, "tokenizer.ggml.token_type": _I32}
_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32",
               6: "float32", 7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64",
               12: "float64"}
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
    data_start: int        # where the tensor data begins: the header and its padding come before
    metadata: dict         # scalar and string metadata
    # name -> (shape, innermost first as in GGUF; ggml type; absolute offset of its data)
    tensors: dict = field(default_factory=dict)

    @property
    def n_layer(self) -> int | None:
        """The architecture's layer count (`ARCH.block_count`), or None where the header does not
        say it."""
        n = self.metadata.get(f"{self.architecture}.block_count")
        return n if isinstance(n, int) and n > 0 else None


# A model's fingerprint: what a draft head is trained for is the model's weights, but a start-up
# cannot hash gigabytes. The header (every metadata key and value, the tokenizer's arrays included,
# and every tensor's name, shape, type and offset) fixes the architecture, the vocabulary, the
# quantisation and the layout of the weights; files that share it and differ in their weights
# (fine-tunes converted with the same metadata) are told apart by a few KiB read at evenly spaced
# points of the data section. The bytes are hashed as they are rather than the parsed values: the
# parser keeps arrays only as their type and length, and bytes need no canonical form.
_FINGERPRINT_SAMPLES = 16
_FINGERPRINT_SAMPLE_BYTES = 4096


def fingerprint(info: GGUFInfo) -> str:
    """A short stable id (16 hex digits of a sha256) of a validated GGUF's weights (read_gguf
    first): its header bytes up to the tensor data, samples of that data, and its part count (a
    split model is fingerprinted by its first part). A copy of the file has the same id."""
    parts = info.metadata.get("split.count", 1)
    digest = hashlib.sha256(b"localspec-model-v1\0")
    span = info.data_end - info.data_start
    with info.path.open("rb") as fh:
        left = info.data_start
        while left > 0:                            # the header: megabytes with a large vocabulary
            chunk = fh.read(min(left, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
        for i in range(_FINGERPRINT_SAMPLES if span > 0 else 0):
            at = info.data_start + span * i // _FINGERPRINT_SAMPLES
            fh.seek(at)
            digest.update(fh.read(min(_FINGERPRINT_SAMPLE_BYTES, info.data_end - at)))
    digest.update(f"\0parts {parts}".encode())
    return digest.hexdigest()[:16]


def tensor_rows(info: GGUFInfo, name: str, rows=None):
    """Rows of a 2-D tensor (all, or the ids in `rows`) as float32 [n, cols], dequantised from the
    file (memory-mapped: only the rows asked for are read)."""
    import numpy as np
    from gguf.quants import dequantize

    shape, ttype, offset = info.tensors[name]
    cols = shape[0]
    n_rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
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
    """Reads the header in place. Every count and length is checked against the bytes that remain
    before anything is read or looped over, so the work is bounded by the file, never by a claim
    in it; arrays of fixed-size values are skipped in one step, arrays of strings walk their
    length prefixes only."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path
        self.strings = 0          # strings walked so far (the _MAX_STRINGS budget)

    def need(self, n_bytes: int, what: str) -> None:
        """Raise unless `n_bytes` more bytes are there for `what`."""
        left = len(self.buf) - self.pos
        if n_bytes > _PLAUSIBLE_BYTES:
            raise _Corrupt(f"{what} claims {n_bytes:,} bytes, more than any model file holds")
        if n_bytes > left:
            raise _Truncated(f"{what} needs {n_bytes:,} bytes but only {left:,} remain")

    def take(self, fmt: str, what: str = "the header"):
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str = "a string") -> str:
        n = self.take("<Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, n: int, what: str) -> None:
        """Step over `n` strings reading only their length prefixes."""
        self.need(8 * n, what)                     # each string has at least its length
        self.strings += n
        if self.strings > _MAX_STRINGS:
            raise _Corrupt(f"{what} brings the header to {self.strings:,} strings; "
                           f"no model's tokenizer has more than {_MAX_STRINGS:,}")
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        try:
            for _ in range(n):
                pos += 8 + unpack(buf, pos)[0]
        except (struct.error, OverflowError):      # a length prefix past the end, or a huge one
            pos = len(buf) + 1
        if pos > len(buf):
            raise _Truncated(f"{what} runs past the end of the file")
        self.pos = pos

    def value(self, vtype: int, what: str):
        """A metadata value: a scalar or string as read; an array as (item type, count)."""
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            itype, n = self.take("<I", what), self.take("<Q", what)
            if itype in _SCALARS:
                self.need(struct.calcsize(_SCALARS[itype]) * n, what)
                self.pos += struct.calcsize(_SCALARS[itype]) * n
            elif itype == _STRING:
                self.skip_strings(n, what)
            else:    # llama.cpp reads no arrays of arrays
                raise _Corrupt(f"{what} is an array of {_type_name(itype)} values")
            return _Array(itype, n)
        raise _Corrupt(f"{what} has unknown value type {vtype}")


def _quote(text: str) -> str:
    """A key or tensor name for a message: a corrupt one can be megabytes of control bytes."""
    return repr(text if len(text) <= 60 else text[:60] + "…")


def _type_name(vtype: int) -> str:
    return _TYPE_NAMES.get(vtype, f"unknown type {vtype}")


@dataclass(frozen=True)
class _Array:
    item_type: int
    count: int


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
        n_kv = r.take("<Q", "the metadata count")
        if n_kv > _MAX_KV:
            raise _Corrupt(f"the header claims {n_kv:,} metadata entries; no model has more than "
                           f"{_MAX_KV:,}")
        for _ in range(n_kv):
            key = r.string("a metadata key")
            vtype = r.take("<I", f"metadata {_quote(key)}")
            start = r.pos
            value = r.value(vtype, f"metadata {_quote(key)}")
            if key in _VOCAB_KEYS:
                found[key] = bytes(buf[start:r.pos])
                if key == "tokenizer.ggml.tokens" and vtype == _ARRAY:
                    size = value.count
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
            if key == "tokenizer.ggml.tokens":     # read_gguf checked: an array of strings
                r.take("<I")                  # the item type
                return [r.string() for _ in range(r.take("<Q"))]
            r.value(vtype, key)
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
            except _Truncated as err:
                raise LocalspecError("Model file is truncated",
                                     f"'{path}' ends inside its header ({size:,} bytes): {err}",
                                     _fix_for(path)) from None
            except _Corrupt as err:
                raise LocalspecError("Model file is corrupt", f"'{path}': {err}",
                                     _fix_for(path)) from None


def _parse(r: _Reader, size: int, require_vocab: bool = True) -> GGUFInfo:
    r.pos = 4
    version = r.take("<I", "the version")
    if version not in (2, 3):
        raise _Corrupt(f"unsupported GGUF version {version}")
    n_tensors, n_kv = r.take("<Q", "the tensor count"), r.take("<Q", "the metadata count")
    _check_count(r, n_kv, _MAX_KV, _MIN_KV_BYTES, "metadata entries")
    meta: dict = {}                  # scalars and strings
    arrays: dict[str, _Array] = {}
    types: dict[str, int] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key {i}")
        if not key or key in types:
            raise _Corrupt(f"metadata key {i} is {'empty' if not key else f'a second {_quote(key)}'}")
        types[key] = vtype = r.take("<I", f"metadata {_quote(key)}")
        value = r.value(vtype, f"metadata {_quote(key)}")
        if vtype == _ARRAY:
            arrays[key] = value
        else:
            meta[key] = value
    alignment = _alignment(meta, types)
    vocab = _vocabulary(meta, arrays, types, require_vocab)
    _check_count(r, n_tensors, _MAX_TENSORS, _MIN_TENSOR_BYTES, "tensors")
    end = expected = 0
    tensors = {}
    for i in range(n_tensors):
        name, dims, ttype, offset, nbytes = _tensor_info(r, i, tensors)
        if offset != expected:       # llama.cpp wants the tensors packed in order, each aligned
            raise _Corrupt(f"tensor {_quote(name)} starts at data offset {offset:,}, expected {expected:,}")
        expected += -(-nbytes // alignment) * alignment
        end = offset + nbytes
        tensors[name] = (dims, ttype, offset)
    data_start = -(-r.pos // alignment) * alignment
    tensors = {k: (dims, ttype, data_start + off) for k, (dims, ttype, off) in tensors.items()}
    data_end = data_start + end
    info = GGUFInfo(path=r.path, version=version, architecture=str(meta.get("general.architecture", "")),
                    n_tensors=n_tensors, vocab_size=vocab, data_end=data_end, file_size=size,
                    data_start=data_start, metadata=meta, tensors=tensors)
    if size < data_end:
        raise LocalspecError("Model file is truncated",
                             f"'{r.path}' has {size:,} bytes but its tensors need {data_end:,} "
                             f"({data_end - size:,} missing; an interrupted download?)",
                             _fix_for(r.path))
    return info


def _check_count(r: _Reader, n: int, most: int, min_bytes: int, what: str) -> None:
    """A count is checked before the loop it drives: against a sane maximum and the bytes left."""
    if n > most:
        raise _Corrupt(f"the header claims {n:,} {what}; no model has more than {most:,}")
    r.need(n * min_bytes, f"the header's {n:,} {what}")


def _alignment(meta: dict, types: dict[str, int]) -> int:
    if "general.alignment" not in types:
        return 32
    alignment = meta.get("general.alignment")
    if types["general.alignment"] != _U32 or alignment == 0 or alignment & (alignment - 1):
        raise _Corrupt(f"general.alignment must be a power of two stored as uint32, it is "
                       f"{alignment!r} ({_type_name(types['general.alignment'])})")
    return alignment


def _vocabulary(meta: dict, arrays: dict[str, _Array], types: dict[str, int],
                require_vocab: bool) -> int:
    """The token count, after checking what llama.cpp trusts: the tokens are strings, the
    per-token arrays have an entry of the right type for every token, the merges are strings."""
    tokens = arrays.get("tokenizer.ggml.tokens")
    if "tokenizer.ggml.tokens" not in types:
        if require_vocab:
            raise _Corrupt("no tokenizer vocabulary (tokenizer.ggml.tokens) in its metadata")
        return 0
    if tokens is None or tokens.item_type != _STRING:
        raise _Corrupt("tokenizer.ggml.tokens is not an array of strings")
    if require_vocab and not isinstance(meta.get("general.architecture"), str):
        raise _Corrupt("general.architecture is missing or not a string")
    for key, itype in _PER_TOKEN.items():
        if key in types:
            got = arrays.get(key)
            if got is None or got.item_type != itype or got.count < tokens.count:
                shown = (f"{got.count:,} {_type_name(got.item_type)} values" if got is not None
                         else f"a single {_type_name(types[key])}")
                raise _Corrupt(f"{key} must hold one {_type_name(itype)} per token "
                               f"({tokens.count:,}); it holds {shown}")
    merges = arrays.get("tokenizer.ggml.merges")
    if "tokenizer.ggml.merges" in types and (merges is None or merges.item_type != _STRING):
        raise _Corrupt("tokenizer.ggml.merges is not an array of strings")
    return tokens.count


def _tensor_info(r: _Reader, i: int, seen: dict) -> tuple[str, tuple[int, ...], int, int, int]:
    """One tensor's (name, dims, ggml type, data offset, bytes), checked as llama.cpp checks it."""
    name = r.string(f"tensor name {i}")
    what = f"tensor {_quote(name)}"
    if len(name.encode()) > _MAX_NAME or name in seen:
        raise _Corrupt(f"{what} {'is a second tensor of that name' if name in seen else 'has too long a name'}")
    n_dims = r.take("<I", what)
    if n_dims > _MAX_DIMS:
        raise _Corrupt(f"{what} claims {n_dims} dimensions (at most {_MAX_DIMS})")
    dims = tuple(r.take("<Q", what) for _ in range(n_dims))
    n_elems = 1
    for d in dims:
        n_elems *= d
    if n_elems > _MAX_ELEMENTS or any(d > _MAX_ELEMENTS for d in dims):
        raise _Corrupt(f"{what} has shape {dims}: too many elements")
    ttype, offset = r.take("<I", what), r.take("<Q", what)
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType   # imports numpy: not at module level
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    except (ValueError, KeyError):
        raise _Corrupt(f"{what} has unknown type {ttype}") from None
    if dims and dims[0] % block:
        raise _Corrupt(f"{what} has rows of {dims[0]} elements, not a multiple of its type's "
                       f"block of {block}")
    return name, dims, ttype, offset, n_elems // block * type_size
