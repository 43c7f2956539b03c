"""What each tuned constant of the engine is worth: each switched off or moved, beside the default.

Why it is shaped so:

* One target load. Per prompt, plain decoding, the default engine (`baseline`: the stages and
  budget `Options` gives `localspec generate` with no draft model, its n-gram stage reading a
  store learnt from the standard library) and one engine per variant run in turn, the order
  rotated prompt by prompt: a neighbour's load or the machine's drift falls on all of them alike,
  and each variant is paired with the baseline on the same prompt.
* The constants are engine/tuning.py's (and a function or two) that the engine reads while it
  builds or runs an engine (each VARIANTS entry says where); a variant sets them only around its own engine's
  construction and generations (`patched`) and puts them back, so the engine stays as it ships.
  Those captured at import as TreeBudget's defaults (DEFAULT_TREE_NODES) are varied through the
  variant's budget instead.
* A variant that cannot change anything in this run (a draft model's arms with no draft model,
  held batch shapes on a CPU) is not run; the report says why.
* The spread: a variant's tok/s over the baseline's, pooled over prompts, and a bootstrap of that
  ratio over prompts, resampled within each block. `repeat` is the baseline built a second time:
  its interval is what no change at all looks like on this machine.
* Engines start fresh for each block (a prompt set in one repetition), as a bench run does; the
  repetitions take different slices of each set.

Usage, from the repository root (the results go to OUT/ablation.json and OUT/ablation.txt):
  python dev/ablate.py --model TARGET.gguf --out OUT                 # preset by machine: cpu or gpu
  python dev/ablate.py --model TARGET.gguf --sets humaneval:4 --reps 1 --variants repeat --out OUT
"""
from __future__ import annotations

import argparse
import enum
import importlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from localspec.engine.config import TreeBudget


@dataclass(frozen=True)
class Patch:
    where: str      # "module:NAME" or "module:Class.NAME", an attribute the engine reads at run time
    value: Any


def _owner(where: str) -> tuple[Any, str]:
    module, _, path = where.partition(":")
    owner: Any = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    return owner, name


