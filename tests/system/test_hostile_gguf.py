"""Hostile GGUF headers: a seeded fuzzer over the tiny models' headers and metadata.

Every mutant (types, counts, lengths, alignment, architecture, tensor shapes and offsets, huge
arrays such as 2^62 bools, truncation, flipped bytes) is either refused by `read_gguf` with a
LocalspecError or accepted as still valid, never another exception, within CASE_SECONDS each.
A sample goes through `localspec generate`: exit 0 (still a model) or 2 with title/cause/fix,
no traceback, the file unchanged, within CLI_SECONDS.
"""
from __future__ import annotations

import hashlib
import random
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from localspec.engine.errors import LocalspecError
from localspec.models.gguf_file import header_vocabulary, read_gguf

CASE_SECONDS = 2.0      # the validator, per mutant (it reads the header only)
CLI_SECONDS = 30.0      # `localspec generate` on a mutant, start to exit, on a loaded 2-core box
BIG = (2**62, 2**63, 2**64 - 1, 2**31, 2**40)
SEED = 20


@dataclass(frozen=True)
class Layout:
    """Where the fields of a GGUF header sit (absolute offsets), to aim mutations at them."""

    n_tensors_at: int
    n_kv_at: int
    kv: tuple[tuple[str, int, int, int], ...]   # (key, key-length offset, type offset, value offset)
    arrays: tuple[tuple[str, int, int], ...]    # (key, item-type offset, count offset)
    strings: tuple[int, ...]                    # length prefixes of keys and string values
    tensors: tuple[tuple[str, int, int, int], ...]  # (name, n_dims offset, type offset, offset offset)
    data_start: int


