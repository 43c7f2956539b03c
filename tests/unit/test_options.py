"""The one options type, its validation, and the one rule for run flags over saved settings."""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace

import pytest

from localspec.app.run_options import (add_engine_options, add_model_options, add_sampling_options,
                                       edited, given, options_from_flags, over, settings_flags,
                                       settings_options, spec_flags)
from localspec.app.settings import Settings
from localspec.engine.config import DEFAULT_TREE_NODES, SamplingParams, TreeBudget
from localspec.engine.drafters import registry
from localspec.engine.errors import LocalspecError
from localspec.engine.options import MAX_TREE_NODES, Options


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_model_options(p, model_required=False)
    add_engine_options(p)
    add_sampling_options(p)
    return p.parse_args(list(argv))


def test_defaults_are_what_the_cli_runs():
    o = Options("t.gguf", draft="d.gguf")
    assert o.budget == TreeBudget(max_nodes=DEFAULT_TREE_NODES, adaptive=True) and o.calibrate
    assert o.stages == ("maxgram", "personal", "draft")
    assert options_from_flags(given(parse()), Options("t.gguf", draft="d.gguf")) == o


def test_json_round_trip_and_unknown_keys(tmp_path):
    o = Options(tmp_path / "t.gguf", draft="d.gguf", head=None, n_ctx=512, n_threads=1,
                budget=TreeBudget(max_nodes=8), sampling=SamplingParams(0.7, 20, 0.9, 3))
    raw = json.loads(json.dumps(o.to_json()))
    back = Options.from_json(raw)
    assert back == Options(str(tmp_path / "t.gguf"), draft="d.gguf", n_ctx=512, n_threads=1,
                           budget=TreeBudget(max_nodes=8), sampling=SamplingParams(0.7, 20, 0.9, 3))
    with pytest.raises(LocalspecError, match="Unknown engine options"):
        Options.from_json({**raw, "warp": 9})


@pytest.mark.parametrize("argv, flag, want", [
    (("--temperature", "nan"), "--temperature", "finite"),
    (("--temperature", "inf"), "--temperature", "finite"),
    (("--temperature", "-1"), "--temperature", ">= 0"),
    (("--tree-nodes", "0"), "--tree-nodes", f"from 1 to {MAX_TREE_NODES}"),
    (("--tree-nodes", "-1"), "--tree-nodes", f"from 1 to {MAX_TREE_NODES}"),
    (("--tree-nodes", "100000"), "--tree-nodes", f"from 1 to {MAX_TREE_NODES}"),
    (("--ctx", "-1"), "--ctx", "from 0 to"),
    (("--seed", "-1"), "--seed", ">= 0"),
    (("--top-p", "0"), "--top-p", "0 < top-p <= 1"),
    (("--top-p", "1.5"), "--top-p", "0 < top-p <= 1"),
    (("--top-k", "-3"), "--top-k", ">= 0"),
    (("--max-tokens", "0"), "--max-tokens", ">= 1"),
    (("--gpu-layers", "-2"), "--gpu-layers", ">= -1"),
    (("--threads", "0"), "--threads", ">= 1"),
])
def test_bad_values_name_the_flag_and_the_range(argv, flag, want):
    with pytest.raises(LocalspecError) as err:
        given(parse(*argv))
    assert flag in err.value.cause and flag in err.value.fix and want in err.value.fix
    assert "Lower --ctx" not in err.value.fix


def test_every_bad_value_is_named_at_once():
    with pytest.raises(LocalspecError) as err:
        given(parse("--temperature", "nan", "--top-k", "-1"))
    assert "--temperature" in err.value.cause and "--top-k" in err.value.cause


def test_options_check_themselves():
    with pytest.raises(LocalspecError, match="--tree-nodes"):
        Options("t.gguf", budget=TreeBudget(max_nodes=0))
    with pytest.raises(LocalspecError, match="--temperature"):
        Options("t.gguf", sampling=SamplingParams(temperature=math.nan))


def test_settings_file_uses_the_same_rules():
    with pytest.raises(ValueError, match="temperature nan"):
        Settings(temperature=math.nan)
    Settings(seed=None)   # no seed: a new one for every reply


def test_stage_names_come_from_the_options(tmp_path):
    folder = tmp_path / "draft-hf"
    folder.mkdir()
    assert Options("t.gguf", draft=folder).stages == ("maxgram", "personal", "torch-draft")
    assert Options("t.gguf", draft="d.gguf", head="h.npz", personal=False).stages == ("maxgram", "head")
    assert Options("t.gguf", draft="d.gguf", use_draft=False, maxgram=False).stages == ("personal",)
    assert Options("t.gguf", draft="d.gguf", speculation=False).stages == ()
    assert all(name in registry.DRAFTERS for name in ("maxgram", "personal", "ngram", "draft", "head"))


