"""Calibration: batch costs measured on this machine, cached per model and machine, and the tree
budgets they rule out."""
from __future__ import annotations

import json

import numpy as np
import pytest
from localspec.engine import calibrate as cal
from localspec.engine.budget import Arm
from localspec.engine.costs import Costs
from localspec.engine.config import TreeBudget
from localspec.engine.llama_model import LlamaModel
from localspec.engine.session import Session
from localspec.engine.options import Options


def refuse_to_measure(*args, **kwargs):
    """calibrate.measure's stand-in where everything must come from the cache."""
    raise AssertionError("measured again although cached")


def test_measured_curve_is_cached_per_model_and_machine(tiny, tmp_path, monkeypatch):
    model = LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=4, n_threads=1)
    try:
        [curve] = cal.cached_curves([model], [(1, 4, 8)], tmp_path)
        assert set(curve) == {1, 4, 8} and all(s > 0 for s in curve.values())
        files = list(tmp_path.glob("*.json"))
        assert len(files) == 1 and json.loads(files[0].read_text())["models"] == [str(model.path)]

        monkeypatch.setattr(cal, "measure", refuse_to_measure)
        assert cal.cached_curves([model], [(1, 4, 8)], tmp_path) == [curve]
        files[0].write_text("{not json")                    # a damaged cache is measured again
        monkeypatch.undo()
        assert set(cal.cached_curves([model], [(1, 4, 8)], tmp_path)[0]) == {1, 4, 8}
        assert json.loads(files[0].read_text())["seconds"]
        # the cache leaves the model's memory empty: a generation starts from position 0
        assert model.seq_pos_max(0) == -1
    finally:
        model.close()
    other = LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=4, n_threads=2)   # another setup
    try:
        cal.cached_curves([other], [(1,)], tmp_path)
    finally:
        other.close()
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_a_target_with_hidden_states_has_a_calibration_of_its_own(tiny, tmp_path):
    """A draft head's target outputs every row of a batch with its hidden state: its costs are not
    those of the same model opened for logits alone."""
    plain = LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=4, n_threads=1)
    hidden = LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=4, n_threads=1, hidden=True)
    try:
        assert cal.cache_path([plain], tmp_path) != cal.cache_path([hidden], tmp_path)
    finally:
        plain.close()
        hidden.close()


def test_a_load_reads_the_cache_file_once(tiny, tmp_path, monkeypatch):
    """The curve, the tiled floor and the one-row kernels (on a CPU with packaging/patches) and
    what is measured come from one read of the cache file, whether the load measures or finds
    everything cached."""
    from localspec.engine.llama_model import exact_in_process
    from localspec.engine.native import has_multicol_kernels, has_tiled_min_switch

    monkeypatch.setenv(cal.TILED_MIN, str(cal.TILED_FROM))   # restored after the test
    reads = []
    read_json = cal.read_json
    monkeypatch.setattr(cal, "read_json", lambda path: reads.append(path) or read_json(path))
    model = LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=4, n_threads=1)
    try:
        first = cal.calibrate(model, None, 8, cache_dir=tmp_path)
        assert reads == [first.file]
        data = json.loads(first.file.read_text())
        assert {int(n): s for n, s in data["seconds"][0].items()} == first.target
        assert ("tiled_min" in data) is (has_tiled_min_switch() and not exact_in_process())
        assert ("multicol_min" in data) is (has_multicol_kernels() and not exact_in_process())

        monkeypatch.setattr(cal, "measure", refuse_to_measure)
        second = cal.calibrate(model, None, 8, cache_dir=tmp_path)
        assert reads == [first.file] * 2 and second.target == first.target
        assert json.loads(first.file.read_text()) == data
    finally:
        model.close()


# Costs.viable is arithmetic: checked on curves shaped like the ones measured (ms).
CPU_2CORE = {1: 64, 2: 99, 3: 123, 4: 112, 5: 146, 6: 168, 8: 207, 9: 225, 12: 259, 16: 254, 17: 260}
H200 = {1: 2.05, 2: 2.3, 4: 2.8, 8: 3.8, 16: 4.5, 17: 4.6, 32: 5.3}


def _costs(target_ms, draft_ms=None):
    return Costs({n: ms / 1e3 for n, ms in target_ms.items()},
                 {n: ms / 1e3 for n, ms in (draft_ms or {}).items()})


