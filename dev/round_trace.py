"""What the engine does round by round on the tiny models, to compare two versions of the policy.

A change meant to keep behaviour (a refactor of the loop or the policy) must leave every round as
it was: the arm, which stages proposed with which budget, the tree verified and its padding, the
path accepted and the tokens committed. Wall time drives the policy (the bandit's estimates, a
stage's worth), so the run replaces `time.perf_counter` with a scripted clock that moves only
when the target verifies (by the cost curve at the batch's rows), a stage proposes (by its
per-node price) or the target prefills: the trace then depends on the code alone, never on the
machine or on how often the code reads the clock. The costs are scripted too (no calibration).

Usage, from the repository root (needs the tiny models, which tests/tiny_models.py builds):
  .venv/bin/python dev/round_trace.py --out before.json
  .venv/bin/python dev/round_trace.py --out after.json --compare before.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from tiny_models import build_corpus, build_tiny_models, held_out_corpus  # noqa: E402

CPU = {1: 1e-3, 2: 1.4e-3, 4: 2.2e-3, 8: 3.8e-3, 16: 7e-3, 32: 13e-3}     # a row ~ 0.4 step
GPU = {1: 1e-3, 2: 1.02e-3, 4: 1.05e-3, 8: 1.1e-3, 16: 1.3e-3, 32: 1.6e-3}  # rows nearly free
DRAFT = {1: 3e-4, 2: 3.1e-4, 4: 3.2e-4, 8: 3.3e-4}    # a draft model: in arms (policy.free_stages)
CHEAP = {1: 5e-5, 2: 5.2e-5, 4: 5.5e-5, 8: 6e-5}      # a head on a CPU: a free stage
NODE = {"maxgram": 2e-5, "personal-ngram": 1.5e-4}          # a free stage's seconds per node it adds
PROMPTS = ["def add(a, b):\n",
           "class Person:\n    def __init__(self, name, age):\n        self.name = name\n"
           "        self.age = age\n\n\nclass Person:\n    def __init__(self, name, age):\n",
           "def largest(numbers):\n    best = numbers[0]\n"]
MAX_TOKENS = 96


@dataclass(frozen=True)
class Config:
    neural: str | None = "draft"      # "draft", "torch", "head", None
    curve: str = "cpu"                # cpu, gpu, none (uncalibrated)
    draft: str = "dear"               # dear (DRAFT) or cheap (CHEAP)
    offloaded: bool = False
    switch: float = 0.0
    adaptive: bool = True
    nodes: int = 16
    temperature: float = 0.0
    exact: bool = False
    extra: dict = field(default_factory=dict)


CONFIGS = {
    "cpu": Config(),
    "cpu-sampled": Config(temperature=0.8),
    "cpu-free": Config(neural=None, nodes=32),
    "cpu-free-sampled": Config(neural=None, nodes=32, temperature=0.8),
    "gpu-free": Config(neural=None, nodes=32, curve="gpu", offloaded=True, switch=4e-4),
    "gpu-buckets": Config(curve="gpu", offloaded=True, switch=4e-4),
    "gpu-stable": Config(curve="gpu", offloaded=True, switch=3e-3),
    "gpu-stable-sampled": Config(curve="gpu", offloaded=True, switch=3e-3, temperature=0.8),
    "uncalibrated-stable": Config(curve="none", offloaded=True),
    "fixed": Config(adaptive=False, nodes=8, curve="none"),
    "torch": Config(neural="torch"),
    "head-free": Config(neural="head", draft="cheap"),
    "head-arms": Config(neural="head", curve="gpu", offloaded=True, switch=4e-4),
    # n-gram nodes dearer than their guesses return: its gate closes and opens again
    "gpu-free-dear-ngram": Config(neural=None, nodes=32, curve="gpu", offloaded=True, switch=4e-4,
                                  extra={"personal-ngram": 2e-3}),
}


class Clock:
    """The scripted clock that replaces time.perf_counter."""
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def head_file(tiny, cache: Path) -> Path:
    """The tests' tiny head (conftest.tiny_head), trained once into `cache`."""
    out = cache / "tiny-head.npz"
    if out.exists():
        return out
    from localspec.engine.head_train import collect, train
    from localspec.engine.head_train_model import TrainingModel

    model = TrainingModel(tiny.target_gguf, n_ctx=256, n_batch=256, n_seq_max=1, hidden=True, n_threads=1)
    try:
        corpus = collect(model, enumerate(build_corpus(n_docs=300)), 20_000, chunk=256)
    finally:
        model.close()
    train(corpus, tiny.target_gguf, out, steps=200, batch=16, length=64, vocab_size=400, device="cpu")
    return out


