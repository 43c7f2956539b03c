"""Draft heads found for their target: the model fingerprint, where heads are installed, the
automatic use with --head / --no-head over it, `head train` writing there by default, and
`localspec list` / `rm` showing and removing them. Every test has a data dir of its own: an
installed head would be picked up by every later session in the process."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pytest

from localspec.app import models_cmd
from localspec.engine.drafters.head_stage import with_head
from localspec.engine.config import TreeBudget
from localspec.engine.errors import LocalspecError
from localspec.engine.options import Options
from localspec.models import heads, library
from localspec.models.gguf_file import fingerprint, read_gguf
from localspec.models.head_file import ARRAYS, save_head


@pytest.fixture
def data(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "data"
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(root))
    return root


def install_head(tiny, head: Path) -> Path:
    """`head` installed for the tiny target in the test's data dir, as `head train` installs one;
    its path there."""
    installed = heads.default_head_path(tiny.target_gguf)
    installed.parent.mkdir(parents=True)
    shutil.copyfile(head, installed)
    return installed


def fake_head(path: Path, top1: float = 0.62) -> Path:
    """A head file `localspec list` can read (its meta is what counts; the weights are dummies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_head(path, {k: np.zeros((2, 2), np.float16) for k in ARRAYS}, np.arange(4),
              {"held_out_top1": [top1, 0.4], "target": "target.gguf"})
    return path


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


def test_heads_are_installed_by_the_targets_fingerprint(data, tiny, tmp_path):
    path = heads.default_head_path(tiny.target_gguf)
    assert path == data / "heads" / f"{fingerprint(read_gguf(tiny.target_gguf))}.npz"
    assert heads.head_for(tiny.target_gguf) is None
    fake_head(path)
    copy = tmp_path / "moved.gguf"
    shutil.copyfile(tiny.target_gguf, copy)
    assert heads.head_for(tiny.target_gguf) == path == heads.head_for(copy)   # the weights, not the path
    assert heads.head_for(tiny.draft_gguf) is None and heads.is_installed(path)
    assert not heads.is_installed(tmp_path / "mine.npz")


def test_the_installed_head_is_used_unless_another_or_none_is_asked_for(data, tiny, tmp_path):
    auto = Options(tiny.target_gguf, draft=tiny.draft_gguf)
    assert with_head(auto) == auto and with_head(auto).stages[-1] == "draft"   # nothing installed
    installed = fake_head(heads.default_head_path(tiny.target_gguf))
    assert with_head(auto).head == installed and with_head(auto).stages[-1] == "head"
    mine = tmp_path / "mine.npz"
    assert with_head(Options(tiny.target_gguf, head=mine)).head == mine           # --head
    off = Options(tiny.target_gguf, draft=tiny.draft_gguf, use_head=False)       # --no-head
    assert with_head(off) == off and off.stages[-1] == "draft"
    assert Options(tiny.target_gguf, head=mine, use_head=False).stages == ("maxgram", "personal")
    plain = Options(tiny.target_gguf, speculation=False)
    assert with_head(plain) == plain
    # still plain data: the resolved options go to the engine process as JSON
    assert Options.from_json(with_head(auto).to_json()).head == str(installed)


def test_an_installed_head_that_does_not_load_names_no_head_in_the_fix(data, tiny):
    from localspec.engine.session import Session

    broken = heads.default_head_path(tiny.target_gguf)
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a head")
    with pytest.raises(LocalspecError) as err:
        Session(Options(tiny.target_gguf, n_ctx=256, n_threads=1, personal=False))
    assert "Not a usable draft head" in err.value.title
    assert "--no-head" in err.value.fix and str(broken) in err.value.fix
    Session(Options(tiny.target_gguf, n_ctx=256, n_threads=1, personal=False, use_head=False)).close()


def test_a_trained_head_is_found_for_its_target_and_drafts(data, tiny, tiny_head):
    from localspec.engine.session import Session

    install_head(tiny, tiny_head)
    session = Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=256, n_threads=1,
                              maxgram=False, personal=False, budget=TreeBudget(8, adaptive=False)))
    try:
        assert [s.name for s in session.stages] == ["head"] and session.cfg.draft is None
        got = session.run(session.raw_prompt("def add_3(x):\n"), max_tokens=16)
    finally:
        session.close()
    assert sum(sum(s.proposed) for s in got.stats.stages if s.name == "head") > 0