def test_viable_budgets_follow_the_cost_curve():
    arms = TreeBudget(max_nodes=16, adaptive=True).arms(with_models=True)
    cpu = _costs(CPU_2CORE, {1: 38, 2: 45, 4: 60, 8: 95})
    kept = cpu.viable(arms, width=4, max_depth=6)
    assert Arm(0) in kept
    # the draft's forwards plus a 17-token verify (4x a plain step) cannot pay, even at 90%
    assert Arm(16) not in kept and Arm(8) not in kept and Arm(4) in kept
    # a free chain of 16 copied tokens can (Max-Gram on an edit): only the best case counts
    assert Arm(16, models=False) in kept
    gpu = _costs(H200, {1: 1.5, 2: 1.5, 4: 1.6, 8: 1.7})
    # on the H200 a 17-token verify is cheap, but 5 draft forwards of 1.5 ms are not
    assert gpu.viable(arms, width=4, max_depth=6) == tuple(a for a in arms if a != Arm(16))
    # interpolation between and beyond measured sizes
    assert cpu.target_cost(7) == pytest.approx((0.168 + 0.207) / 2)
    assert _costs({1: 1, 2: 2}).target_cost(4) == pytest.approx(0.004)


def test_adaptive_session_calibrates_and_keeps_output(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    cfg = Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                       budget=TreeBudget(max_nodes=8, adaptive=True))
    session = Session(cfg)
    try:
        assert session.costs is not None and session.costs.draft
        assert list((tmp_path / "calibration").glob("*.json"))
        tokens = session.raw_prompt("def add(a, b):\n")
        out = session.run(tokens, max_tokens=24).tokens
    finally:
        session.close()
    plain = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    try:
        assert plain.run(tokens, max_tokens=24).tokens == out
    finally:
        plain.close()


def test_a_session_decodes_under_its_calibrations_floor_and_leaves_it_unset(tiny, monkeypatch, tmp_path):
    """Calibration's tiled-matmul floor and one-row kernels are a context the session enters around
    each step of a generation: every decode of the target and the draft runs with them, and
    between the steps and after them the process's environment is as it was."""
    import os

    from localspec.engine.llama_model import exact_in_process
    from localspec.engine.native import has_tiled_min_switch

    if exact_in_process() or not has_tiled_min_switch():
        pytest.skip("no tiled-matmul floor here: an exact model is open, or no packaging/patches")
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    monkeypatch.delenv(cal.TILED_MIN, raising=False)
    monkeypatch.delenv(cal.MULTICOL_MIN, raising=False)
    session = Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                              budget=TreeBudget(max_nodes=8, adaptive=True)))
    try:
        floor, kernels = session.costs.tiled_min, session.costs.multicol_min
        assert floor is not None and cal.TILED_MIN not in os.environ and cal.MULTICOL_MIN not in os.environ
        keys = (cal.TILED_MIN, cal.MULTICOL_MIN)
        seen: list[tuple[str | None, ...]] = []
        draft = next(d for d in session.stages if d.uses_model)
        for model in (session.model, draft.model):       # a spy on each model's decodes
            decode = model.decode
            monkeypatch.setattr(model, "decode", lambda *a, _decode=decode, **k:
                                seen.append(tuple(map(os.environ.get, keys))) or _decode(*a, **k))
        between = [tuple(map(os.environ.get, keys))
                   for _ in session.generate(session.raw_prompt("def add(a, b):\n"), max_tokens=24)]
        assert seen and set(seen) == {(str(floor), None if kernels is None else str(kernels))}
        assert between and set(between) == {(None, None)}
        assert cal.TILED_MIN not in os.environ and cal.MULTICOL_MIN not in os.environ
    finally:
        session.close()


