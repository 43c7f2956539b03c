"""Where a round's Python time goes, with another machine's batch costs.

Runs bench configurations on this machine's llama.cpp (the real pair on CPU, say), but prunes and
chooses with the batch costs of another machine's bench.json (its "calibration": the H200's), so
the engine makes that machine's decisions while the Python phases (propose, accept, commit) are
timed here. Prints µs per round and per token for each phase, and with --profile the functions
that spend the Python time of the named configuration (llama.cpp calls excluded from the list).

Usage: python dev/round_overhead.py TARGET.gguf DRAFT.gguf BENCH.json [--limit N]
       [--max-tokens N] [--configs maxgram,free,adaptive] [--learn DIR] [--profile adaptive]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
from pathlib import Path

from localspec.app.bench import CONFIGS, BenchConfig, _engines, bench_inputs, config
from localspec.engine.calibrate import read_json
from localspec.engine.costs import Costs
from localspec.engine.config import GenerationRequest, SamplingParams, TreeBudget
from localspec.engine.generation import finish
from localspec.engine.build import load
from localspec.engine.options import Options


# the adaptive configuration's free drafters alone: what a GPU plays in nearly every round
CONFIGS["free"] = BenchConfig("free", ("maxgram", "ngram"), CONFIGS["adaptive"].budget)


# (module, class or None, function) timed by --timers
TIMED = [
    ("localspec.engine.drafters.maxgram", "MaxGram", "propose"),
    ("localspec.engine.drafters.maxgram", "MaxGram", "accept"),
    ("localspec.engine.drafters.ngram", "PersonalNgram", "propose"),
    ("localspec.engine.drafters.ngram", "PersonalNgram", "accept"),
    ("localspec.engine.prune", "AcceptanceModel", "node_probs"),
    ("localspec.engine.prune", "AcceptanceModel", "update"),
    ("localspec.engine.prune", "AcceptanceModel", "observe_pruned"),
    ("localspec.engine.prune", None, "choose"),
    ("localspec.engine.tree", "DraftTree", "copy_kept"),
    ("localspec.engine.tree", "DraftTree", "layout"),
    ("localspec.engine.tree", "DraftTree", "reset"),
    ("localspec.engine.llama_model", "LlamaModel", "decode"),
    ("localspec.engine.llama_model", "LlamaModel", "logits"),
    ("localspec.engine.target", "Target", "verify"),
    ("localspec.engine.target", "Target", "commit"),
    ("localspec.engine.decode", None, "greedy_walk"),
    ("localspec.engine.decode", "Engine", "_emit"),
    ("localspec.engine.policy", "AdaptivePolicy", "plan"),
    ("localspec.engine.policy", "AdaptivePolicy", "select"),
    ("localspec.engine.stats", "DecodeStats", "record_round"),
    ("localspec.engine.budget", "AdaptiveBudget", "update"),
]


def install_timers() -> dict[str, list]:
    """Wrap each TIMED function to add up its calls and seconds (the wrapper costs ~0.3 µs)."""
    import importlib
    import time
    import functools

    spent: dict[str, list] = {}
    for module, cls, fn in TIMED:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        original = getattr(owner, fn)
        cell = spent.setdefault(f"{cls + '.' if cls else ''}{fn}", [0, 0.0])

        def timed(*a, _f=original, _c=cell, **k):
            t = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                _c[0] += 1
                _c[1] += time.perf_counter() - t
        setattr(owner, fn, staticmethod(functools.wraps(original)(timed))
                if isinstance(owner.__dict__.get(fn), staticmethod) else functools.wraps(original)(timed))
    return spent


def costs_of(bench_json: Path) -> Costs:
    cal = read_json(bench_json)["calibration"]
    def curve(ms: dict) -> dict[int, float]:
        return {int(n): v / 1e3 for n, v in ms.items()}

    return Costs(curve(cal["target_ms"]), curve(cal["draft_ms"]), None, cal["switch_ms"] / 1e3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target", type=Path)
    ap.add_argument("draft", type=Path)
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--configs", default="maxgram,free,adaptive")
    ap.add_argument("--workload", default="humaneval")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--learn", action="append", default=[])
    ap.add_argument("--learn-max-tokens", type=int, default=200_000)
    ap.add_argument("--profile", default="")
    ap.add_argument("--sort", default="tottime", help="profile order: tottime or cumulative")
    ap.add_argument("--timers", action="store_true", help="µs a round per engine function")
    args = ap.parse_args()
    spent = install_timers() if args.timers else {}

    names = args.configs.split(",")
    costs = costs_of(args.bench_json)
    max_nodes = max(config(n).budget.max_nodes for n in names)
    with tempfile.TemporaryDirectory() as scratch:
        prompts, store, source = bench_inputs(args.target, args.workload, args.limit, args.learn,
                                              args.learn_max_tokens, Path(scratch))
        print("n-grams:", source)
        limits = max((config(n).draft_limits for n in names), key=lambda d: d.pad_rows)
        loaded = load(Options(args.target, draft=args.draft, maxgram=False, personal=False,
                              budget=TreeBudget(max_nodes=max_nodes), draft_limits=limits),
                      ("draft",), measure=False)
        # the other machine's costs, and as on a GPU: stable_shapes=True, and with a cheap switch
        # the engine picks bucketed trees
        loaded.costs = costs
        loaded.model.n_gpu_layers = -1
        engines = _engines(loaded, store, names)
        sampling = SamplingParams(temperature=args.temperature, seed=1)
        profile = cProfile.Profile()
        totals = {n: {"rounds": 0, "tokens": 0} for n in engines}
        for prompt in prompts:
            for name, engine in engines.items():
                request = GenerationRequest(prompt.tokens, args.max_tokens, sampling)
                if name == args.profile:
                    profile.enable()
                gen = finish(engine.generate(request))
                if name == args.profile:
                    profile.disable()
                t = totals[name]
                t["rounds"] += gen.stats.target_calls
                t["tokens"] += gen.stats.tokens
                for phase, s in gen.stats.seconds.items():
                    t[phase] = t.get(phase, 0.0) + s
        store.close()
    for name, t in totals.items():
        rounds, tokens = t.pop("rounds"), t.pop("tokens")
        per = "  ".join(f"{p} {1e6 * s / rounds:.0f}" for p, s in t.items() if p != "verify")
        print(f"{name}: {rounds} rounds, {tokens} tokens, {tokens / rounds:.2f} a round; "
              f"µs a round: {per}; Python µs a token: "
              f"{1e6 * sum(s for p, s in t.items() if p not in ('verify', 'prefill')) / tokens:.0f}")
    if spent:
        for key, (calls, sec) in sorted(spent.items(), key=lambda kv: -kv[1][1]):
            if calls:
                print(f"  {key:32s} {calls:7d} calls {1e6 * sec / calls:8.1f} µs a call {sec:8.3f} s")
    if args.profile:
        stats = pstats.Stats(profile)
        stats.sort_stats(args.sort).print_stats(r"^(?!.*llama_cpp)", 40)
    loaded.close()


if __name__ == "__main__":
    main()