@contextmanager
def patched(patches: Sequence[Patch]) -> Iterator[None]:
    """The patches' values set for the block, and afterwards what was there before, also when the
    block raises. An attribute must be the owner's own (not inherited, not missing): a renamed
    constant is an error here, not a variant that silently changes nothing."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for p in patches:
            owner, name = _owner(p.where)
            if name not in vars(owner):
                raise AttributeError(f"{p.where}: no such attribute of its own (renamed or moved?)")
            saved.append((owner, name, vars(owner)[name]))
            setattr(owner, name, p.value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


class Need(enum.Enum):
    """What a variant needs in the baseline engine to change anything at all."""
    MODEL_STAGE = "a draft model or head among the stages"
    SEVERAL_ARMS = "several arms to choose among (a draft model or head among the stages)"
    STABLE_SHAPES = "held batch shapes (a GPU without cheap shape changes)"


@dataclass(frozen=True)
class Variant:
    name: str
    constant: str                       # what it varies, with the shipped value
    where: str                          # the file that holds it
    change: str                         # what the variant runs instead
    record: str = ""                    # the decision record that chose the shipped value
    patches: tuple[Patch, ...] = ()
    budget: tuple[tuple[str, Any], ...] = ()   # TreeBudget fields replaced in the baseline's
    needs: Need | None = None

    def budget_of(self, base: TreeBudget) -> TreeBudget:
        return replace(base, **dict(self.budget))


def keep_every_node(tree, probs, cost) -> np.ndarray:
    """prune.choose with pruning off: [tree.n] every drafted node verified."""
    return np.ones(tree.n, bool)


_ARMS = TreeBudget.arms


def _unpruned_arms(self: TreeBudget, with_models: bool = True, pruned: bool = False,
                   **kwargs: bool) -> tuple:
    """TreeBudget.arms as without a cost curve: the free drafters at several sizes, plain beside."""
    return _ARMS(self, with_models, pruned=False, **kwargs)


def variants() -> tuple[Variant, ...]:
    """One variant per tuned constant or mechanism."""
    tuning = "localspec.engine.tuning"
    return (
        Variant("repeat", "none: the baseline built a second time", "-", "the baseline"),
        Variant("tree-16", "DEFAULT_TREE_NODES = 32", "engine/config.py", "16", "0018",
                budget=(("max_nodes", 16),)),
        Variant("probe-1", "PROBE_ROUNDS = 4", "engine/tuning.py",
                "1 (single probe rounds)", "0009", (Patch(f"{tuning}:PROBE_ROUNDS", 1),),
                needs=Need.SEVERAL_ARMS),
        Variant("cheap-every-64", "CHEAP_EVERY = 8", "engine/tuning.py",
                "64 (= EXPLORE_EVERY: free arms probed like any other)", "0009",
                (Patch(f"{tuning}:CHEAP_EVERY", 64),), needs=Need.MODEL_STAGE),
        Variant("optimistic-0.999", "OPTIMISTIC = 0.9", "engine/tuning.py",
                "0.999 (drop only arms that cannot win at all)", "0001",
                (Patch(f"{tuning}:OPTIMISTIC", 0.999),), needs=Need.MODEL_STAGE),
        Variant("backoff-2", "BACKOFF = 8.0", "engine/tuning.py", "2.0 (before 0020)",
                "0020", (Patch(f"{tuning}:BACKOFF", 2.0),)),
        Variant("pool-backoff-1", "POOL_BACKOFF = 4.0", "engine/tuning.py",
                "1.0 (before 0020)", "0020", (Patch(f"{tuning}:POOL_BACKOFF", 1.0),)),
        Variant("no-pruning", "per-round pruning", "engine/policy.py, engine/prune.py",
                "every drafted node verified; free arms of 4, 8, 16, 32 nodes (the arms before 0020)",
                "0020", (Patch("localspec.engine.prune:choose", keep_every_node),
                         Patch("localspec.engine.config:TreeBudget.arms", _unpruned_arms))),
        Variant("hold-1", "HOLD = 16", "engine/tuning.py", "1 (a choice every round)", "0008",
                (Patch(f"{tuning}:HOLD", 1),), needs=Need.STABLE_SHAPES),
    )


# --- the measurement --------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    name: str                 # "humaneval#1": the set and the repetition
    workload: str
    prompts: tuple            # app.workloads.Prompt


@dataclass(frozen=True)
class Run:
    """One configuration's generation of one prompt."""
    block: str
    prompt: str
    config: str
    tokens: int
    seconds: float            # decode seconds (prefill left out, as bench does)
    calls: int                # target calls
    identical: bool | None    # greedy: the same tokens as plain decoding's (None: plain, or sampled)
    others: float | None = None   # CPU cores other processes kept busy meanwhile (None: unknown)
    attempt: int = 1          # the prompt's attempt this run belongs to (a disturbed one is run again)
    disturbed: bool = False   # others over the quiet limit in the last attempt: left out of comparisons


def rotation(names: Sequence[str], k: int) -> list[str]:
    """`names` starting at the k-th (mod len): prompt k's order, so each takes each place in turn."""
    k %= len(names)
    return [*names[k:], *names[:k]]


# On a shared machine another process's burst can slow one generation many times over (llama.cpp's
# threads wait for each other at every matmul, and one of them loses its core), which no spread
# statistic over a few dozen prompts absorbs. So each run records how busy the rest of the machine
# was; a prompt with a disturbed run is run again, all configurations, and one still disturbed
# after RETRIES is left out of the comparisons. Before a prompt the run waits for a quiet machine.
QUIET = 0.25       # cores the other processes may keep busy during a run
RETRIES = 2
QUIET_WAIT = 300   # seconds to wait for a quiet machine before a prompt, at most