def test_a_first_calibration_announces_every_step_in_order(tiny, monkeypatch, tmp_path):
    """The builder hands `progress` each batch calibration is about to time, numbered 1..n with n
    known from the first step: the target's sizes, the draft's, on a CPU with packaging/patches
    the tiled-matmul floor and one row on either kernels, the sides' order reversed each
    repetition. A second load finds it all cached and announces nothing."""
    from localspec.engine.llama_model import exact_in_process
    from localspec.engine.native import has_multicol_kernels, has_tiled_min_switch

    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(cal.TILED_MIN, str(cal.TILED_FROM))   # restored after the test
    cfg = Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                       budget=TreeBudget(max_nodes=8, adaptive=True))
    steps: list[cal.Step] = []
    Session(cfg, progress=steps.append).close()
    total = steps[0].total
    assert [s.step for s in steps] == list(range(1, total + 1))
    assert {s.total for s in steps} == {total}
    sizes = sorted({n for n in cal.SIZES if n <= 10} | {10})           # a full tree and its padding
    rows = [cal._rows(n) for n in sizes]
    draft_rows = [cal._rows(n) for n in cal.DRAFT_SIZES]
    expect = [f"target {r}" for r in rows] + [f"draft {r}" for r in draft_rows]
    expect = expect * cal._REPS                                        # the models take turns
    if has_tiled_min_switch() and not exact_in_process():
        expect += [f"tiled matmul floor at {cal._rows(n)}" for n in sizes if n >= cal.TILED_FROM] * cal._REPS
    if has_multicol_kernels() and not exact_in_process():
        ggml, multi = ([f"{m} 1 row on {cal._KERNELS[side]}" for m in ("target", "draft")] for side in (2, 1))
        expect += (ggml + multi + multi + ggml) * (cal._REPS // 2) + (ggml + multi) * (cal._REPS % 2)
    assert [s.what for s in steps] == expect
    again: list[cal.Step] = []
    Session(cfg, progress=again.append).close()
    assert again == []


def test_the_next_run_starts_from_what_this_one_learnt(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    cfg = Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                       budget=TreeBudget(max_nodes=8, adaptive=True))
    first = Session(cfg)
    try:
        tokens = first.raw_prompt("def add(a, b):\n")
        expect = first.run(tokens, max_tokens=24).tokens
        learnt = first.engine.learnt()
    finally:
        first.close()
    [saved] = list((tmp_path / "calibration").glob("*.learnt.json"))
    assert json.loads(saved.read_text()) == json.loads(json.dumps(learnt))
    second = Session(cfg)
    try:
        summary = second.engine.policy.summary()
        assert all(arm["rounds"] > 0 for arm in summary.values())   # nothing to measure again
        assert summary == first.engine.policy.summary()
        for counts in ("accepted", "proposed"):                   # the acceptance model's too
            np.testing.assert_allclose(second.engine.learnt()["acceptance"][counts],
                                       learnt["acceptance"][counts])
        assert second.run(tokens, max_tokens=24).tokens == expect
    finally:
        second.close()
    saved.write_text("{broken")                                   # unreadable: a fresh start
    third = Session(cfg)
    try:
        assert all(arm["rounds"] == 0 for arm in third.engine.policy.summary().values())
    finally:
        third.close()


def test_tiled_floor_is_where_the_tiled_path_stops_losing(monkeypatch):
    """Math of the choice, with the row-by-row curve scripted: the floor is the fewest rows from
    which the tiled path is never slower, and the curve takes each side's cost."""
    tiled = {1: 33.0, 4: 89.0, 8: 227.0, 12: 277.0, 16: 282.0, 24: 420.0, 32: 411.0}
    rows = {8: 171.0, 12: 235.0, 16: 243.0, 24: 398.0, 32: 481.0}
    seen = {}

    def scripted(models, sizes, reps=cal._REPS, announce=None):
        import os
        seen["sizes"], seen["env"] = list(sizes[0]), os.environ.get(cal.TILED_MIN)
        return [dict(rows)]
    monkeypatch.setattr(cal, "measure", scripted)
    monkeypatch.setenv(cal.TILED_MIN, "8")
    floor, curve = cal.tiled_floor(object(), tiled)
    assert seen == {"sizes": [8, 12, 16, 24, 32], "env": str(1 << 30)}   # measured with tiling off
    assert floor == 32
    assert curve == {1: 33.0, 4: 89.0, 8: 171.0, 12: 235.0, 16: 243.0, 24: 398.0, 32: 411.0}
    assert cal.os.environ[cal.TILED_MIN] == "8"                          # restored
    rows_win = {n: s + 1.0 for n, s in tiled.items() if n >= 8}          # tiled never loses
    monkeypatch.setattr(cal, "measure", lambda *a, **k: [rows_win])
    assert cal.tiled_floor(object(), tiled) == (8, tiled)
    tiled_loses = {n: s - 1.0 for n, s in tiled.items() if n >= 8}       # tiled always loses
    monkeypatch.setattr(cal, "measure", lambda *a, **k: [tiled_loses])
    floor, curve = cal.tiled_floor(object(), tiled)
    assert floor == 33 and curve[32] == 410.0


def test_one_row_kernels_take_one_row_only_beyond_the_margin(monkeypatch):
    """Math of the choice, with one-row decodes scripted by the switch they run under: the sides
    take turns, their order reversed each repetition; each side's fastest repetition counts; one
    row goes on the multi-column kernels only when the target's decode there takes less than
    MULTICOL_GAIN of its time on ggml's; the environment is as it was afterwards."""
    import os

    def scripted(target_ms):     # {MIN: the target's ms per repetition}; the draft: 30 ms either way
        order = []

        def measure(models, sizes, reps=cal._REPS, announce=None):
            assert sizes == [(1,)] * len(models) and reps == 1
            side = int(os.environ[cal.MULTICOL_MIN])
            for i in range(len(models) if announce is not None else 0):
                announce(i, 1)
            order.append(side)
            return [{1: target_ms[side][order.count(side) - 1] / 1e3}, {1: 30e-3}][:len(models)]
        return measure, order

    monkeypatch.setenv(cal.MULTICOL_MIN, "7")
    measure, order = scripted({2: [64, 70, 64, 66, 65], 1: [58, 57, 90, 58, 59]})
    monkeypatch.setattr(cal, "measure", measure)
    steps: list[str] = []
    kernels, seconds = cal.one_row_kernels([object(), object()], steps.append)
    assert order == [2, 1, 1, 2] * 2 + [2, 1]
    assert steps[:4] == ["target 1 row on ggml's kernels", "draft 1 row on ggml's kernels",
                         "target 1 row on multi-column kernels", "draft 1 row on multi-column kernels"]
    assert len(steps) == 2 * cal._REPS * 2
    assert kernels == 1 and seconds == {2: [64e-3, 30e-3], 1: [57e-3, 30e-3]}
    assert cal.os.environ[cal.MULTICOL_MIN] == "7"                       # restored
    measure, _ = scripted({2: [64, 70, 64, 66, 65], 1: [62, 63, 62, 90, 62]})   # 3% faster: noise
    monkeypatch.setattr(cal, "measure", measure)
    assert cal.one_row_kernels([object()]) == (2, {2: [64e-3], 1: [62e-3]})


def test_calibration_chooses_the_one_row_kernels_and_caches_the_choice(tiny, tmp_path, monkeypatch):
    """On a CPU with the multi-column kernels, calibration times one-row decodes on them and on
    ggml's, keeps the choice (GGML_CPU_MULTICOL_MIN 1 or 2) and both sides' figures in the cache,
    prices each curve's one row as the chosen side's and returns the choice in Costs.switches. A
    cache without the choice measures only it; a cache with it measures nothing."""
    import os

    from localspec.engine.llama_model import exact_in_process
    from localspec.engine.native import has_multicol_kernels

    if exact_in_process() or not has_multicol_kernels():
        pytest.skip("no one-row choice here: an exact model is open, or no multi-column kernels")
    monkeypatch.delenv(cal.MULTICOL_MIN, raising=False)
    target = LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=4, n_threads=1)
    draft = LlamaModel(tiny.draft_gguf, n_ctx=256, n_seq_max=4, n_threads=1)
    try:
        costs = cal.calibrate(target, draft, 8, cache_dir=tmp_path)
        data = json.loads(costs.file.read_text())
        kernels, one_row = data["multicol_min"], data["one_row"]
        assert kernels in (1, 2) and costs.multicol_min == kernels
        assert costs.switches[cal.MULTICOL_MIN] == str(kernels)
        assert (kernels == 1) is (one_row["1"][0] < cal.MULTICOL_GAIN * one_row["2"][0])
        assert [costs.target[1], costs.draft[1]] == one_row[str(kernels)]
        assert [{int(n): s for n, s in c.items()} for c in data["seconds"]] == [costs.target, costs.draft]
        assert cal.MULTICOL_MIN not in os.environ

        del data["multicol_min"]                  # a cache from before the choice: only it is measured
        costs.file.write_text(json.dumps(data))
        steps: list[cal.Step] = []
        again = cal.calibrate(target, draft, 8, cache_dir=tmp_path, progress=steps.append)
        assert len(steps) == 2 * cal._REPS * 2 and all(" 1 row on " in s.what for s in steps)
        assert again.multicol_min in (1, 2)

        monkeypatch.setattr(cal, "measure", refuse_to_measure)
        assert cal.calibrate(target, draft, 8, cache_dir=tmp_path) == again
    finally:
        target.close()
        draft.close()


