"""Hostile draft-head files: each is refused by `localspec generate --head` within BOUND with one
LocalspecError (exit 2, "Not a usable draft head", the fix naming `localspec head train`, no
traceback), before anything sized by the file's own claims is allocated, and the file is left as
it was."""
from __future__ import annotations

import hashlib
import io
import os
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from localspec.models.head_file import read_head, save_head

BOUND = 30.0   # seconds, start to exit (the CLI loads the tiny target and torch first)


def _rewrite(good: Path, out: Path, *, meta: dict | None = None, **arrays) -> None:
    old_meta, old = read_head(good)
    old.update(arrays)
    vocab = old.pop("vocab")
    m = {k: v for k, v in (meta if meta is not None else old_meta).items() if k != "format"}
    save_head(out, old, vocab, m)


def _meta_not_json(good: Path, out: Path) -> None:
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "meta.npy":
                buf = io.BytesIO()
                np.save(buf, np.array("{not json"))
                data = buf.getvalue()
            dst.writestr(item, data)


def _huge_claim(good: Path, out: Path) -> None:
    """A zip entry claiming 3 GiB unpacked (its directory entry lies; nothing that big is written)."""
    out.write_bytes(good.read_bytes())
    with zipfile.ZipFile(out, "a") as z:
        info = zipfile.ZipInfo("w_big.npy")
        z.writestr(info, b"x")
    raw = bytearray(out.read_bytes())
    at = raw.rfind(b"PK\x01\x02")                  # the last central-directory entry: w_big.npy
    raw[at + 24:at + 28] = (3 << 30).to_bytes(4, "little")   # its uncompressed size
    out.write_bytes(bytes(raw))


def _old_format(good: Path, out: Path) -> None:
    """A head of the format before the attention layer (its meta says so)."""
    with np.load(good) as z:
        arrays = {k: z[k] for k in z.files if k != "meta"}
        meta = json.loads(str(z["meta"]))
    np.savez(out, **arrays, meta=np.array(json.dumps({**meta, "format": "localspec-head-1"})))


def _shape(good: Path, out: Path, **change) -> None:
    meta, _ = read_head(good)
    _rewrite(good, out, meta={**meta, "shape": {**meta["shape"], **change}})


CASES = {
    "truncated": (lambda g, o: o.write_bytes(g.read_bytes()[:4000]), "cannot read it"),
    "not-a-zip": (lambda g, o: o.write_bytes(b"\x93NUMPY" + b"\0" * 200), "cannot read it"),
    "meta-not-json": (_meta_not_json, "cannot read it"),
    "old-format": (_old_format, "trained again"),
    "no-shape": (lambda g, o: _rewrite(g, o, meta={k: v for k, v in read_head(g)[0].items() if k != "shape"}),
                 "no layer shape"),
    "shape-claims-a-huge-mlp": (lambda g, o: _shape(g, o, ff=10 ** 9), "its shape says"),
    "shape-negative": (lambda g, o: _shape(g, o, heads=-2), "not positive integers"),
    "taps-not-layer-numbers": (lambda g, o: _shape(g, o, taps="2,14"), "not a list of layer numbers"),
    "taps-without-their-weights": (lambda g, o: _shape(g, o, taps=[1, 2]), "has no w_taps"),
    "taps-past-the-target": (lambda g, o: _shape(g, o, taps=[99]), "has 4 layers"),
    "array-of-another-shape": (lambda g, o: _rewrite(g, o, w_up=np.zeros((3, 3), np.float16)), "array w_up"),
    "array-of-strings": (lambda g, o: _rewrite(g, o, norm=np.array(["a"] * 128)), "not floats"),
    "vocab-past-the-target": (lambda g, o: _rewrite(g, o, vocab=np.array([1, 2, 10 ** 6], np.int32)),
                              "ascending token ids"),
    "vocab-unsorted": (lambda g, o: _rewrite(g, o, vocab=np.array([5, 3, 9], np.int32)), "ascending token ids"),
    "arrays-claim-3-gib": (_huge_claim, "GiB"),
    "weights-nan": (lambda g, o: _rewrite(g, o, norm=np.full(128, np.nan, np.float16)), "not finite"),
    "another-target": (lambda g, o: _rewrite(g, o, meta={**read_head(g)[0], "target_id": "feedfacefeedface"}),
                       "another target"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_head_file_is_refused_with_the_fix(tiny, tiny_head, tmp_path, case):
    make, cause = CASES[case]
    bad = tmp_path / "bad.npz"
    make(tiny_head, bad)
    before = hashlib.sha256(bad.read_bytes()).hexdigest()
    t = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "localspec.app.cli", "generate", "--model", str(tiny.target_gguf),
                          "--head", str(bad), "--ctx", "256", "--max-tokens", "4", "--raw", "def f():"],
                         capture_output=True, text=True, timeout=120)
    assert time.monotonic() - t < BOUND
    assert run.returncode == 2, run.stderr
    assert "Not a usable draft head" in run.stderr and "localspec head train" in run.stderr, run.stderr
    assert cause in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert hashlib.sha256(bad.read_bytes()).hexdigest() == before


def test_the_good_head_file_passes_the_same_checks(tiny, tiny_head):
    """The cases above are refused for what they break, not for something every file has."""
    from localspec.engine.drafters.head_net import shape_problem

    meta, arrays = read_head(tiny_head)
    assert shape_problem(meta, arrays, 128, tiny.vocab_size) is None
    assert json.loads(json.dumps(meta))["shape"]["d"] == 128


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_an_installed_head_with_weights_not_finite_names_no_head(tiny, tiny_head, tmp_path, value):
    """A head whose weights hold NaN or inf drafts nothing useful and broke every command for its
    model: it is refused at load (every array checked once) with a fix naming --no-head, and
    --no-head runs."""
    from localspec.models.heads import default_head_path

    data = tmp_path / "data"
    installed = default_head_path(tiny.target_gguf, data)
    installed.parent.mkdir(parents=True)
    _, arrays = read_head(tiny_head)
    w_up = arrays["w_up"].copy()
    w_up[3, 5] = value
    _rewrite(tiny_head, installed, w_up=w_up)
    env = dict(os.environ, LOCALSPEC_DATA_DIR=str(data))
    args = [sys.executable, "-m", "localspec.app.cli", "generate", "--model", str(tiny.target_gguf),
            "--ctx", "256", "--max-tokens", "4", "--raw", "def f():"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 2, run.stderr
    assert "Not a usable draft head" in run.stderr and "not finite" in run.stderr, run.stderr
    assert "--no-head" in run.stderr and "localspec head train" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    run = subprocess.run([*args, "--no-head"], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
