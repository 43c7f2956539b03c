"""The draft head's file: a .npz of its weights, its draft vocabulary and a JSON meta.

Arrays (float16 unless said): w_in [d, 2d]; the decoder layer's attn_norm [d], wq [H*hd, d],
wk and wv [KVH*hd, d], wo [d, H*hd], mlp_norm [d], w_gate and w_up [ff, d], w_down [d, ff];
norm [d]; vocab [V_sub] (target token ids, ascending, int32); a head that reads the target's
layers beside its last (the shape's "taps": layer indices, EAGLE-3's fused features) also
w_taps [d, d*taps]. meta: format, n_embd, the layer's shape ("shape": heads, kv_heads,
head_dim, ff, taps), the target's vocabulary size, file name and
fingerprint ("target_id"), what it was trained on and how well it guessed
(engine/drafters/head.py runs it, engine/head_train.py writes it). Reading needs numpy only, so
`localspec head info` and `localspec list` do not load torch.
"""
from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from localspec.models.errors import LocalspecError
from localspec.models.own_files import Unreadable, open_regular, parse_json

FORMAT = "localspec-head-2"   # 2: one attention layer over the head's own past (1: no attention)
# A head's arrays, unpacked: ~80 MB for the reference target's shape, ~0.6 GB for an 8B one; a
# file claiming far more is refused before anything is read into memory (a .npz is a zip: its
# entries say their sizes).
MAX_HEAD_BYTES = 2 << 30
# the file itself: those arrays stored uncompressed (np.savez) behind their zip and .npy headers
MAX_HEAD_FILE_BYTES = MAX_HEAD_BYTES + (64 << 20)
ARRAYS = ("w_in", "attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down", "norm")
OPTIONAL = ("w_taps",)   # a head with taps only


def save_head(path: Path, arrays: dict[str, np.ndarray], vocab: np.ndarray, meta: dict) -> None:
    """Write the head atomically (a temporary file renamed over `path`)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays, vocab=np.asarray(vocab, np.int32),
                 meta=np.array(json.dumps({"format": FORMAT, **meta})))
    tmp.replace(path)


def bad_head(path: Path, why: str) -> LocalspecError:
    return LocalspecError("Not a usable draft head", f"'{path}': {why}",
                          "Train one for this target with `localspec head train` "
                          "(or pass the head file made for this target)")


def read_meta(path: Path) -> dict:
    """A head file's meta alone (what `localspec list` and `head info` show)."""
    return read_head(path, arrays=False)[0]


def read_head(path: Path, arrays: bool = True) -> tuple[dict, dict[str, np.ndarray]]:
    """A head file's meta (checked to be this format) and arrays; a clear error for anything else."""
    try:
        with open_regular(path) as fh:     # a regular file only (models/own_files.py)
            return _read_open(path, fh, arrays)
    except Unreadable as err:
        raise bad_head(path, err.why) from None
    except OSError as err:                 # missing: the same words as any unreadable head
        raise bad_head(path, f"cannot read it ({type(err).__name__}: {err})") from err


def _read_open(path: Path, fh, arrays: bool) -> tuple[dict, dict[str, np.ndarray]]:
    try:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_HEAD_FILE_BYTES:
            raise bad_head(path, f"it is {size / 2**30:.1f} GiB "
                                 f"(a head takes well under {MAX_HEAD_BYTES >> 30} GiB)")
        with zipfile.ZipFile(fh) as zf:
            unpacked = sum(i.file_size for i in zf.infolist())
        if unpacked > MAX_HEAD_BYTES:
            raise bad_head(path, f"its arrays would take {unpacked / 2**30:.1f} GiB "
                                 f"(a head takes well under {MAX_HEAD_BYTES >> 30} GiB)")
        fh.seek(0)
        with np.load(fh, allow_pickle=False) as z:
            meta = parse_json(path, str(z["meta"]))
            if not isinstance(meta, dict):
                raise ValueError("its meta is not a JSON object")
            if meta.get("format") != FORMAT:
                raise bad_head(path, f"format {meta.get('format')!r}, expected {FORMAT!r} "
                                     "(heads made before the attention head must be trained again)")
            out = {k: z[k] for k in (*ARRAYS, "vocab", *(o for o in OPTIONAL if o in z.files))} if arrays else {}
    except Unreadable as err:
        raise bad_head(path, f"cannot read it (its meta {err.why})") from None
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError, zipfile.BadZipFile,
            EOFError) as err:   # .npy: np.load gives an array, which has no ["meta"]
        raise bad_head(path, f"cannot read it ({type(err).__name__}: {err})") from err
    return meta, out