@pytest.mark.parametrize("share", [0.0, 1e9])
def test_an_installed_head_drafts_only_where_its_step_costs_little_beside_the_models(
        data, tiny, tiny_head, monkeypatch, share):
    """The installed head's step, measured at load, against the target's calibrated one: over
    tuning.FREE_STEP_SHARE the head is left out, the target stops handing back hidden states and
    the run goes on without it, saying how to use it anyway; a head named with --head is used
    whatever its step costs."""
    from localspec.engine.session import Session

    from localspec.engine import tuning
    from localspec.engine.drafters import head as head_mod

    monkeypatch.setattr(tuning, "FREE_STEP_SHARE", share)
    measured = []
    timed = head_mod.head_costs
    monkeypatch.setattr(head_mod, "head_costs", lambda *a: measured.append(1) or timed(*a))
    installed = install_head(tiny, tiny_head)
    kept = share > 1
    texts = []
    for named in (None, tiny_head):
        measured.clear()
        session = Session(Options(tiny.target_gguf, head=named, n_ctx=256, n_threads=1, maxgram=False,
                                  personal=False, budget=TreeBudget(8, adaptive=True)))
        try:
            assert len(measured) == 1   # the head's step is timed once a load, gated or not
            uses = kept or named is not None
            assert ("head" in [s.name for s in session.stages]) == uses
            assert session.model.hidden == uses
            assert (session.head_left_out is None) == uses
            if not uses:
                assert f"--head {installed}" in session.head_left_out
            got = session.run(session.raw_prompt("def add_3(x):\n"), max_tokens=16)
        finally:
            session.close()
        texts.append(got.text)
    assert texts[0] == texts[1] and texts[0].strip()   # with the head or without, greedy text is the model's


@pytest.mark.parametrize("share", [0.0, 1e9])
def test_an_installed_head_that_sat_out_here_is_not_loaded_again_until_measured_again(
        data, tiny, tiny_head, monkeypatch, share):
    """The installed head's measured share of the target's step is kept beside the calibration:
    where it sat out, the next start neither loads nor times it (on a GPU that would be its
    compile, every start) and says when it was measured; `calibrate --refresh`, or a head
    trained again, measures it again. A head that paid is loaded and timed every start."""
    import os

    from localspec.engine import build as build_mod
    from localspec.engine import tuning
    from localspec.engine.drafters import head as head_mod
    from localspec.engine.drafters import head_stage

    monkeypatch.setattr(tuning, "FREE_STEP_SHARE", share)
    loads = []
    real_load = head_stage.load_head
    monkeypatch.setattr(head_stage, "load_head", lambda *a: loads.append(1) or real_load(*a))
    installed = install_head(tiny, tiny_head)
    options = Options(tiny.target_gguf, n_ctx=256, n_threads=1, maxgram=False, personal=False,
                      budget=TreeBudget(8, adaptive=True))

    def start(refresh: bool = False) -> tuple[int, str | None]:
        loads.clear()
        loaded = build_mod.load(head_stage.with_head(options), ["head"], measure=True, refresh=refresh)
        try:
            assert loaded.model.hidden == (loaded.parts.head is not None)
            return len(loads), loaded.sat_out.get("head")
        finally:
            loaded.close()

    first, why = start()
    assert first == 1 and (why is None) == (share > 1)
    again, why_again = start()
    if share > 1:
        assert again == 1 and why_again is None
        return
    assert again == 0 and f"--head {installed}" in why_again and "measured 20" in why_again
    assert "calibrate --refresh" in why_again
    assert start(refresh=True)[0] == 1           # measured again, and left out again
    tag = head_mod.head_tag(installed)
    os.utime(installed, ns=(0, 10 ** 9))          # trained again: another file, measured again
    assert head_mod.head_tag(installed) != tag and start()[0] == 1


