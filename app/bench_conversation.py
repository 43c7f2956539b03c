"""`localspec bench --workload conversation|conversation-long`: multi-turn chats, turn by turn.

Each configuration runs each conversation three times, from an empty cache: as every earlier
version did (every turn prefills the whole conversation: "NAME"), keeping the cache between turns
("NAME+cache": a turn prefills only what the cache lacks, engine/target.py's keep_prefix), and as
after a restart before every turn ("NAME+restart": the cache emptied, then the conversation's
snapshot loaded from disk, engine/snapshots.py, its loading timed with the turn). A turn's prompt is the conversation so far through the chat template, the replies
being that run's own. Measured per turn: time to first token (from the request to the first
emitted token: prefill, then the first round), the decode's tokens a second, and the whole
turn's latency. Configurations share one loaded target (bench.py's engines), so each run starts
by clearing its cache: no run inherits another's.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from localspec.engine.build import load
from localspec.engine.chat import chat_tokens
from localspec.engine.config import GenerationRequest, SamplingParams, TreeBudget
from localspec.engine.errors import LocalspecError
from localspec.engine.generation import Finished, Round
from localspec.engine.llama_model import gpu_offload_supported
from localspec.engine.native import switches
from localspec.engine.options import Options
from localspec.engine.session import draft_runs_in_torch
from localspec.engine.snapshots import Snapshots, snapshot_key

from .bench import _engines, config, largest_tree

RUNS = ("", "+cache", "+restart")   # a configuration's runs: fresh, the cache kept, restarted


@dataclass
class Turn:
    prompt_tokens: int
    reused_tokens: int
    ttft: float            # seconds from the request to its first emitted token
    prefill: float         # of which the prefill
    seconds: float         # the whole turn
    tokens: int
    decode_seconds: float
    text: str = ""


@dataclass
class Run:
    name: str
    turns: dict[str, list[Turn]] = field(default_factory=dict)   # conversation -> its turns

    def summary(self) -> dict:
        every = [t for turns in self.turns.values() for t in turns]
        tokens = sum(t.tokens for t in every)
        decode = sum(t.decode_seconds for t in every)
        return {"config": self.name, "turns": len(every),
                "mean_ttft_s": round(sum(t.ttft for t in every) / len(every), 3) if every else None,
                "max_ttft_s": round(max((t.ttft for t in every), default=0.0), 3),
                "tok_s": round(tokens / decode, 2) if decode else None,
                "turn_seconds": round(sum(t.seconds for t in every), 2), "tokens": tokens}


def run_turns(engine, model, turns: Sequence[str], max_tokens: int, sampling: SamplingParams,
              reuse: bool, snapshots: Snapshots | None = None) -> list[Turn]:
    """One conversation through `engine` from an empty cache; each turn's figures. snapshots:
    as after a restart, each turn starts from an empty cache and the conversation's snapshot,
    saved after the last turn (its loading counts in the turn's time to first token)."""
    engine.target.reset()
    history: list[dict] = []
    out = []
    for text in turns:
        history.append({"role": "user", "content": text})
        prompt = chat_tokens(model, history)
        started = time.perf_counter()
        if snapshots is not None:
            engine.target.reset()
            snapshots.restore("bench", engine.target, prompt[:-1])
        first = None
        for event in engine.generate(GenerationRequest(tuple(prompt), max_tokens, sampling, reuse=reuse)):
            if isinstance(event, Round) and event.tokens and first is None:
                first = time.perf_counter() - started
            elif isinstance(event, Finished):
                gen = event.generation
        seconds = time.perf_counter() - started
        st = gen.stats
        out.append(Turn(len(prompt), st.reused_tokens, first if first is not None else seconds,
                        st.seconds["prefill"], seconds, st.tokens, st.decode_seconds, gen.text))
        history.append({"role": "assistant", "content": gen.text})
        if snapshots is not None:
            snapshots.save("bench", engine.target)
    return out


def run_conversation_bench(target: Path, draft: Path | None,
                           conversations: Sequence[tuple[str, list[str]]], names: Sequence[str],
                           max_tokens: int, sampling: SamplingParams, n_ctx: int, store=None,
                           progress: Callable[[str], None] = lambda s: None,
                           n_threads: int | None = None, exact: bool = False) -> dict:
    """Every configuration, fresh, with the cache kept and restarted (RUNS), on every
    conversation; the report. A name with a run's suffix ("plain+cache") asks for that run alone."""
    asked = {}                                    # configuration -> the runs asked of it
    for n in names:
        base, _, run = n.partition("+")
        asked.setdefault(base, []).extend([f"+{run}"] if run else list(RUNS))
    unknown = [r for runs in asked.values() for r in runs if r not in RUNS]
    if unknown:
        raise LocalspecError("Unknown conversation run", ", ".join(unknown),
                             "Name a configuration alone (all three runs), or with +cache or +restart")
    names = list(asked)
    in_torch = draft_runs_in_torch(draft)
    max_nodes = largest_tree(names)
    options = Options(target, draft=draft, torch_draft=in_torch, speculation=True, n_ctx=n_ctx,
                      exact=exact, n_threads=n_threads, n_gpu_layers=0 if exact else -1,
                      budget=TreeBudget(max_nodes=max_nodes))
    neural = (("torch-draft",) if in_torch else ("draft",)) if draft is not None else ()
    gpu = gpu_offload_supported() and options.n_gpu_layers != 0
    loaded = load(options, neural, measure=any(config(n).budget.adaptive for n in names) or gpu)
    scratch = tempfile.TemporaryDirectory(prefix="localspec-bench-kv-")   # the "+restart" snapshots
    try:
        skipped: dict[str, list[str]] = {}
        engines = _engines(loaded, store, names, skipped)
        for name, missing in skipped.items():
            progress(f"skipped {name}: it needs {' and '.join(missing)}")
        disk = Snapshots(Path(scratch.name), snapshot_key(loaded.model))
        variants = {"": (False, None), "+cache": (True, None), "+restart": (True, disk)}
        runs = {f"{n}{suffix}": Run(f"{n}{suffix}") for n in engines for suffix in variants
                if suffix in asked[n]}
        started = time.time()
        for conv, turns in conversations:
            with switches(loaded.numerics):
                for name, engine in engines.items():
                    for suffix, (reuse, snapshots) in variants.items():
                        if suffix not in asked[name]:
                            continue
                        run = runs[name + suffix]
                        run.turns[conv] = run_turns(engine, loaded.model, turns, max_tokens, sampling,
                                                    reuse, snapshots)
                        disk.forget("bench")
                        progress(f"{conv} {run.name}: time to first token " + " ".join(
                            f"{t.ttft:.2f}" for t in run.turns[conv]) + " s")
        return _report(runs, conversations, target, max_tokens, sampling, time.time() - started)
    finally:
        loaded.close()
        scratch.cleanup()


def _report(runs: dict[str, Run], conversations, target: Path, max_tokens: int,
            sampling: SamplingParams, wall: float) -> dict:
    per_turn = []
    for conv, _ in conversations:
        for i in range(max(len(r.turns[conv]) for r in runs.values())):
            row = {"conversation": conv, "turn": i + 1}
            for name, r in runs.items():
                t = r.turns[conv][i]
                row.setdefault("prompt_tokens", t.prompt_tokens)
                row[name] = {"ttft_s": round(t.ttft, 3), "prefill_s": round(t.prefill, 3),
                             "turn_s": round(t.seconds, 3), "tokens": t.tokens,
                             "reused_tokens": t.reused_tokens,
                             "tok_s": round(t.tokens / t.decode_seconds, 2) if t.decode_seconds else None}
            per_turn.append(row)
    base = next(iter(runs.values()))
    identical = {name: sum(a.text == b.text for conv in r.turns for a, b in zip(r.turns[conv], base.turns[conv]))
                 for name, r in runs.items()}
    return {"target": target.name, "max_tokens": max_tokens, "temperature": sampling.temperature,
            "wall_seconds": round(wall, 1), "rows": [r.summary() | {"identical_turns": identical[n]}
                                                     for n, r in runs.items()],
            "turns": per_turn,
            "completions": [{"conversation": conv, **{n: [t.text for t in r.turns[conv]] for n, r in runs.items()}}
                            for conv, _ in conversations]}


def format_table(report: dict) -> str:
    names = [r["config"] for r in report["rows"]]
    lines = ["time to first token, seconds, by turn:",
             f"{'conversation':<14}{'turn':>5}{'prompt':>8}" + "".join(f"{n:>22}" for n in names)]
    for row in report["turns"]:
        lines.append(f"{row['conversation']:<14}{row['turn']:>5}{row['prompt_tokens']:>8}"
                     + "".join(f"{row[n]['ttft_s']:>22.2f}" for n in names))
    lines.append("")
    lines.append(f"{'config':<24}{'mean ttft':>10}{'max ttft':>10}{'tok/s':>8}{'all turns s':>13}"
                 f"{'same text':>11}")
    for r in report["rows"]:
        lines.append(f"{r['config']:<24}{r['mean_ttft_s']:>10.2f}{r['max_ttft_s']:>10.2f}"
                     f"{r['tok_s'] or 0:>8.1f}{r['turn_seconds']:>13.1f}"
                     f"{r['identical_turns']:>6}/{r['turns']}")
    return "\n".join(lines)