def cpu_sample() -> tuple[float, int, int] | None:
    """(wall seconds, the machine's busy jiffies, this process's jiffies), or None without /proc."""
    try:
        head = Path("/proc/stat").read_text().split("\n", 1)[0].split()   # cpu user nice system idle iowait ...
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()   # utime, stime: [11], [12]
    except OSError:
        return None
    ticks = [int(x) for x in head[1:]]
    return time.time(), sum(ticks) - ticks[3] - ticks[4], int(own[11]) + int(own[12])


def others_busy(before: tuple[float, int, int] | None, after: tuple[float, int, int] | None,
                tick: float = 1 / os.sysconf("SC_CLK_TCK")) -> float | None:
    """Cores the machine's other processes kept busy on average between two cpu_samples."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return max(0.0, ((after[1] - before[1]) - (after[2] - before[2])) * tick / (after[0] - before[0]))


def wait_quiet(progress: Callable[[str], None], quiet: float = QUIET, limit: float = QUIET_WAIT) -> None:
    """Return once the other processes kept at most `quiet` cores busy for a second, or after `limit`."""
    give_up, said = time.time() + limit, False
    while time.time() < give_up:
        before = cpu_sample()
        time.sleep(1.0)
        busy = others_busy(before, cpu_sample())
        if busy is None or busy <= quiet:
            return
        if not said:
            progress(f"waiting for a quiet machine: other processes keep {busy:.1f} cores busy")
            said = True


def measure(loaded, store, stage_names: Sequence[str], base: TreeBudget, blocks: Sequence[Block],
            chosen: Sequence[Variant], request: Callable[[tuple], Any],
            progress: Callable[[str], None] = lambda s: None, deadline: float = float("inf"),
            on_prompt: Callable[[list[Run]], None] = lambda runs: None, quiet: float | None = QUIET) -> list[Run]:
    """Every block's prompts through plain decoding, the baseline and each variant (see the module
    docstring). `loaded`: engine.build.Loaded; `store`: the n-gram store of the stages; `request`:
    the GenerationRequest for a prompt's tokens. Stops before a prompt begun after `deadline`
    (time.time()); `on_prompt` gets the runs so far after each prompt. `quiet`: the cores other
    processes may keep busy during a run (see QUIET); None: whatever they do, nothing is run again."""
    from localspec.engine.generation import finish
    from localspec.engine.native import switches

    parts = replace(loaded.parts, store=store)
    by_name = {"baseline": Variant("baseline", "", "", ""), **{v.name: v for v in chosen}}
    names = ["plain", *by_name]
    runs: list[Run] = []
    k = 0
    for block in blocks:
        engines, stages = {"plain": loaded.engine([], TreeBudget(0))}, []
        for name, v in by_name.items():
            with patched(v.patches):
                built = loaded.stages(stage_names, parts)
                stages += built
                engines[name] = loaded.engine(built, v.budget_of(base))
        try:
            for i, prompt in enumerate(block.prompts):
                req = request(prompt.tokens)
                for attempt in range(1, RETRIES + 2):
                    if time.time() > deadline:
                        progress("stopped: past --stop-after")
                        return runs
                    if quiet is not None:
                        wait_quiet(progress, quiet)
                    gens, busy = {}, {}
                    for name in rotation(names, k):
                        v = by_name.get(name)
                        before = cpu_sample()
                        with patched(v.patches if v else ()), switches(loaded.numerics):
                            gens[name] = finish(engines[name].generate(req))
                        busy[name] = others_busy(before, cpu_sample())
                    k += 1
                    disturbed = [n for n in names if quiet is not None and (busy[n] or 0.0) > quiet]
                    if not disturbed or attempt > RETRIES:
                        break
                    progress(f"[{block.name} {i + 1}] again: other processes shared the CPU during "
                             + ", ".join(f"{n} ({busy[n]:.1f} cores)" for n in disturbed))
                plain = gens["plain"].tokens
                for name in names:
                    g = gens[name]
                    same = None if name == "plain" or not req.sampling.greedy else g.tokens == plain
                    runs.append(Run(block.name, prompt.name, name, g.stats.tokens, g.stats.decode_seconds,
                                    g.stats.target_calls, same,
                                    None if busy[name] is None else round(busy[name], 3), attempt,
                                    bool(disturbed)))
                on_prompt(runs)
                progress(f"[{block.name} {i + 1}/{len(block.prompts)}] " + "  ".join(
                    f"{n} {gens[n].stats.tokens_per_second:.1f}" for n in names) + " tok/s"
                    + (f" (attempt {attempt})" if attempt > 1 else ""))
        finally:
            for d in stages:
                if not d.uses_model:   # a model stage's close closes the shared model (loaded.close's)
                    d.close()
    return runs


# --- the spread -------------------------------------------------------------------------------

def pooled_ratio(pairs: Sequence[tuple[Run, Run]]) -> float:
    """(variant's tokens / seconds) / (baseline's tokens / seconds), each summed over the pairs
    (variant, baseline) of one prompt each: bench's tok/s ratio."""
    tv, sv = sum(v.tokens for v, _ in pairs), sum(v.seconds for v, _ in pairs)
    tb, sb = sum(b.tokens for _, b in pairs), sum(b.seconds for _, b in pairs)
    return (tv / sv) / (tb / sb) if tb and sv else float("nan")   # nan: nothing generated to compare


