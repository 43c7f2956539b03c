"""Draft heads found for their target: the model fingerprint."""
from __future__ import annotations

import shutil

from localspec.models.gguf_file import fingerprint, read_gguf


def test_fingerprint_is_stable_for_a_copy_and_differs_between_models(tiny, tmp_path):
    target = fingerprint(read_gguf(tiny.target_gguf))
    assert len(target) == 16 and int(target, 16) >= 0
    copy = tmp_path / "renamed.gguf"
    shutil.copyfile(tiny.target_gguf, copy)
    assert fingerprint(read_gguf(copy)) == target == fingerprint(read_gguf(tiny.target_gguf))
    assert fingerprint(read_gguf(tiny.draft_gguf)) != target
    assert fingerprint(read_gguf(tiny.other_vocab_gguf)) not in (target, fingerprint(read_gguf(tiny.draft_gguf)))
    # the same header over other weights (a fine-tune converted alike): the sampled data tells them apart
    info = read_gguf(copy)
    raw = bytearray(copy.read_bytes())
    raw[info.data_start] ^= 0xFF
    copy.write_bytes(raw)
    assert fingerprint(read_gguf(copy)) != target
