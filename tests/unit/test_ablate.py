"""dev/ablate.py's pure parts: a variant's values hold only inside its block and reach the engine
where it reads them; every variant names an attribute the engine defines; the prompt order
rotates; the ratio, its bootstrap interval and the verdict. (The run itself: tests/engine.)"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest
from localspec.engine.budget import AdaptiveBudget, Arm
from localspec.engine.config import TreeBudget
from localspec.engine.tree import DraftTree

import dev_scripts

ROOT = Path(__file__).resolve().parents[2]
ablate = dev_scripts.load("ablate")
Patch, Run = ablate.Patch, ablate.Run
VARIANTS = {v.name: v for v in ablate.variants()}


def test_patched_sets_values_for_the_block_only_also_when_it_raises():
    patches = (Patch("localspec.engine.tuning:BACKOFF", 2.0),
               Patch("localspec.engine.tuning:HOLD", 1))
    from localspec.engine import tuning

    with ablate.patched(patches):
        assert tuning.BACKOFF == 2.0 and tuning.HOLD == 1
    assert tuning.BACKOFF == 8.0 and tuning.HOLD == 16
    with pytest.raises(RuntimeError), ablate.patched(patches):
        raise RuntimeError("a generation failed")
    assert tuning.BACKOFF == 8.0 and tuning.HOLD == 16


def test_patched_refuses_a_missing_or_inherited_attribute_and_undoes_the_earlier_ones():
    from localspec.engine import tuning

    class Owner:
        VALUE = 1

    class Sub(Owner):
        pass

    sys.modules[__name__].Sub = Sub
    good = Patch("localspec.engine.tuning:BACKOFF", 2.0)
    for bad in ("localspec.engine.tuning:BACKOFFS", f"{__name__}:Sub.VALUE"):
        with pytest.raises(AttributeError, match="renamed"), ablate.patched((good, Patch(bad, 1))):
            pass
        assert tuning.BACKOFF == 8.0 and "VALUE" not in vars(Sub)


def _defined(where: str) -> bool:
    """Whether the source defines the attribute `where` names (read with ast: no module imported,
    so none loads llama.cpp)."""
    module, _, path = where.partition(":")
    parts = module.split(".")[1:]                    # localspec.engine.x -> engine/x.py
    body = ast.parse((ROOT.joinpath(*parts[:-1]) / f"{parts[-1]}.py").read_text()).body
    *outer, name = path.split(".")
    for cls in outer:
        body = next(n.body for n in body if isinstance(n, ast.ClassDef) and n.name == cls)
    for node in body:
        targets = ([t for t in node.targets] if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
    return False


def test_every_variant_patches_an_attribute_the_engine_defines_and_budgets_fields_it_has():
    fields = set(TreeBudget.__dataclass_fields__)
    for v in VARIANTS.values():
        assert all(_defined(p.where) for p in v.patches), v.name
        assert {k for k, _ in v.budget} <= fields, v.name
        assert v.patches or v.budget or v.name == "repeat"


def test_the_variants_change_what_the_code_that_reads_them_does():
    """The constants are read at call time, so a patch reaches the engine's parts."""
    def probes() -> list[int]:
        budget = AdaptiveBudget((Arm(0), Arm(32, models=False)))
        budget.update(0, 1, 0.1)
        budget.update(1, 1, 0.2)                      # the free arm trails: probed once, early
        return [budget.choose() for _ in range(100)]

    assert probes()[:5] == [1, 1, 1, 1, 0]            # PROBE_ROUNDS = 4
    with ablate.patched(VARIANTS["probe-1"].patches):
        assert probes()[:5] == [1, 0, 0, 0, 0]


def test_no_pruning_keeps_every_node_over_the_unpruned_arms():
    budget = TreeBudget(32, adaptive=True)
    with ablate.patched(VARIANTS["no-pruning"].patches):
        from localspec.engine import prune
        arms = budget.arms(False, pruned=True, with_free=True)
        tree = DraftTree(8)
        tree.reset(1)
        tree.add(0, 2, 0.0, 0)
        assert prune.choose(tree, np.array([1.0, 0.0]), lambda k: 1.0).all()
    assert arms == (Arm(0), *(Arm(n, models=False) for n in (4, 8, 16, 32)))
    assert budget.arms(False, pruned=True, with_free=True) == (Arm(32, models=False),)