def test_head_train_installs_the_head_for_an_installed_model_by_default(data, tiny, tmp_path, capsys,
                                                                        monkeypatch):
    from localspec.app.cli import build_parser
    from localspec.engine import head_train

    def train(corpus, model, out, **kwargs):   # the training itself is test_head.py's
        fake_head(out)
        return {"tokens": len(corpus.tokens), "draft_vocab": 4, "held_out_top1": [0.62]}
    monkeypatch.setattr(head_train, "train", train)
    library.import_model("tiny", tiny.target_gguf)
    text = tmp_path / "notes"
    text.mkdir()
    (text / "a.py").write_text("def add(a, b):\n    return a + b\n" * 40)
    args = build_parser().parse_args(["head", "train", "--model", "tiny", "--text", str(text), "--no-history",
                                      "--no-stdlib", "--no-site-packages", "--max-tokens", "256",
                                      "--generated-tokens", "0", "--ctx", "128"])
    assert args.out is None and args.run(args) == 0
    assert heads.head_for(tiny.target_gguf) == heads.default_head_path(tiny.target_gguf)
    assert "tiny drafts with it from now on" in capsys.readouterr().out


def test_head_train_refuses_an_unwritable_heads_folder_before_training(data, tiny, tmp_path):
    from localspec.app.cli import build_parser

    data.mkdir()
    (data / "heads").write_text("a file where the folder goes")
    args = build_parser().parse_args(["head", "train", "--model", str(tiny.target_gguf), "--text",
                                      str(tmp_path)])
    with pytest.raises(LocalspecError) as err:
        args.run(args)
    assert "folder for draft heads" in err.value.title and "--out" in err.value.fix


def test_list_shows_each_models_head_and_rm_removes_it_with_the_last_model_of_its_weights(data, tiny, capsys):
    library.import_model("a", tiny.target_gguf)
    library.import_model("b", tiny.target_gguf)        # the same weights under another name
    library.import_model("d", tiny.draft_gguf)
    head = fake_head(heads.default_head_path(tiny.target_gguf), top1=0.62)
    assert models_cmd.cmd_list(argparse.Namespace()) == 0
    listed = capsys.readouterr().out
    assert listed.count(f"head   {head} (held-out top-1 0.62)") == 2
    assert "head   - (train one: localspec head train --model d)" in listed

    models_cmd.cmd_rm(argparse.Namespace(name="a"))
    assert head.is_file() and "draft head" not in capsys.readouterr().out   # b still has these weights
    models_cmd.cmd_rm(argparse.Namespace(name="b"))
    assert not head.exists() and "Removed b and its draft head" in capsys.readouterr().out
    mine = fake_head(data / "elsewhere" / "mine.npz")                 # a head kept elsewhere: never touched
    models_cmd.cmd_rm(argparse.Namespace(name="d"))
    assert mine.is_file()


def test_list_says_when_the_installed_head_cannot_be_used(data, tiny, capsys):
    library.import_model("a", tiny.target_gguf)
    path = heads.default_head_path(tiny.target_gguf)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"broken")
    assert models_cmd.cmd_list(argparse.Namespace()) == 0
    assert "head   not usable:" in capsys.readouterr().out


@pytest.mark.parametrize("flag,value", [("--steps", "0"), ("--noise", "1.5"), ("--noise", "nan"),
                                        ("--parallel", "0"), ("--parallel", "257"), ("--minutes", "-1"),
                                        ("--generate-minutes", "0"), ("--length", "1")])
def test_head_train_refuses_a_bad_number_naming_the_flag_before_reading_anything(tiny, tmp_path, flag, value):
    from localspec.app.cli import build_parser

    args = build_parser().parse_args(["head", "train", "--model", str(tiny.target_gguf), "--text",
                                      str(tmp_path), "--out", str(tmp_path / "h.npz"), flag, value])
    with pytest.raises(LocalspecError) as err:
        args.run(args)
    assert err.value.title == "Bad option value" and flag in err.value.cause and flag in err.value.fix
    assert not (tmp_path / "h.npz").exists()


def test_calibrate_with_an_installed_head_that_sits_out_measures_the_target_alone(
        data, tiny, tiny_head, monkeypatch, capsys):
    """`localspec calibrate` where the installed head sits out: the target's costs, and why the
    head sits out, the first time (measured) and the next (remembered); not a crash on the
    head's missing stage."""
    from localspec.app import cli
    from localspec.engine import tuning

    monkeypatch.setattr(tuning, "FREE_STEP_SHARE", 0.0)
    installed = install_head(tiny, tiny_head)
    for when in ("its step costs", "measured 20"):
        assert cli.main(["calibrate", "--model", str(tiny.target_gguf), "--ctx", "256", "--threads", "1"]) == 0
        out = capsys.readouterr().out
        assert "sits out on this machine" in out and when in out and f"--head {installed}" in out
        assert f"target {tiny.target_gguf.name}: 1:" in out and "\ndraft " not in out
