"""`localspec bench`: configurations side by side in ONE run, on one loaded target.

The target and the draft load once; each configuration is an Engine over the same Target with its
own stage list and tree budget. Every prompt runs through every configuration in turn, so machine
noise spreads evenly; "identical" compares each configuration's tokens with plain decoding's.
"""
from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from localspec.engine.costs import Costs
from localspec.engine.config import (
    DEFAULT_TREE_NODES,
    HEAD_LIMITS,
    DraftLimits,
    GenerationRequest,
    SamplingParams,
    TreeBudget,
)
from localspec.engine.build import Loaded, load
from localspec.engine.decode import Engine
from localspec.engine.errors import LocalspecError
from localspec.engine.generation import Generation, finish
from localspec.engine.llama_model import LlamaModel, gpu_offload_supported
from localspec.engine.native import switches
from localspec.engine.numerics import first_difference, top2_gap
from localspec.engine.options import Options
from localspec.engine.session import Session, draft_runs_in_torch

from . import conversations, workloads
from .humaneval_check import pass_at_1
from .workloads import Prompt


@dataclass(frozen=True)
class BenchConfig:
    name: str
    stages: tuple[str, ...]          # "maxgram", "draft"
    budget: TreeBudget
    draft_limits: DraftLimits = DraftLimits()


CONFIGS = {
    "plain": BenchConfig("plain", (), TreeBudget(0)),
    "maxgram": BenchConfig("maxgram", ("maxgram",), TreeBudget(max_nodes=8)),
    "ngram": BenchConfig("ngram", ("ngram",), TreeBudget(max_nodes=8)),
    "draft-linear": BenchConfig("draft-linear", ("draft",), TreeBudget(max_nodes=4),
                                DraftLimits(max_depth=4, branching=1, width=1, chain=0)),
    "draft-tree": BenchConfig("draft-tree", ("draft",), TreeBudget(max_nodes=8),
                              DraftLimits(max_depth=5, branching=2, width=4, chain=0)),
    "staged": BenchConfig("staged", ("maxgram", "ngram", "draft"), TreeBudget(max_nodes=12),
                          DraftLimits(max_depth=6, branching=2, width=4)),
    "adaptive": BenchConfig("adaptive", ("maxgram", "ngram", "draft"),
                            TreeBudget(max_nodes=DEFAULT_TREE_NODES, adaptive=True),
                            DraftLimits(max_depth=6, branching=2, width=4)),
    # the adaptive budget with the free drafters alone: what a head or a draft model adds to it
    "adaptive-nomodel": BenchConfig("adaptive-nomodel", ("maxgram", "ngram"),
                                 TreeBudget(max_nodes=DEFAULT_TREE_NODES, adaptive=True)),
    # a draft head (--head) on the target's hidden state: alone, and in the adaptive budget
    "head": BenchConfig("head", ("head",), TreeBudget(max_nodes=12), HEAD_LIMITS),
    "adaptive-head": BenchConfig("adaptive-head", ("maxgram", "ngram", "head"),
                                 TreeBudget(max_nodes=DEFAULT_TREE_NODES, adaptive=True), HEAD_LIMITS),
    # the same with the head growing its whole budget every round: what its growth floor saves
    "adaptive-head-full": BenchConfig("adaptive-head-full", ("maxgram", "ngram", "head"),
                                      TreeBudget(max_nodes=DEFAULT_TREE_NODES, adaptive=True),
                                      replace(HEAD_LIMITS, floor=0.0)),
}


def largest_tree(names: Sequence[str]) -> int:
    """The tree budget the shared target opens with: the largest of the configurations'; plain
    alone drafts nothing, but the target still opens with a budget of at least one node."""
    return max([config(n).budget.max_nodes for n in names] + [1])


def check_out(out: Path) -> None:
    """LocalspecError, before a run, where `out` cannot be the folder the results are written to
    (write_outputs): a run of minutes would lose its results if this were found only at its end.
    The folder is made now and a file created in it and removed: what the write will do, so that
    permissions, a read-only file system or a file in the path's way are all found."""
    fix = "Pass --out a folder you can write in, or a new folder's path under one"
    if out.exists() and not out.is_dir():
        raise LocalspecError("Cannot write the results", f"--out '{out}' is a file, not a folder", fix)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise LocalspecError("Cannot write the results",
                             f"--out '{out}': {err.strerror or err}"
                             + (f" ('{err.filename}')" if err.filename and str(err.filename) != str(out) else ""),
                             fix) from None


