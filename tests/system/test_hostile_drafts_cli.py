"""Hostile transformers drafts on the command line (issue 20): `generate --draft FOLDER` with a
draft of another vocabulary or a folder whose config claims absurd sizes ends with exit 2, a
title/cause/fix message, no traceback and no file of the folder or the data dir changed, within
`QUICK_S` (the target loads first; the draft is refused from its headers).
test_hostile_drafts.py covers every kind of broken folder through the API."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from test_hostile_cli import QUICK_S, assert_clean_error, run_cli, snapshot


def _absurd(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config |= {"hidden_size": 10**9, "num_hidden_layers": 10**6, "vocab_size": 10**12}
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("case", ["other-vocabulary", "absurd-sizes"])
def test_generate_with_a_hostile_draft_folder(tiny, tmp_path, case):
    if case == "other-vocabulary":
        folder, needles = Path(tiny.other_vocab_torch), ("Draft vocabulary does not match", "300")
    else:
        folder = tmp_path / "draft"
        shutil.copytree(tiny.draft_torch, folder)
        _absurd(folder)
        needles = ("Draft weights do not match config.json", "1000000 layers")
    data = Path(os.environ["LOCALSPEC_DATA_DIR"])
    before = snapshot(folder), snapshot(data)
    proc = run_cli("generate", "hi", "--model", str(tiny.target_gguf), "--draft", str(folder),
                   "--max-tokens", "4", timeout=QUICK_S)
    assert_clean_error(proc, *needles)
    assert proc.stdout == b""
    assert snapshot(folder) == before[0]
    # every file the data dir held is as it was; new ones are only the bookkeeping any start
    # makes before the draft is read (the model's lock files, the personal n-grams' empty
    # store): run alone, this test's data dir starts empty
    after = snapshot(data)
    assert {name: after.get(name) for name in before[1]} == before[1]
    made = {Path(name).relative_to(data).parent for name in set(after) - set(before[1])}
    assert made <= {Path("calibration/locks"), Path("ngrams")}, made


def test_import_refuses_a_tokenizer_json_past_its_cap(tiny, tmp_path):
    """Issue 45: the draft's tokenizer.json is read through models/own_files with a cap (a sparse
    1 GiB file was read whole)."""
    folder = tmp_path / "draft"
    shutil.copytree(tiny.draft_torch, folder)
    with (folder / "tokenizer.json").open("wb") as fh:
        fh.truncate(1 << 30)
    env = dict(os.environ, LOCALSPEC_DATA_DIR=str(tmp_path / "data"))
    proc = run_cli("import", "m", str(tiny.target_gguf), "--draft", str(folder), env=env, timeout=QUICK_S)
    assert_clean_error(proc, "The draft's tokenizer.json is unusable", "at most 64.0 MiB")