def test_rotation_puts_each_configuration_in_each_place_once_per_cycle():
    names = ["plain", "baseline", "a", "b"]
    orders = [ablate.rotation(names, k) for k in range(len(names))]
    assert all(sorted(o) == sorted(names) for o in orders)
    for place in range(len(names)):
        assert sorted(o[place] for o in orders) == sorted(names)
    assert ablate.rotation(names, 5) == orders[1]


def run(config: str, tokens: int, seconds: float, prompt: str = "p", block: str = "b#1") -> Run:
    return Run(block, prompt, config, tokens, seconds, tokens, None)


def test_pooled_ratio_is_the_ratio_of_summed_rates():
    pairs = [(run("v", 100, 4.0), run("baseline", 100, 5.0)), (run("v", 50, 1.0), run("baseline", 60, 1.0))]
    assert ablate.pooled_ratio(pairs) == pytest.approx((150 / 5.0) / (160 / 6.0))


def test_interval_resamples_within_blocks():
    # every prompt of a block has the same ratio: each draw keeps each block's share, so no spread
    slow = [(run("v", 100, 2.0, f"s{i}"), run("baseline", 100, 1.0, f"s{i}")) for i in range(6)]
    fast = [(run("v", 100, 1.0, f"f{i}"), run("baseline", 100, 1.0, f"f{i}")) for i in range(6)]
    lo, hi = ablate.interval({"a": slow, "b": fast}, draws=500)
    point = ablate.pooled_ratio(slow + fast)
    assert lo == pytest.approx(point) and hi == pytest.approx(point)
    lo, hi = ablate.interval({"a": slow + fast}, draws=500)   # one block: the mix varies
    assert lo < point < hi


def test_interval_of_noise_holds_the_ratio_and_narrows_with_prompts():
    rng = np.random.default_rng(1)

    def noisy(n: int) -> list:
        return [(run("v", 100, float(s), str(i)), run("baseline", 100, 1.0, str(i)))
                for i, s in enumerate(rng.normal(1.0, 0.1, n))]
    few, many = ablate.interval({"b": noisy(8)}), ablate.interval({"b": noisy(200)})
    assert few[0] < 1.0 < few[1] and many[0] < 1.0 < many[1]
    assert many[1] - many[0] < (few[1] - few[0]) / 2


def test_verdict_against_the_control_s_margins():
    within, below, above = (0.97, 1.02), (0.90, 0.96), (1.03, 1.10)
    assert ablate.verdict({"all": within, "humaneval": within, "edit": within}, {}) == "within spread"
    assert ablate.verdict({"all": within, "humaneval": within, "edit": below}, {}) == "pays"
    assert ablate.verdict({"all": below}, {}) == "pays"
    assert ablate.verdict({"all": above, "edit": within}, {}) == "costs"
    assert ablate.verdict({"all": within, "humaneval": above, "edit": below}, {}) == "mixed"
    # the control reached 1.05 on edit: a variant must leave 0.95..1.05 there to count
    margin = ablate.margins({"all": (0.99, 1.01), "edit": (0.98, 1.05)})
    assert margin == pytest.approx({"all": 0.01, "edit": 0.05})
    assert ablate.verdict({"all": within, "edit": below}, margin) == "within spread"
    assert ablate.verdict({"all": (0.90, 0.985)}, margin) == "pays"


def test_summarize_pairs_each_variant_with_the_baseline_by_prompt():
    runs = []
    for block in ("humaneval#1", "edit#1"):
        for i in range(5):
            runs += [run("plain", 100, 2.0, str(i), block), run("baseline", 100, 1.0, str(i), block),
                     Run(block, str(i), "v", 100, 1.25, 50, True)]
    v = ablate.Variant("v", "X = 1", "engine/x.py", "2")
    rows = {r["config"]: r for r in ablate.summarize(runs, [v], {"humaneval#1": "humaneval", "edit#1": "edit"},
                                                      draws=200)}
    assert rows["plain"]["tok_s"] == 50.0 and rows["baseline"]["tok_s"] == 100.0 and "ratio" not in rows["baseline"]
    row = rows["v"]
    assert row["ratio"] == 0.8 and row["interval"] == [0.8, 0.8] and row["tokens_per_call"] == 2.0
    assert row["by_workload"]["edit"]["ratio"] == 0.8 and row["by_block"] == {"humaneval#1": 0.8, "edit#1": 0.8}
    assert row["identical"] == "10/10" and row["verdict"] == "pays"
    few = ablate.summarize([r for r in runs if r.prompt in ("0", "1")], [v], {"humaneval#1": "h", "edit#1": "e"})
    assert few[-1]["verdict"] == f"fewer than {ablate.MIN_PROMPTS} prompts"