def interval(groups: Mapping[str, Sequence[tuple[Run, Run]]], level: float = 0.95, draws: int = 4000,
             seed: int = 0) -> tuple[float, float]:
    """The central `level` interval of pooled_ratio over bootstrap resamples of the prompts, drawn
    with replacement within each group (a block keeps its size and its share of the prompts)."""
    rng = np.random.default_rng(seed)
    sums = np.zeros((4, draws))       # [tokens v, seconds v, tokens b, seconds b] per draw
    for pairs in groups.values():
        cols = np.array([[v.tokens, v.seconds, b.tokens, b.seconds] for v, b in pairs], float).T   # [4, n]
        picks = rng.integers(0, len(pairs), (draws, len(pairs)))                                  # [draws, n]
        sums += cols[:, picks].sum(-1)
    ratios = (sums[0] / sums[1]) / (sums[2] / sums[3])
    tail = (1 - level) / 2
    lo, hi = np.quantile(ratios, [tail, 1 - tail])
    return float(lo), float(hi)


MIN_PROMPTS = 5   # an interval over fewer prompts is shown but judges nothing
CONTROL = "repeat"


def margins(control: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """How far from 1 the A/A control's intervals reach, by key ("all" and each workload): the
    drift and order effects that a bootstrap over prompts does not see."""
    return {k: max(0.0, 1 - lo, hi - 1) for k, (lo, hi) in control.items()}


def verdict(spans: Mapping[str, tuple[float, float]], margin: Mapping[str, float]) -> str:
    """From a variant's intervals (variant / baseline; "all" and each workload with MIN_PROMPTS or
    more): beyond the spread where an interval lies wholly outside 1 -/+ the control's margin for
    that key. "pays" when the shipped value is faster beyond it (the variant below) overall or on
    a workload and slower on none; "costs" the other way; "mixed" both; else "within spread"."""
    pays = any(hi < 1 - margin.get(k, 0.0) for k, (_, hi) in spans.items())
    costs = any(lo > 1 + margin.get(k, 0.0) for k, (lo, _) in spans.items())
    return "mixed" if pays and costs else "pays" if pays else "costs" if costs else "within spread"


def _paired(runs: Sequence[Run], name: str, base: str = "baseline") -> dict[str, list[tuple[Run, Run]]]:
    """Block -> [(variant's run, baseline's run)] per prompt both ran undisturbed."""
    index = {(r.block, r.prompt): r for r in runs if r.config == base and not r.disturbed}
    out: dict[str, list[tuple[Run, Run]]] = {}
    for r in runs:
        if r.config == name and not r.disturbed and (r.block, r.prompt) in index:
            out.setdefault(r.block, []).append((r, index[r.block, r.prompt]))
    return out


def summarize(runs: Sequence[Run], chosen: Sequence[Variant], workload_of: Mapping[str, str],
              level: float = 0.95, draws: int = 4000) -> list[dict]:
    """A row per configuration: tok/s, tokens per call, identical to plain; for the variants the
    ratio to the baseline with its interval, overall, by workload and by block, and the verdict
    (against the control's margins where the control ran)."""
    rows, spans = [], {}
    for name in ["plain", "baseline", *(v.name for v in chosen)]:
        mine = [r for r in runs if r.config == name and not r.disturbed]
        tokens, seconds, calls = (sum(getattr(r, f) for r in mine) for f in ("tokens", "seconds", "calls"))
        if not tokens:
            continue      # not run, or every prompt ended at once: nothing to compare
        judged = [r.identical for r in mine if r.identical is not None]
        row: dict = {"config": name, "tok_s": round(tokens / seconds, 2), "tokens_per_call": round(tokens / calls, 3),
                     "tokens": tokens, "prompts": len(mine),
                     "identical": f"{sum(judged)}/{len(judged)}" if judged else None}
        groups = _paired(runs, name)
        if name not in ("plain", "baseline") and groups:
            workloads: dict[str, dict[str, list]] = {}
            for block, pairs in groups.items():
                if any(b.tokens for _, b in pairs):   # a block whose prompts all ended at once says nothing
                    workloads.setdefault(workload_of[block], {})[block] = pairs
            row["ratio"] = round(pooled_ratio([p for g in groups.values() for p in g]), 3)
            row["interval"] = [round(x, 3) for x in interval(groups, level, draws)]
            row["by_workload"] = {w: {"ratio": round(pooled_ratio([p for g in gs.values() for p in g]), 3),
                                      "interval": [round(x, 3) for x in interval(gs, level, draws)],
                                      "prompts": sum(map(len, gs.values()))} for w, gs in workloads.items()}
            row["by_block"] = {b: round(pooled_ratio(g), 3) for b, g in groups.items()}
            spans[name] = {"all": tuple(row["interval"]), **{w: tuple(x["interval"]) for w, x in row["by_workload"].items()
                                                            if x["prompts"] >= MIN_PROMPTS}}
            if sum(map(len, groups.values())) < MIN_PROMPTS:
                spans.pop(name)
                row["verdict"] = f"fewer than {MIN_PROMPTS} prompts"
        rows.append(row)
    margin = margins(spans.pop(CONTROL, {}))
    for row in rows:
        if row["config"] == CONTROL and "verdict" not in row:
            row["verdict"] = "the control: margins " + ", ".join(f"{k} {m:.3f}" for k, m in margin.items())
            row["margin"] = {k: round(m, 3) for k, m in margin.items()}
        elif row["config"] in spans:
            row["verdict"] = verdict(spans[row["config"]], margin)
    return rows


def format_table(report: dict) -> str:
    level = round(100 * report["level"])
    workloads = list(dict.fromkeys(b.split("#")[0] for b in report["blocks"]))
    lines = [f"{report['machine']}, {report['threads']} threads; commit {report['commit']}",
             f"target {Path(report['target']).name}; {report['max_tokens']} new tokens, T={report['temperature']}; "
             f"blocks: {', '.join(report['blocks'])}",
             f"baseline: stages {'+'.join(report['stages'])}, {report['budget']}; n-grams: {report['ngram_source']}",
             f"ratio: variant tok/s / baseline tok/s, pooled over prompts; [{level}% interval: bootstrap over prompts "
             f"within blocks]; beyond spread: an interval outside 1 -/+ the control's ({CONTROL}) reach from 1",
             f"{'config':<18}{'tok/s':>7}{'tok/call':>9}{'ratio':>7}  {'interval':<15}"
             + "".join(f"{w[:10]:<22}" for w in workloads) + f"{'identical':>10}  verdict", "-" * 150]
    for r in report["rows"]:
        span = "[{:.3f},{:.3f}]".format(*r["interval"]) if "interval" in r else ""
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else ""
        by = r.get("by_workload", {})
        cells = "".join((f"{by[w]['ratio']:.2f} [{by[w]['interval'][0]:.2f},{by[w]['interval'][1]:.2f}]"
                         if w in by else "") .ljust(22) for w in workloads)
        lines.append(f"{r['config']:<18}{r['tok_s']:>7.2f}{r['tokens_per_call']:>9.2f}{ratio:>7}  {span:<15}"
                     f"{cells}{r['identical'] or '-':>10}  {r.get('verdict', '')}")
    lines.append("")
    for v in report["variants"]:
        lines.append(f"{v['name']}: {v['constant']} ({v['where']}) -> {v['change']}"
                     + (f"  [{v['record']}]" if v["record"] else ""))
    if report["run_again"]:
        lines.append(f"run again (other processes shared the CPU): {', '.join(report['run_again'])}")
    if report["left_out"]:
        lines.append(f"left out (still shared after {RETRIES} more runs): {', '.join(report['left_out'])}")
    for name, why in report["skipped"].items():
        lines.append(f"not run: {name}: it needs {why}")
    return "\n".join(lines)


# --- the command ------------------------------------------------------------------------------

# sets, repetitions, new tokens a prompt, --stop-after, whether other processes' CPU use counts
# (a GPU's target does not share the host's cores: there a build or a copy running beside it is fine)
PRESETS = {
    "cpu": ("humaneval:12,newcode:7,edit:6", 2, 128, 4200, True),
    "gpu": ("humaneval:8,newcode:6,edit:6,chat:4", 2, 256, 170, False),
}


def _machine(offloaded: bool) -> str:
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
        flags = set(next(line for line in info if line.startswith("flags")).split())
        cpu += f", {os.cpu_count()} cores" + "".join(f", {name}" for flag, name in
                                                      (("avx512f", "AVX-512"), ("amx_tile", "AMX")) if flag in flags)
    except (OSError, StopIteration):
        cpu = "unknown CPU"
    if not offloaded:
        return cpu
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        gpu = "a GPU"
    return f"{gpu} (host CPU {cpu})"


def _commit() -> str | None:
    """The checkout's commit, and the tracked files that differ from it (None: not a git checkout)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout
    try:
        changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
        return git("rev-parse", "--short", "HEAD").strip() + (f" with changes to {', '.join(changed)}"
                                                             if changed else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def write(out: Path, report: dict, runs: Sequence[Run], chosen: Sequence[Variant], level: float,
          complete: bool) -> None:
    """OUT/ablation.json (the report, its rows and every run) and OUT/ablation.txt (the table)."""
    workload_of = {b: b.split("#")[0] for b in report["blocks"]}
    report.update(level=level, complete=complete, rows=summarize(runs, chosen, workload_of, level),
                  run_again=sorted({f"{r.block} {r.prompt}" for r in runs if r.attempt > 1}),
                  left_out=sorted({f"{r.block} {r.prompt}" for r in runs if r.disturbed}),
                  runs=[asdict(r) for r in runs])
    (out / "ablation.json").write_text(json.dumps(report, indent=1))
    (out / "ablation.txt").write_text(format_table(report) + ("\n" if complete else "\n(incomplete)\n"))


def joined(reports: Sequence[dict]) -> tuple[dict, list[Run]]:
    """Several runs' reports as one (the first's settings) and their runs; a block that a later
    report ran too is taken from the later one."""
    report = dict(reports[0])
    runs: list[Run] = []
    for r in reports:
        mine = [Run(**x) for x in r["runs"]]
        ran = {x.block for x in mine}
        runs = [x for x in runs if x.block not in ran] + mine
    report["blocks"] = list(dict.fromkeys(b for r in reports for b in r["blocks"] if any(x.block == b for x in runs)))
    names = {v["name"] for v in report["variants"]}
    report["variants"] = report["variants"] + [v for r in reports[1:] for v in r["variants"] if v["name"] not in names]
    report["commit"] = "; ".join(dict.fromkeys(str(r["commit"]) for r in reports))
    report["wall_seconds"] = round(sum(r.get("wall_seconds", 0) for r in reports), 1)
    report["complete"] = all(r["complete"] for r in reports)
    report["processes"] = len(reports)
    return report, runs


def _blocks(session, sets: str, reps: int, first: int = 1) -> list[Block]:
    """Each "workload:N" set, repetition r (from `first` to `reps`) taking prompts [(r-1)*N, r*N),
    tokenised by `session`; repetition by repetition, so a run stopped early (--stop-after) lacks
    the last one's tail."""
    from localspec.app import workloads

    built = []
    for spec in sets.split(","):
        workload, n = spec.split(":")
        built.append((workload, int(n), workloads.build(workload, int(n) * reps, session.raw_prompt,
                                                        session.chat_prompt)))
    return [Block(f"{workload}#{r + 1}", workload, tuple(prompts[r * n:(r + 1) * n]))
            for r in range(first - 1, reps) for workload, n, prompts in built if prompts[r * n:(r + 1) * n]]