def layout(data: bytes) -> Layout:
    pos = 24
    kv, arrays, strings, tensors = [], [], [], []

    def string() -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        strings.append(pos)
        pos += 8 + n
        return data[pos - n:pos].decode()

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    for _ in range(struct.unpack_from("<Q", data, 16)[0]):
        key_at = pos
        key = string()
        type_at = pos
        (vtype,) = struct.unpack_from("<I", data, pos)
        pos += 4
        value_at = pos
        kv.append((key, key_at, type_at, value_at))
        if vtype == 8:
            string()
        elif vtype == 9:
            itype, n = struct.unpack_from("<IQ", data, pos)
            arrays.append((key, pos, pos + 4))
            pos += 12
            if itype == 8:
                for _ in range(n):
                    string()
            else:
                pos += sizes[itype] * n
        else:
            pos += sizes[vtype]
    for _ in range(struct.unpack_from("<Q", data, 8)[0]):
        name = string()
        n_dims_at = pos
        (n_dims,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * n_dims
        tensors.append((name, n_dims_at, pos, pos + 4))
        pos += 12
    return Layout(8, 16, tuple(kv), tuple(arrays), tuple(strings), tuple(tensors), pos)


def put(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def with_kv(data: bytes, lay: Layout, key: str, body: bytes, keep_aligned: bool = False) -> bytes:
    """`data` with one more metadata entry (key, then `body`: its type and value) put first;
    keep_aligned: the key padded with '_' so that the tensor data keeps its 32-byte alignment."""
    if keep_aligned:
        key += "_" * (-(8 + len(key) + len(body)) % 32)
    entry = struct.pack("<Q", len(key)) + key.encode() + body
    out = data[:24] + entry + data[24:]
    return put(out, lay.n_kv_at, "<Q", struct.unpack_from("<Q", data, 16)[0] + 1)


def mutants(data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    lay = layout(data)
    out: list[tuple[str, bytes]] = []
    for value in (0, 1, 10_000, *BIG):
        out.append((f"tensor count {value}", put(data, lay.n_tensors_at, "<Q", value)))
        out.append((f"metadata count {value}", put(data, lay.n_kv_at, "<Q", value)))
    for key, _, type_at, _ in lay.kv:
        for vtype in rng.sample(range(16), 4):
            out.append((f"{key} as type {vtype}", put(data, type_at, "<I", vtype)))
    for key, itype_at, count_at in lay.arrays:
        for itype in (*rng.sample(range(16), 3), 7, 9):
            out.append((f"{key} items of type {itype}", put(data, itype_at, "<I", itype)))
        (count,) = struct.unpack_from("<Q", data, count_at)
        for n in (0, count - 1, count + 1, *BIG):
            out.append((f"{key} with {n} items", put(data, count_at, "<Q", n)))
    for at in rng.sample(lay.strings, 40):
        (n,) = struct.unpack_from("<Q", data, at)
        for value in (0, n + 1, rng.choice(BIG)):
            out.append((f"string at {at} of length {value}", put(data, at, "<Q", value)))
    for name, n_dims_at, type_at, offset_at in lay.tensors[:6]:
        for n_dims in (0, 3, 5, 2**32 - 1):
            out.append((f"{name} with {n_dims} dims", put(data, n_dims_at, "<I", n_dims)))
        for dim in (0, 3, 2**62, 2**63):
            out.append((f"{name} dim {dim}", put(data, n_dims_at + 4, "<Q", dim)))
        for ttype in (1, 2, 4, 12, 39, 2**31):
            out.append((f"{name} of type {ttype}", put(data, type_at, "<I", ttype)))
        (offset,) = struct.unpack_from("<Q", data, offset_at)
        for value in (offset + 1, offset + 32, 2**63):
            out.append((f"{name} at offset {value}", put(data, offset_at, "<Q", value)))
    for key, itype_at, count_at in lay.arrays:      # a shorter array, still well formed
        itype, count = struct.unpack_from("<IQ", data, itype_at)
        if itype == 5:
            end = count_at + 8 + 4 * count
            out.append((f"{key} one item short", put(data[:end - 4] + data[end:], count_at, "<Q",
                                                     count - 1)))
    bools = struct.pack("<IIQ", 9, 7, 2**62)
    out.append(("an array of 2^62 bools", with_kv(data, lay, "x.bools", bools)))
    out.append(("an array of 2^62 strings", with_kv(data, lay, "x.strs", struct.pack("<IIQ", 9, 8, 2**62))))
    out.append(("an array of arrays", with_kv(data, lay, "x.nested", struct.pack("<IIQ", 9, 9, 1))))
    out.append(("a duplicate key", with_kv(data, lay, "general.architecture",
                                           struct.pack("<IQ", 8, 5) + b"qwen2")))
    out.append(("an empty key", with_kv(data, lay, "", struct.pack("<IB", 0, 1))))
    for fmt, value in (("<II", 0), ("<II", 3), ("<II", 64), ("<II", 2**31), ("<IQ", 32)):
        vtype = 4 if fmt == "<II" else 10
        out.append((f"alignment {value} ({vtype})",
                    with_kv(data, lay, "general.alignment", struct.pack(fmt, vtype, value))))
    arch = next(v for k, _, _, v in lay.kv if k == "general.architecture")
    out.append(("architecture renamed", data[:arch + 8] + b"zzzzz" + data[arch + 13:]))
    out.append(("architecture as an int", put(data, arch - 4, "<I", 10)))
    header_end = lay.data_start
    for cut in sorted(rng.sample(range(4, header_end), 30)) + [header_end, len(data) - 1]:
        out.append((f"cut at {cut}", data[:cut]))
    for i in range(60):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(4, header_end)] = rng.randrange(256)
        out.append((f"flipped bytes #{i}", bytes(flipped)))
    return out


@pytest.fixture(scope="module")
def cases(tiny, tmp_path_factory) -> list[tuple[str, Path]]:
    data = Path(tiny.other_vocab_gguf).read_bytes()
    folder = tmp_path_factory.mktemp("mutants")
    out = []
    for i, (name, body) in enumerate(mutants(data, random.Random(SEED))):
        path = folder / f"m{i:04d}.gguf"
        path.write_bytes(body)
        out.append((name, path))
    return out


def test_every_mutant_is_refused_or_accepted_quickly(cases):
    refused = 0
    causes: dict[str, int] = {}
    for name, path in cases:
        t0 = time.perf_counter()
        try:
            read_gguf(path)
        except LocalspecError as err:
            refused += 1
            assert err.title and err.cause and err.fix, name
            assert err.title in ("Model file is truncated", "Model file is corrupt"), (name, err)
            causes[err.title] = causes.get(err.title, 0) + 1
        seconds = time.perf_counter() - t0
        assert seconds < CASE_SECONDS, (name, seconds)
        body = path.read_bytes()
        for prefix in (body, body[:65536]):      # as `pull` probes a remote file's first bytes
            t0 = time.perf_counter()
            try:
                header_vocabulary(prefix, name)
            except LocalspecError as err:
                assert err.title in ("Model file is corrupt", "Not a GGUF model file"), (name, err)
            assert time.perf_counter() - t0 < CASE_SECONDS, name
    assert len(cases) > 300 and refused > 0.8 * len(cases), (len(cases), refused)
    assert set(causes) == {"Model file is truncated", "Model file is corrupt"}


@pytest.mark.parametrize("mutation, needle", [
    ("an array of 2^62 bools", "'x.bools' claims 4,611,686,018,427,387,904 bytes"),
    ("an array of 2^62 strings", "'x.strs' claims"),
    ("an array of arrays", "'x.nested' is an array of array values"),
    ("a duplicate key", "a second 'general.architecture'"),
    ("alignment 3 (4)", "general.alignment must be a power of two"),
    ("alignment 32 (10)", "general.alignment must be a power of two stored as uint32"),
    ("tokenizer.ggml.token_type one item short", "must hold one int32 per token (300)"),
    ("tensor count 4611686018427387904", "no model has more than"),
])
def test_the_cause_is_named(cases, mutation, needle):
    path = dict(cases)[mutation]
    t0 = time.perf_counter()
    with pytest.raises(LocalspecError) as err:
        read_gguf(path)
    assert time.perf_counter() - t0 < CASE_SECONDS
    assert needle in err.value.cause, err.value.cause


def test_a_header_full_of_strings_is_walked_in_bulk(tmp_path, tiny):
    """The most expensive header there is: the largest string array allowed, each string empty.
    Reading it stays within the per-case bound."""
    data = Path(tiny.other_vocab_gguf).read_bytes()
    lay = layout(data)
    n = (1 << 23) - 4096            # the bound on strings, less the model's own tokens and merges
    body = struct.pack("<IIQ", 9, 8, n) + bytes(8 * n)
    path = tmp_path / "strings.gguf"
    path.write_bytes(with_kv(data, lay, "x.many", body, keep_aligned=True))
    t0 = time.perf_counter()
    read_gguf(path)                 # valid: the tensors' offsets are relative to the data start
    assert time.perf_counter() - t0 < CASE_SECONDS * 2
    path.write_bytes(with_kv(data, lay, "x.many", struct.pack("<IIQ", 9, 8, n + 4096) + bytes(8 * n + 8 * 4096)))
    with pytest.raises(LocalspecError, match="strings"):
        read_gguf(path)


CLI_SAMPLE = ("an array of 2^62 bools", "architecture renamed", "architecture as an int",
              "alignment 64 (4)", "a duplicate key", "tokenizer.ggml.token_type items of type 7",
              "tensor count 0", "metadata count 0")


def test_generate_on_mutants_ends_cleanly(cases, tmp_path):
    """`localspec generate --model MUTANT`: exit 2 with title/cause/fix (or 0 where the mutant
    is still a model), no traceback, the file unchanged. Accepted mutants all run, plus a
    sample of refused ones."""
    chosen = [(n, p) for n, p in cases if n in CLI_SAMPLE or _accepted(p)]
    chosen += random.Random(SEED).sample([c for c in cases if c not in chosen], 6)
    assert len(chosen) >= 10
    for name, path in chosen:
        before = hashlib.sha256(path.read_bytes()).hexdigest()
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "localspec.app.cli", "generate", "hi", "--raw",
                               "--model", str(path), "--max-tokens", "4", "--no-speculation",
                               "--no-personal", "--ctx", "128"],
                              capture_output=True, text=True, timeout=CLI_SECONDS * 2)
        seconds = time.perf_counter() - t0
        assert seconds < CLI_SECONDS, (name, seconds)
        assert proc.returncode in (0, 2), (name, proc.returncode, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr and "GGML_ASSERT" not in proc.stderr, (name, proc.stderr)
        if proc.returncode == 2:
            assert "fix:" in proc.stderr, (name, proc.stderr)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before, name


def _accepted(path: Path) -> bool:
    try:
        read_gguf(path)
    except LocalspecError:
        return False
    return True