def test_calibration_bounds_the_kernels_past_any_tree_and_remeasures_under_another_bound(tiny, tmp_path):
    """On a CPU with the multi-column kernels the curve and the tiled floor are measured with the
    kernels taking up to MULTICOL_WIDEST rows, which the cache records and Costs.switches carries
    to the decodes; a cache measured under another bound (one from before it) is measured again,
    all of it: its floor was found against other row-by-row costs."""
    import os

    from localspec.engine.llama_model import exact_in_process
    from localspec.engine.native import has_multicol_kernels

    if exact_in_process() or not has_multicol_kernels():
        pytest.skip("no bound to choose here: an exact model is open, or no multi-column kernels")
    target = LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=4, n_threads=1)
    try:
        costs = cal.calibrate(target, None, 8, cache_dir=tmp_path)
        data = json.loads(costs.file.read_text())
        assert data["multicol_max"] == cal.MULTICOL_WIDEST == costs.multicol_max
        assert costs.switches[cal.MULTICOL_MAX] == str(cal.MULTICOL_WIDEST)
        assert cal.MULTICOL_MAX not in os.environ
        assert cal.MULTICOL_WIDEST > max(cal.SIZES)        # past any tree the curve prices

        del data["multicol_max"]                            # measured under the patch's own bound
        costs.file.write_text(json.dumps(data))
        steps: list[cal.Step] = []
        again = cal.calibrate(target, None, 8, cache_dir=tmp_path, progress=steps.append)
        assert any(s.what.startswith("target ") and " row" in s.what and " on " not in s.what for s in steps)
        assert json.loads(costs.file.read_text())["multicol_max"] == cal.MULTICOL_WIDEST
        assert again.multicol_max == cal.MULTICOL_WIDEST
    finally:
        target.close()