def test_registry_names_the_known_drafters():
    with pytest.raises(LocalspecError) as err:
        registry.make("warp", registry.Parts(target=None))
    assert "maxgram" in err.value.fix
    assert registry.make("maxgram", registry.Parts(target=None)).uses_model is False
    assert not registry.Parts(target=None).has("draft") and registry.Parts(target=None).has("maxgram")


def test_flags_stand_over_settings_for_the_run_only():
    saved = Settings(model="coder", draft="coder-draft", speculation=True, stages=("personal", "draft"))
    flags = settings_flags(given(parse("--model", "other", "--no-personal", "--exact")))
    run = over(saved, flags)
    # a --model brings its own draft (None: that model's), never the saved model's
    assert (run.model, run.draft, run.exact, run.stages) == ("other", None, True, ("draft",))
    # the form showed `run`; the user changed only the temperature: the flags' fields keep the
    # saved values, the flags still stand
    form = Settings(**{**run.to_json(), "stages": run.stages, "temperature": 0.5})
    to_save, still = edited(saved, flags, form)
    assert to_save == Settings(model="coder", draft="coder-draft", temperature=0.5)
    assert still == flags
    # the user switched exact off in the form: saved, and the run follows it
    form = Settings(**{**run.to_json(), "stages": run.stages, "exact": False})
    to_save, still = edited(saved, flags, form)
    assert to_save.exact is False and "exact" not in still and over(to_save, still).exact is False


def test_head_flags_over_the_automatic_head_and_the_saved_setting():
    assert Options("t.gguf").use_head and Options("t.gguf").head is None     # automatic by default
    assert options_from_flags(given(parse("--no-head")), Options("t.gguf")).use_head is False
    assert options_from_flags(given(parse("--head", "h.npz")), Options("t.gguf")).head == "h.npz"
    with pytest.raises(LocalspecError, match="--head and --no-head"):
        given(parse("--head", "h.npz", "--no-head"))
    # --no-head stands over the saved settings for this run only
    saved = Settings(model="coder")
    flags = settings_flags(given(parse("--no-head")))
    run = over(saved, flags)
    assert run.use_head is False and settings_options(run, Options("")).use_head is False
    assert edited(saved, flags, run) == (saved, flags)
    # a --head is used even where the saved settings keep heads off; the chat's spec says the same
    off = Settings(model="coder", use_head=False)
    run = over(off, settings_flags(given(parse("--head", "h.npz"))))
    assert settings_options(run, Options("", head="h.npz")).stages[-1] == "head"
    assert spec_flags(Options("", head="h.npz")) == {"use_head": True}
    assert spec_flags(Options("", use_head=False)) == {"use_head": False}


def test_sampling_flags_stand_over_settings_like_the_others():
    saved = Settings(model="coder", temperature=0.2, max_tokens=300)
    flags = settings_flags(given(parse("--temperature", "0.9", "--seed", "7")))
    run = over(saved, flags)
    assert (run.temperature, run.seed, run.max_tokens) == (0.9, 7, 300)
    to_save, still = edited(saved, flags, replace(run, top_k=5))
    assert to_save == replace(saved, top_k=5) and still == flags


def test_chat_spec_round_trips_through_its_flags():
    base = Options("", draft="d.gguf", exact=True, speculation=False, n_ctx=1024)
    flags = spec_flags(base)
    assert flags == {"draft": "d.gguf", "exact": True, "speculation": False}
    spec = settings_options(over(Settings(model="coder"), flags), base)
    assert (spec.model, spec.draft, spec.exact, spec.speculation, spec.n_ctx) == ("coder", "d.gguf",
                                                                                 True, False, 1024)


def test_every_drafter_implements_the_whole_protocol():
    """The engine calls catch_up and cost_curve and reads vocab_size and limits on every stage,
    without asking whether it has them."""
    from localspec.engine.drafters.base import Drafter
    from localspec.engine.drafters.head import HeadDrafter
    from localspec.engine.drafters.llama_draft import LlamaDraft
    from localspec.engine.drafters.maxgram import MaxGram
    from localspec.engine.drafters.ngram import PersonalNgram
    from localspec.engine.drafters.torch_draft import TorchDraft

    methods = [name for name in ("begin", "propose", "accept", "catch_up", "cost_curve", "close")
               if name in Drafter.__dict__]
    assert len(methods) == 6
    for cls in (MaxGram, PersonalNgram, LlamaDraft, TorchDraft, HeadDrafter):
        missing = [m for m in methods if not callable(getattr(cls, m, None))]
        assert not missing, (cls.__name__, missing)
        assert isinstance(cls.name, str) and isinstance(cls.uses_model, bool) and isinstance(cls.copies, bool)
    costs = object()   # free drafters hand the costs back as they are
    for free in (MaxGram(), PersonalNgram()):
        assert free.vocab_size is None and free.limits is not None and not free.uses_model
        assert free.cost_curve(costs) is costs
        free.catch_up()