# what generate, the chat and serve run with a draft and no flags: Options' own budget and draft
# limits (`bench --serve` compares the server with it); by name only, not in a default run
DEFAULT = BenchConfig("default", ("maxgram", "ngram", "draft"), Options.budget, Options.draft_limits)


def config(name: str) -> BenchConfig:
    """A configuration by name: one of CONFIGS, "default" (DEFAULT), "adaptive-N", the adaptive
    one with trees of at most N nodes (to compare budgets side by side in one run), "head-N", the head alone with
    trees of N nodes (its acceptance at a tree size: issue 19 asks for it at 16), or
    "head-chain-N", the head alone drafting one chain of N tokens (one row a step)."""
    if name in CONFIGS:
        return CONFIGS[name]
    if name == DEFAULT.name:
        return DEFAULT
    m = re.fullmatch(r"head-chain-([0-9]+)", name)
    if m and 1 <= int(m.group(1)) <= 16:
        depth = int(m.group(1))
        return BenchConfig(name, ("head",), TreeBudget(max_nodes=depth),
                           replace(HEAD_LIMITS, max_depth=depth, branching=1, width=1))
    m = re.fullmatch(r"(adaptive|head)-([0-9]+)", name)
    if m and 1 <= int(m.group(2)) <= 64:
        nodes = int(m.group(2))
        if m.group(1) == "head":
            return BenchConfig(name, ("head",), TreeBudget(max_nodes=nodes), HEAD_LIMITS)
        base = CONFIGS["adaptive"]
        return BenchConfig(name, base.stages, TreeBudget(max_nodes=nodes, adaptive=True), base.draft_limits)
    raise KeyError(name)


@dataclass
class ConfigResult:
    name: str
    tokens: int = 0
    seconds: float = 0.0
    target_calls: int = 0
    identical: int = 0
    prompts: int = 0
    gaps: list[float] = field(default_factory=list)   # plain's top-2 gap where outputs part
    stages: dict[str, dict] = field(default_factory=dict)
    outputs: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    pruned: int = 0
    redecoded: int = 0
    budget: dict = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def add(self, gen: Generation, plain_tokens: list[int] | None, gap: float | None) -> None:
        st = gen.stats
        self.tokens += st.tokens
        self.seconds += st.decode_seconds
        self.target_calls += st.target_calls
        self.pruned += st.pruned
        self.redecoded += st.redecoded
        self.budget = st.budget or self.budget   # the adaptive policy's state after this prompt
        for phase, sec in st.seconds.items():
            self.phases[phase] = self.phases.get(phase, 0.0) + sec
        self.prompts += 1
        self.identical += int(plain_tokens is None or gen.tokens == plain_tokens)
        if gap is not None:
            self.gaps.append(gap)
        self.outputs.append(gen.tokens)
        self.texts.append(gen.text)
        for s in st.stages:
            agg = self.stages.setdefault(s.name, {"proposed": [], "accepted": [], "rounds": 0,
                                                  "seconds": 0.0})
            agg["rounds"] += s.rounds
            agg["seconds"] += s.seconds
            for key, values in (("proposed", s.proposed), ("accepted", s.accepted)):
                row = agg[key]
                row.extend([0] * (len(values) - len(row)))
                for d, v in enumerate(values):
                    row[d] += v


def _engines(loaded: Loaded, store, names: Sequence[str],
             skipped: dict[str, list[str]] | None = None) -> dict[str, Engine]:
    """One Engine per configuration over the loaded target, its stages built by name by the
    builder with the configuration's limits; a configuration that needs a missing draft model,
    n-gram store or head is skipped (`skipped` gets its missing stages). The loaded draft model
    (in llama.cpp or PyTorch) is shared by every configuration's draft stage; `store` is the
    n-gram store the "ngram" stage reads."""
    in_torch = loaded.parts.torch_lm is not None
    engines = {}
    for name in names:
        cfg = config(name)
        limits = cfg.draft_limits
        head_limits = limits
        if cfg.budget.adaptive and limits.floor is None:   # the head's floor here (build.load)
            head_limits = replace(limits, floor=loaded.parts.head_limits.floor)
        parts = replace(loaded.parts, store=store, draft_limits=limits, head_limits=head_limits)
        stages = ["torch-draft" if s == "draft" and in_torch else s for s in cfg.stages]
        missing = [s for s, kind in zip(cfg.stages, stages) if not parts.has(kind)]
        if missing:
            if skipped is not None:
                skipped[name] = missing
            continue
        engine = engines[name] = loaded.engine(loaded.stages(stages, parts), cfg.budget)
        if engine.policy.bandit is not None:
            engine.policy.bandit.trace = []
    return engines