@pytest.mark.real_pair
def test_calibration_measures_the_tiled_floor_and_leaves_the_environment(real_pair, tmp_path, monkeypatch):
    """On a CPU with packaging/patches, calibration measures ggml's tiled matmul against its
    row-by-row path, caches the floor and returns it as the switch to decode under
    (GGML_CPU_TILED_MM_MIN, in Costs.switches), leaving the process's environment as it was."""
    from localspec.engine.llama_model import exact_in_process
    from localspec.engine.native import has_tiled_min_switch

    if exact_in_process():
        pytest.skip("an exact model ran in this process: the floor is pinned out of reach")
    assert has_tiled_min_switch(), "llama.cpp was built without packaging/patches"
    monkeypatch.delenv(cal.TILED_MIN, raising=False)   # measured fresh; conftest.py puts it back after
    target = LlamaModel(real_pair[0], n_ctx=512, n_seq_max=2)
    try:
        costs = cal.calibrate(target, None, 14, cache_dir=tmp_path)
        data = json.loads(next(tmp_path.glob("*.json")).read_text())
        floor = data["tiled_min"]
        # one of the measured sizes ggml runs tiled, or one past the largest (tiled never wins):
        # which one is this machine's timing
        big = sorted(int(n) for n in data["seconds"][0] if int(n) >= cal.TILED_FROM)
        assert big and (floor in big or floor == big[-1] + 1), (floor, big)
        assert costs.tiled_min == floor and costs.switches[cal.TILED_MIN] == str(floor)
        assert cal.TILED_MIN not in cal.os.environ
        assert {int(n): s for n, s in data["seconds"][0].items()} == costs.target
        monkeypatch.setattr(cal, "measure", refuse_to_measure)
        monkeypatch.setenv(cal.TILED_MIN, "8")
        again = cal.calibrate(target, None, 14, cache_dir=tmp_path)
        assert again.target == costs.target and again.tiled_min == floor
        assert cal.os.environ[cal.TILED_MIN] == "8"
    finally:
        target.close()


@pytest.mark.slow
def test_a_test_that_calibrates_leaves_the_ggml_switches_to_no_later_test(tmp_path):
    """ggml's switches are process-wide (GGML_CPU_TILED_MM_MIN and GGML_CPU_MULTICOL_MIN, read by
    ggml on every call, and inherited by child processes): after a test that calibrates and
    generates, in pytest's own process, they are as they were before it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "switch_probe.py").write_text(
        "import json, os\n"
        "KEYS = ('GGML_CPU_TILED_MM_MIN', 'GGML_CPU_FA_SPLIT_KV', 'GGML_CPU_MULTICOL_MIN')\n"
        "def pytest_runtest_logfinish(nodeid, location):\n"
        "    with open(os.environ['SWITCH_PROBE_OUT'], 'a') as fh:\n"
        "        fh.write(json.dumps([nodeid, [os.environ.get(k) for k in KEYS]]) + '\\n')\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GGML_CPU_TILED_MM_MIN", "GGML_CPU_FA_SPLIT_KV", "GGML_CPU_MULTICOL_MIN")}
    env.update(SWITCH_PROBE_OUT=str(tmp_path / "switches.jsonl"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]))
    here = Path(__file__).name
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "switch_probe", "-p", "no:cacheprovider",
                          f"{here}::test_calibration_measures_the_tiled_floor_and_leaves_the_environment",   # skips without the pair
                          f"{here}::test_adaptive_session_calibrates_and_keeps_output"],
                         cwd=Path(__file__).parent, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = [json.loads(line) for line in (tmp_path / "switches.jsonl").read_text().splitlines()]
    assert len(seen) == 2 and all(switches == [None, None, None] for _, switches in seen), seen