def test_the_control_sets_the_margin_the_variants_are_judged_by():
    """An A/A control 3% off in every block: a variant 2% off is within that spread."""
    runs = []
    for i in range(8):
        runs += [run("plain", 100, 2.0, str(i)), run("baseline", 100, 1.0, str(i)),
                 run("repeat", 100, 1 / (1.03 + 0.001 * i), str(i)), run("v", 100, 1 / 0.98, str(i)),
                 run("w", 100, 1 / 0.90, str(i))]
    chosen = [ablate.Variant(n, "", "", "") for n in ("repeat", "v", "w")]
    rows = {r["config"]: r for r in ablate.summarize(runs, chosen, {"b#1": "b"}, draws=300)}
    assert rows["repeat"]["margin"]["all"] == pytest.approx(0.037, abs=0.002)
    assert rows["repeat"]["verdict"].startswith("the control")
    assert rows["v"]["verdict"] == "within spread" and rows["w"]["verdict"] == "pays"


def test_joined_reports_take_a_block_run_again_from_the_later_one():
    def report(block_runs: dict, commit: str) -> dict:
        return {"blocks": list(block_runs), "variants": [{"name": "v"}], "commit": commit, "complete": True,
                "wall_seconds": 10, "runs": [{**vars(r)} for rs in block_runs.values() for r in rs]}
    first = report({"h#1": [run("baseline", 10, 1.0, "a", "h#1")], "h#2": [run("baseline", 10, 1.0, "b", "h#2")]}, "c1")
    second = report({"h#2": [run("baseline", 20, 1.0, "c", "h#2")], "e#2": [run("baseline", 5, 1.0, "d", "e#2")]}, "c2")
    merged, runs = ablate.joined([first, second])
    assert merged["blocks"] == ["h#1", "h#2", "e#2"] and merged["commit"] == "c1; c2"
    assert [(r.block, r.prompt) for r in runs] == [("h#1", "a"), ("h#2", "c"), ("e#2", "d")]
    assert merged["wall_seconds"] == 20 and merged["processes"] == 2


def test_others_busy_is_the_machine_s_busy_time_less_this_process_s():
    tick = 0.01
    assert ablate.others_busy((0.0, 1000, 500), (2.0, 1400, 700), tick) == pytest.approx((400 - 200) * tick / 2.0)
    assert ablate.others_busy((0.0, 1000, 500), (2.0, 1200, 700), tick) == 0.0   # all of it was ours
    assert ablate.others_busy(None, (2.0, 1, 1)) is None and ablate.others_busy((2.0, 1, 1), (2.0, 1, 1)) is None
    sample = ablate.cpu_sample()
    assert sample is None or (sample[1] >= sample[2] >= 0)


def test_a_prompt_left_out_is_left_out_for_every_configuration():
    runs = []
    for i in range(6):
        hit = i == 0      # a neighbour's burst during prompt 0: every configuration's run is marked
        runs += [Run("b#1", str(i), "plain", 100, 2.0, 100, None, disturbed=hit),
                 Run("b#1", str(i), "baseline", 100, 1.0, 50, None, disturbed=hit),
                 Run("b#1", str(i), "v", 100, 100.0 if hit else 1.0, 50, True, disturbed=hit)]
    rows = {r["config"]: r for r in ablate.summarize(runs, [ablate.Variant("v", "", "", "")], {"b#1": "b"}, draws=100)}
    assert rows["v"]["ratio"] == 1.0 and rows["v"]["prompts"] == 5 and rows["baseline"]["tok_s"] == 100.0