def _curve(loaded: Loaded, names: Sequence[str]) -> Costs | None:
    """The calibration with the own cost curve of the stages `names` (a PyTorch draft and a head
    time themselves): what the configurations that run them prune by, measured once a run (the
    builder keeps it). None where bench does not calibrate."""
    return loaded.stage_costs(loaded.stages(names)) if loaded.costs is not None else None


_STAGE_OPTION = {"draft": "a draft model (--draft)", "ngram": "an n-gram store (--learn)",
                 "head": "a draft head (--head)"}


def run_bench(target: Path, draft: Path | None, prompts: Sequence[Prompt], names: Sequence[str],
              max_tokens: int, sampling: SamplingParams, n_ctx: int, store=None,
              progress: Callable[[str], None] = lambda s: None, check: bool = True,
              torch_draft: bool = False, head: Path | None = None, exact: bool = False,
              n_threads: int | None = None, beside: Callable[[Prompt], None] | None = None) -> dict:
    """Run every configuration on every prompt; the report. `store`: the n-gram store the "ngram"
    stage reads (configurations with that stage are skipped without one). `check`: HumanEval
    pass@1 for prompts that carry a problem. `torch_draft`: run the draft in PyTorch (a
    transformers folder always is; a .gguf is dequantised), on the GPU with CUDA graphs.
    `head`: a draft head for the "head" configurations (the target hands back its hidden states
    in those alone: the others run as they would without a head). `exact`: the target in batch-invariant
    numerics (plain too), where greedy configurations must match plain token for token.
    `n_threads`: CPU threads for the models (None: the free cores, engine/cores.py).
    `beside`: called with each prompt once every configuration has decoded it (`bench --serve`
    sends it to its servers there, so they take turns with the configurations prompt by prompt)."""
    max_nodes = largest_tree(names)
    uses_head = head is not None and any("head" in config(n).stages for n in names)
    in_torch = draft_runs_in_torch(draft, torch_draft)
    # the shared target, draft and head, loaded by the builder; bench builds each
    # configuration's stages over them
    options = Options(target, draft=draft, torch_draft=in_torch, head=head if uses_head else None,
                      speculation=True, n_ctx=n_ctx, exact=exact, n_threads=n_threads,
                      n_gpu_layers=0 if exact else -1,   # exact: CPU only
                      budget=TreeBudget(max_nodes=max_nodes),
                      draft_limits=max((config(n).draft_limits for n in names), key=lambda d: d.pad_rows))
    neural = (("torch-draft",) if in_torch else ("draft",)) if draft is not None else ()
    gpu = gpu_offload_supported() and options.n_gpu_layers != 0
    loaded = load(options, neural + (("head",) if uses_head else ()),
                  measure=any(config(n).budget.adaptive for n in names) or gpu)
    try:
        costs = _curve(loaded, neural)
        head_costs = _curve(loaded, ("head",)) if uses_head else None
        skipped: dict[str, list[str]] = {}
        engines = _engines(loaded, store, names, skipped)
        for name, missing in skipped.items():
            progress(f"skipped {name}: it needs {' and '.join(_STAGE_OPTION[s] for s in missing)}")
        results = {name: ConfigResult(name) for name in engines}
        started = time.time()
        for i, prompt in enumerate(prompts):
            plain_tokens = None
            with switches(loaded.numerics):   # the run's decodes, under its calibration's switches
                for name, engine in engines.items():
                    if uses_head:   # a configuration without the head runs as a target without one would
                        loaded.model.set_hidden("head" in config(name).stages)
                    request = GenerationRequest(prompt.tokens, max_tokens, sampling)
                    gen = finish(engine.generate(request))
                    if name == "plain":
                        plain_tokens = gen.tokens
                        results[name].add(gen, None, None)
                        continue
                    gap = (_divergence_gap(loaded.model, prompt.tokens, plain_tokens, gen.tokens)
                           if sampling.greedy else None)   # sampled outputs are not expected to match
                    results[name].add(gen, plain_tokens, gap)
            progress(f"[{i + 1}/{len(prompts)}] {prompt.name}  " + "  ".join(
                f"{n} {r.tok_s:.1f}" for n, r in results.items()) + " tok/s")
            if beside is not None:
                beside(prompt)
        report = _report(results, target, draft, len(prompts), max_tokens, sampling,
                         time.time() - started, loaded.model)
        report["completions"] = [{"prompt": p.name, **{n: r.texts[i] for n, r in results.items()}}
                                 for i, p in enumerate(prompts)]
        lm = loaded.parts.torch_lm
        if draft is not None:
            report["draft_runtime"] = ("llama.cpp" if lm is None else
                                       f"pytorch {lm.device.type} {str(lm.dtype)[6:]}"
                                       + (" cuda-graphs" if lm.static_shapes
                                          and lm.device.type == "cuda" else ""))
        head_model = loaded.parts.head
        if head_model is not None:
            report["head"] = {"file": head_model.path.name, **{k: v for k, v in head_model.meta.items()
                                                                if k != "format"}}
            report["head"]["numerics"] = "int8 weights" if head_model.int8 else str(head_model.dtype)[6:]
            report["head"]["growth_floor"] = loaded.parts.head_limits.floor
            if head_model.device.type == "cuda":   # a GPU's step: compiled, or why not
                report["head"]["compiled"] = head_model.compiled
                if head_model.compile_error:
                    report["head"]["compile_error"] = head_model.compile_error
            if head_costs is not None:
                report["head"]["step_ms"] = {n: round(1e3 * s, 3) for n, s in head_costs.draft.items()}
        if costs is not None:
            report["calibration"] = costs.to_dict()
            report["dropped_arms"] = {n: [str(a) for a in e.policy.dropped]
                                      for n, e in engines.items() if e.policy.dropped}
        traces = {n: {"arms": [str(a) for a in e.policy.bandit.arms],
                      "runs": [[a, k, t, round(1e3 * sec, 2), rates] for a, k, t, sec, rates
                               in e.policy.bandit.trace[:_TRACE_RUNS]]}
                  for n, e in engines.items() if e.policy.bandit is not None and e.policy.bandit.trace}
        if traces:   # [arm, rounds, tokens, ms, every arm's tok/s estimate when the run began]
            report["budget_trace"] = traces
        problems = [p.problem for p in prompts]
        if check and all(problems):
            progress("checking HumanEval completions (pass@1)")
            cache: dict = {}
            for row, r in zip(report["rows"], results.values()):
                row["pass_at_1"] = f"{pass_at_1(problems, r.texts, cache)}/{len(problems)}"
        return report
    finally:
        loaded.close()