def run(options, blocks: Sequence[Block], store, source: str, out: Path, request: Callable[[tuple], Any], *,
        wanted: Sequence[str] | None = None, level: float = 0.95, stop_after: float = float("inf"),
        quiet: float | None = QUIET, say: Callable[[str], None] = lambda s: None) -> dict:
    """Load the target of `options` (engine.options.Options) once, run `blocks` through plain decoding,
    the baseline (its stages and budget) and the variants (`wanted`, default all) that can change
    something here, and write OUT/ablation.json and .txt as it goes; the report. `store`: what the
    n-gram stage reads, described by `source`."""
    from localspec.engine.build import load
    from localspec.engine.shapes import Shapes

    started, commit = time.time(), _commit()
    stage_names = options.stages
    neural = tuple(s for s in stage_names if s not in ("maxgram", "personal"))
    top = max(v.budget_of(options.budget).max_nodes for v in variants())
    loaded = load(replace(options, budget=replace(options.budget, max_nodes=top)), neural, measure=True)
    try:
        base = loaded.engine(loaded.stages(stage_names, replace(loaded.parts, store=store)), options.budget)
        holds = {Need.MODEL_STAGE: any(d.uses_model for d in base.stages),
                 Need.SEVERAL_ARMS: base.policy.bandit is not None,
                 Need.STABLE_SHAPES: base.policy.shapes is Shapes.STABLE}
        every = variants()
        wanted = wanted or [v.name for v in every]
        chosen = [v for v in every if v.name in wanted and (v.needs is None or holds[v.needs])]
        sampling = request(()).sampling
        report: dict = {
            "machine": _machine(loaded.model.n_gpu_layers != 0), "threads": loaded.model.n_threads,
            "commit": commit, "target": str(options.model), "draft": options.draft and str(options.draft),
            "stages": list(stage_names), "budget": f"adaptive, up to {options.budget.max_nodes} nodes",
            "arms": [str(a) for a in base.policy.arms], "shapes": base.policy.shapes.value,
            "calibration": loaded.costs.to_dict() if loaded.costs else None, "ngram_source": source,
            "max_tokens": request(()).max_tokens, "temperature": sampling.temperature, "seed": sampling.seed,
            "quiet_cores": quiet, "blocks": [b.name for b in blocks],
            "skipped": {v.name: v.needs.value for v in every if v.name in wanted and v not in chosen},
            "variants": [{k: v for k, v in asdict(x).items() if k in ("name", "constant", "where", "change", "record")}
                         for x in chosen]}
        for d in base.stages:
            if not d.uses_model:   # a model stage's close closes the shared model
                d.close()

        def written(runs: list[Run], complete: bool) -> None:
            report["wall_seconds"] = round(time.time() - started, 1)
            write(out, report, runs, chosen, level, complete)

        runs = measure(loaded, store, stage_names, options.budget, blocks, chosen, request, say,
                       deadline=time.time() + stop_after, on_prompt=lambda runs: written(runs, False), quiet=quiet)
        written(runs, True)
        return report
    finally:
        loaded.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="the target, a .gguf file")
    p.add_argument("--draft", help="a .gguf draft model (the baseline then drafts with it, as generate would)")
    p.add_argument("--preset", choices=list(PRESETS), help="default: gpu where llama.cpp offloads, else cpu")
    p.add_argument("--sets", help="comma-separated WORKLOAD:N (humaneval, newcode, edit, chat)")
    p.add_argument("--reps", type=int, help="repetitions, each over the next N prompts of every set")
    p.add_argument("--first-rep", type=int, default=1,
                   help="run repetitions from this one on (another process's share of a split run; --from joins them)")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--stop-after", type=float, help="seconds of measuring after which no prompt begins")
    p.add_argument("--variants", help="comma-separated names (default: all that can change something here)")
    p.add_argument("--learn", default=sysconfig.get_paths()["stdlib"],
                   help="files or folder the n-gram store learns (default: this Python's standard library)")
    p.add_argument("--learn-max-tokens", type=int, default=1_000_000)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int)
    p.add_argument("--gpu-policy", action="store_true",
                   help="the policy a GPU runs (its arms, its batch shapes) on this machine: tries the "
                        "GPU's variants here")
    p.add_argument("--ignore-load", action="store_true",
                   help="whatever else runs on the machine: no waiting for it, no prompt run again (see QUIET; "
                        "the gpu preset's default)")
    p.add_argument("--level", type=float, default=0.95, help="the intervals' coverage")
    p.add_argument("--out", required=True, help="folder for ablation.json and ablation.txt")
    p.add_argument("--from", dest="again", metavar="JSON", nargs="+",
                   help="no run: summarise the runs of earlier ablation.json files again, joined (runs of "
                        "one machine and model split over processes, e.g. --first-rep)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.again:
        report, runs = joined([json.loads(Path(f).read_text()) for f in args.again])
        fields = ("name", "constant", "where", "change", "record")
        chosen = [Variant(**{k: v[k] for k in fields}) for v in report["variants"]]
        write(out, report, runs, chosen, args.level, report["complete"])
        print((out / "ablation.txt").read_text())
        return 0
    if not args.model:
        p.error("--model is required (or --from an earlier ablation.json)")
    known = {v.name for v in variants()}
    wanted = args.variants.split(",") if args.variants else None
    if wanted and set(wanted) - known:
        p.error(f"unknown variants {sorted(set(wanted) - known)}; choose from {', '.join(sorted(known))}")

    from localspec.app.bench import open_ngram_store
    from localspec.engine.config import GenerationRequest, SamplingParams
    from localspec.engine.llama_model import gpu_offload_supported
    from localspec.engine.options import Options
    from localspec.engine.session import Session

    preset = PRESETS[args.preset or ("gpu" if gpu_offload_supported() else "cpu")]
    sets, reps, max_tokens, stop_after = (given if given is not None else default for given, default
                                          in zip((args.sets, args.reps, args.max_tokens, args.stop_after), preset))
    quiet = QUIET if preset[4] and not args.ignore_load else None
    options = Options(Path(args.model), draft=Path(args.draft) if args.draft else None, use_head=False,
                      n_threads=args.threads, stable_shapes=True if args.gpu_policy else None)
    sampling = SamplingParams(temperature=args.temperature, top_k=options.sampling.top_k,
                              top_p=options.sampling.top_p, seed=args.seed)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.time()
    with tempfile.TemporaryDirectory(prefix="localspec-ablate-") as scratch:
        probe = Session(replace(options, speculation=False))   # tokenises the prompts and the store's files
        try:
            blocks = _blocks(probe, sets, reps, args.first_rep)
            store, source = open_ngram_store(options.model, [args.learn], args.learn_max_tokens, probe.raw_prompt,
                                             Path(scratch))
        finally:
            probe.close()
        say(f"n-gram store: {source} ({time.time() - started:.0f}s)")
        try:
            run(options, blocks, store, source, out, lambda tokens: GenerationRequest(tokens, max_tokens, sampling),
                wanted=wanted, level=args.level, stop_after=stop_after,
                quiet=quiet, say=say)
        finally:
            store.close()
    print((out / "ablation.txt").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