def trace(name: str, cfg: Config, tiny, clock: Clock, cache: Path) -> list:
    from localspec.engine.config import GenerationRequest, SamplingParams, TreeBudget
    from localspec.engine.costs import Costs
    from localspec.engine.decode import Engine
    from localspec.engine.generation import finish
    from localspec.engine.options import Options
    from localspec.engine.policy import make_policy
    from localspec.engine.session import Session

    curve = {"cpu": CPU, "gpu": GPU, "none": GPU}[cfg.curve]
    draft_curve = CHEAP if cfg.draft == "cheap" else DRAFT
    costs = None if cfg.curve == "none" else Costs(curve, draft_curve, switch=cfg.switch)
    scripted = Costs(curve, draft_curve)
    draft = {"draft": tiny.draft_gguf, "torch": tiny.draft_torch}.get(cfg.neural)
    head = head_file(tiny, cache) if cfg.neural == "head" else None
    budget = TreeBudget(max_nodes=cfg.nodes, adaptive=cfg.adaptive)
    session = Session(Options(tiny.target_gguf, draft=draft, head=head, use_head=head is not None,
                              n_ctx=512, n_threads=1, calibrate=False, exact=cfg.exact, budget=budget,
                              stable_shapes=cfg.offloaded and not cfg.exact))
    rounds: list = []
    try:
        policy = make_policy(budget, session.stages, costs, cfg.offloaded)
        engine = Engine(session.engine.target, session.stages, policy)
        target = engine.target
        for d in session.stages:
            def propose(tree, index, budget, sampling, rng, inner=d.propose, d=d):
                before = tree.n
                inner(tree, index, budget, sampling, rng)
                rounds[-1]["proposed"].append([index, budget, tree.n - before])
                node = cfg.extra.get(d.name, NODE.get(d.name, 1e-5))
                clock.now += (scripted.draft_cost(max(1, tree.n - before)) if d.uses_model
                              else node * (1 + tree.n - before))
            d.propose = propose
        plan = policy.plan

        def planned(room):
            p = plan(room)
            rounds.append({"arm": str(p.arm), "proposed": []})
            return p

        def round_record() -> dict:
            """This round's record; a round the policy did not plan (arm None) gets one here."""
            if not rounds or "path" in rounds[-1]:
                rounds.append({"arm": None, "proposed": []})
            return rounds[-1]
        policy.plan = planned
        verify, commit, prefill = target.verify, target.commit, target.prefill

        def verifying(tree, pad_to=0, top_up=True):
            n = tree.n
            round_record()
            rounds[-1]["tree"] = [tree.tokens[:n].tolist(), tree.parent[:n].tolist(), tree.drafter[:n].tolist()]
            rounds[-1]["pad"] = [pad_to, top_up]
            clock.now += scripted.target_cost(max(n, pad_to))
            return verify(tree, pad_to, top_up)

        def committing(tree, path):
            rounds[-1]["path"] = list(path)
            return commit(tree, path)

        def prefilling(tokens, *a, **k):
            clock.now += 0.01
            return prefill(tokens, *a, **k)
        target.verify, target.commit, target.prefill = verifying, committing, prefilling
        sampling = SamplingParams(temperature=cfg.temperature, seed=7)
        out = []
        for text in PROMPTS:
            tokens = session.raw_prompt(text)
            got = finish(engine.generate(GenerationRequest(tuple(tokens), MAX_TOKENS, sampling)))
            out.append({"tokens": got.tokens, "rounds": rounds[:]})
            rounds.clear()
        return out
    finally:
        session.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", type=Path, help="an earlier --out: say where the rounds part")
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS))
    args = ap.parse_args()
    tiny = build_tiny_models()
    cache = Path(tempfile.gettempdir()) / "localspec-round-trace"
    cache.mkdir(exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="round-trace-"))
    os.environ["LOCALSPEC_DATA_DIR"] = str(data)     # a store of held-out text, nothing learnt
    from localspec.engine.options import Options
    from localspec.engine.session import Session
    from localspec.models.ngram_store import NgramStore, vocab_key

    store = NgramStore.open(vocab_key(tiny.target_gguf))
    plain = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    for i, doc in enumerate(held_out_corpus(60)[10:]):
        store.add("file", f"doc{i}", plain.raw_prompt(doc))
    expected = [plain.run(plain.raw_prompt(t), max_tokens=MAX_TOKENS).tokens for t in PROMPTS]
    plain.close()
    store.close()
    clock = Clock()
    time.perf_counter = clock
    results = {}
    for name in args.configs:
        results[name] = trace(name, CONFIGS[name], tiny, clock, cache)
        greedy = CONFIGS[name].temperature == 0
        same = all(r["tokens"] == e for r, e in zip(results[name], expected))
        n = sum(len(r["rounds"]) for r in results[name])
        print(f"{name}: {n} rounds" + (f", greedy tokens the target's: {same}" if greedy else ""), flush=True)
        if greedy and not same:
            print(f"  {name}: greedy output differs from plain decoding", flush=True)
    args.out.write_text(json.dumps(results))
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text())
    differ = 0
    for name, runs in results.items():
        if name not in before:
            continue
        for p, (old, new) in enumerate(zip(before[name], runs)):
            if old == new:
                continue
            differ += 1
            first = next((i for i, (a, b) in enumerate(zip(old["rounds"], new["rounds"])) if a != b),
                         min(len(old["rounds"]), len(new["rounds"])))
            print(f"{name} prompt {p}: rounds part at round {first} "
                  f"({len(old['rounds'])} -> {len(new['rounds'])} rounds; tokens "
                  f"{'same' if old['tokens'] == new['tokens'] else 'differ'})")
            if first < min(len(old["rounds"]), len(new["rounds"])):
                print(f"  before: {old['rounds'][first]}\n  after:  {new['rounds'][first]}")
    print("same rounds in every configuration" if not differ else f"{differ} runs differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