_LEARN_SUFFIXES = (".py", ".md", ".txt")
_TRACE_RUNS = 5000   # the adaptive budget's runs of one arm kept in bench.json


def bench_inputs(model: Path, workload: str, limit: int, learn: Sequence[str], learn_max_tokens: int,
                 scratch: Path | None, n_ctx: int = Options.n_ctx):
    """A workload's prompts and the store the "ngram" stage reads (`open_ngram_store`), both
    tokenised by one plain session of `model`, closed before this returns. Returns (prompts,
    store, a description of the store's source)."""
    probe = Session(Options(model, speculation=False, n_ctx=n_ctx))
    try:
        if workload == "conversation":        # (name, each turn's user message): bench_conversation.py
            prompts = conversations.conversations(limit)
        elif workload == "conversation-long":
            prompts = conversations.long_conversation(lambda text: len(probe.raw_prompt(text)), limit)
        else:
            prompts = workloads.build(workload, limit, probe.raw_prompt, probe.chat_prompt)
        store, source = open_ngram_store(model, learn, learn_max_tokens, probe.raw_prompt, scratch)
    finally:
        probe.close()
    return prompts, store, source


def open_ngram_store(model: Path, learn: Sequence[str], max_tokens: int,
                     tokenize: Callable[[str], list[int]], scratch: Path | None):
    """The store the "ngram" stage reads: the user's personal store, or (with `learn`) a scratch
    store built from those files for this run. Returns (store, a description of its source)."""
    from localspec.models.ngram_store import NgramStore, vocab_key

    if not learn:
        store = NgramStore.open(vocab_key(model), label=model.name)
        info = store.info()
        return store, f"personal store: {info.n_sources} sources, {info.n_ngrams} n-grams"
    files: list[Path] = []
    for item in learn:
        path = Path(item).expanduser()
        if path.is_dir():
            files += sorted(f for f in path.rglob("*") if f.suffix in _LEARN_SUFFIXES and f.is_file())
        elif path.is_file():
            files.append(path)
        else:
            raise LocalspecError("Nothing to learn from", f"'{item}' is not a file or folder",
                                 "Pass existing files or folders to --learn")
    store = NgramStore.open(vocab_key(model), scratch / "bench-ngrams.sqlite")
    total, used = 0, 0
    for f in files:
        if total >= max_tokens:
            break
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        tokens = tokenize(text)
        store.add("file", str(f), tokens)
        total += len(tokens)
        used += 1
    return store, f"{used} files from {', '.join(learn)}: {total} tokens"


def _divergence_gap(model: LlamaModel, prompt: Sequence[int], plain: list[int],
                    spec: list[int]) -> float | None:
    """Plain decoding's top-2 logit gap where `spec` first differs from it (None if identical)."""
    i = first_difference(plain, spec)
    if i < 0 or i >= min(len(plain), len(spec)):
        return None if i < 0 else 0.0
    return top2_gap(model, list(prompt) + plain[:i])


def _report(results: dict[str, ConfigResult], target: Path, draft: Path | None, n: int,
            max_tokens: int, sampling: SamplingParams, wall: float, model: LlamaModel) -> dict:
    base = results.get("plain")
    rows = []
    for r in results.values():
        acc = {name: {"acceptance": round(sum(s["accepted"]) / max(1, sum(s["proposed"])), 4),
                      "accepted_by_depth": s["accepted"], "proposed_by_depth": s["proposed"],
                      "rounds": s["rounds"], "propose_seconds": round(s["seconds"], 3)}
               for name, s in r.stages.items()}
        rows.append({"config": r.name, "tok_s": round(r.tok_s, 2),
                     "speedup": round(r.tok_s / base.tok_s, 3) if base and base.tok_s else None,
                     "tokens": r.tokens, "seconds": round(r.seconds, 2),
                     "tokens_per_call": round(r.tokens / max(1, r.target_calls), 3),
                     "target_calls": r.target_calls, "pruned_nodes": r.pruned,
                     "redecoded": r.redecoded,
                     "seconds_by_phase": {k: round(v, 3) for k, v in r.phases.items()},
                     "budget": r.budget,
                     "identical": f"{r.identical}/{r.prompts}",
                     "max_gap_at_difference": round(max(r.gaps), 4) if r.gaps else None,
                     "stages": acc})
    return {"machine": {"cpu": platform.processor() or platform.machine(), "threads": model.n_threads,
                        "gpu_offload": gpu_offload_supported(), "gpu_layers": model.n_gpu_layers},
            "numerics": "exact" if model.exact else "fast",
            "target": str(target), "draft": str(draft) if draft else None, "n_ctx": model.n_ctx, "prompts": n,
            "max_tokens": max_tokens, "temperature": sampling.temperature, "wall_seconds": round(wall, 1),
            "rows": rows}


def format_table(report: dict) -> str:
    lines = [f"{report['prompts']} prompts, {report['max_tokens']} max new tokens, "
             f"T={report['temperature']}, machine: {report['machine']}"
             + (", exact numerics" if report.get("numerics") == "exact" else ""),
             f"{'config':<14}{'tok/s':>8}{'speedup':>9}{'tok/call':>10}{'identical':>11}{'max gap':>9}"
             f"{'pass@1':>9}  acceptance",
             "-" * 90]
    for r in report["rows"]:
        acc = "  ".join(f"{k} {100 * v['acceptance']:.0f}%" for k, v in r["stages"].items())
        sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        gap = f"{r['max_gap_at_difference']:.3f}" if r["max_gap_at_difference"] is not None else "-"
        lines.append(f"{r['config']:<14}{r['tok_s']:>8.2f}{sp:>9}{r['tokens_per_call']:>10.2f}"
                     f"{r['identical']:>11}{gap:>9}{r.get('pass_at_1', '-'):>9}  {acc}")
    return "\n".join(lines)


def write_outputs(report: dict, out: Path, plot: bool = True) -> list[Path]:
    """bench.json (the figures), completions.json (every configuration's text, prompt by prompt:
    what was measured, to be read), and bench.png drawn by a child process (see
    localspec.app.plot)."""
    out.mkdir(parents=True, exist_ok=True)
    data, texts, png = out / "bench.json", out / "completions.json", out / "bench.png"
    report = dict(report)
    completions = report.pop("completions", None)
    data.write_text(json.dumps(report, indent=2))
    written = [data]
    if completions is not None:
        texts.write_text(json.dumps(completions, indent=1, ensure_ascii=False))
        written.append(texts)
    if not plot:
        return written
    proc = subprocess.run([sys.executable, "-m", "localspec.app.plot", str(data), str(png)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"no plot: {proc.stderr.strip() or f'exit status {proc.returncode}'}", file=sys.stderr)
        return written
    return written + [png]
