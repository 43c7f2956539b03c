"""The decode loop: propose -> verify -> accept -> commit -> emit, one round per target call.

A round grows one draft tree through the stages (cheapest first), keeps the part worth verifying
on this machine (prune.py), verifies it in a single target decode, walks the accepted path (greedy
or rejection sampling), commits that path in the target's cache and tells every drafter what was
committed. Plain decoding is the same loop with no stages:
a tree of just the root, one token per call, so both modes share every line of the exact path.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from . import prune
from .budget import AdaptiveBudget, Arm
from .calibrate import Costs
from .config import GenerationRequest, SamplingParams, TreeBudget
from .drafters.base import Drafter
from .errors import LocalspecError, vocab_mismatch
from .stats import DecodeStats, StageStats
from .target import Target
from .text import TextStream
from .tree import DraftTree
from .verify import Walk, greedy_walk, sample_walk
from .worth import StageWorth

HOLD = 16   # rounds an adaptive choice is kept with stable shapes (a CUDA graph warms up in 2)
# Verify sizes where a change of shape is cheap: llama.cpp then keeps a CUDA graph per size, and a
# graph is captured only after two calls of its size and dropped after 10 s unused, so trees of
# any size (2..33 tokens) would mostly run uncaptured; powers of two keep the sizes few.
BUCKETS = (2, 4, 8, 16, 32)


def bucket(n: int, top: int) -> int:
    """Rows a verify of n tokens is padded to where shapes change cheaply: the smallest bucket
    of at least n, else `top` (the arm's full tree)."""
    return next((b for b in BUCKETS if n <= b < top), max(n, top))


@dataclass
class Generation:
    """What a finished generation returns; `text` and `tokens` exclude the prompt."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish_reason: str = ""          # "stop" (EOS or stop string), "length", "context"
    stats: DecodeStats | None = None
    sources: list[str] = field(default_factory=list)   # per token: the drafter that proposed it, or "target"


def drain(stream: Iterator[str], on_piece: Callable[[str], None] | None = None) -> Generation:
    """Run a generation stream to its end, handing each text piece to `on_piece`; its Generation."""
    while True:
        try:
            piece = next(stream)
        except StopIteration as stop:
            return stop.value
        if on_piece is not None:
            on_piece(piece)


class Engine:
    def __init__(self, target: Target, stages: Sequence[Drafter] = (),
                 budget: TreeBudget = TreeBudget(), costs: Costs | None = None,
                 stable_shapes: bool = False) -> None:
        """costs: this machine's measured batch costs (calibrate.py). With them every round keeps
        only the drafted nodes that pay (prune.py: expected acceptance by drafter, confidence
        class and depth, against the batch cost), which is the per-round gate: a round with no
        guess worth its batch is a plain step. With an adaptive budget, tree sizes that could not
        beat plain decoding even in the best case are never tried.

        stable_shapes (for GPUs): the adaptive budget keeps its choice for HOLD rounds, and a round
        that speculates verifies its budget's N + 2 tokens (padded), so llama.cpp sees the same
        batch shape round after round and replays its CUDA graph (Target.verify); a speculative
        round entered from plain ones also pays the graph rebuilds it causes (Costs.switch).
        Where a change of shape is cheap (`Costs.cheap_switch`: llama.cpp built with
        packaging/patches keeps a CUDA graph per shape) rounds choose every round as on a CPU, a
        tree is padded to a few BUCKETS only, a round entered from plain ones pays the measured
        switch, and, as on a GPU, the free drafters' arm stands in for plain decoding: with a
        plain arm the bandit judged the free arm by a few probe rounds that paid the CUDA graphs'
        first captures and kept to plain (H200, HumanEval[:40]: 0.94x with it, 1.07x without;
        Max-Gram alone went from 0.93-0.99x unpatched to 1.16x)."""
        gpu = stable_shapes
        self._buckets = stable_shapes and costs is not None and costs.cheap_switch
        if self._buckets:
            stable_shapes = False
        for d in stages:
            vocab = d.vocab_size
            if vocab is not None and vocab != target.vocab_size:
                raise vocab_mismatch(d.name, vocab, target.model.path.name, target.vocab_size)
        self.target = target
        self.stages = list(stages)
        self.budget = budget
        with_models = self._has_models = any(d.uses_model for d in self.stages)
        arms = (budget.arms(with_models, pruned=costs is not None,
                            with_free=any(not d.uses_model for d in self.stages),
                            plain=not gpu if budget.plain_arm is None else budget.plain_arm,
                            copy=gpu)
                if self.stages else (Arm(0),))
        self.dropped: tuple[Arm, ...] = ()
        if costs is not None and len(arms) > 1:
            limits = next((d.limits for d in self.stages if d.uses_model), None)
            kept = costs.viable(arms, limits.width if limits else 4, limits.max_depth if limits else 8)
            # the free drafters' arm stands in for plain decoding (pruned rounds can be plain steps)
            kept = tuple(a for a in arms if a in kept or not a.models)
            self.dropped = tuple(a for a in arms if a not in kept)
            arms = kept
        self.costs = costs
        self.controller = AdaptiveBudget(arms) if len(arms) > 1 else None
        self._fixed = arms[0]
        self.stable_shapes = stable_shapes and (self.controller is not None or costs is not None)
        # Pruning by expected value needs the cost curve. With stable shapes a kept node costs
        # nothing more (the batch is padded to the budget), but pruning a tree down to its root
        # turns the round into a 1-token step: that is what stops a free drafter's long-shot
        # guesses (a 3-token Max-Gram coincidence, personal n-grams at 8% on the H200) from
        # costing a padded batch and two CUDA-graph rebuilds a round.
        self._acceptance = (prune.AcceptanceModel(len(self.stages))
                            if costs is not None and self.stages else None)
        self._kept = DraftTree(capacity=max(2, budget.max_nodes + 1))
        self._ordered = DraftTree(capacity=max(2, budget.max_nodes + 1)) if target.exact else None
        self._held = 0            # rounds left on the current arm (stable shapes)
        self._arm = 0
        self._plain_before = True  # the last round verified the root alone
        self._pruned_from: tuple[DraftTree, np.ndarray] | None = None   # this round's tree and keep mask
        # With a cost curve, a free stage runs only while it pays for its Python time (worth.py).
        self._worth = StageWorth(len(self.stages)) if costs is not None and self.stages else None
        self._ran = [False] * len(self.stages)
        self._tree = DraftTree(capacity=max(2, budget.max_nodes + 1))
        self._cost_tables: dict[tuple[int, bool], list[float]] = {}
        # the stage an unpruned free arm runs alone (Max-Gram; such arms exist only with one)
        self._cheapest_free = next((i for i, d in enumerate(self.stages) if not d.uses_model), -1)

    def generate(self, request: GenerationRequest,
                 observer: Callable[[list[int], list[str]], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[str]:
        """Stream text pieces; the generator's return value is the Generation.

        observer, when given, is called once per round before that round's text is yielded, with
        the round's emitted tokens and, for each, the name of the drafter that proposed it
        ("target" for the token the target chose itself): what an app colours tokens by.
        should_stop, when given, is asked before each round; True ends the generation there with
        finish_reason "stopped" (text held back for a possible stop string is released), and the
        Generation keeps its statistics."""
        prompt = list(request.tokens)
        if not prompt:
            raise LocalspecError("Empty prompt", "the prompt has no tokens", "Pass some text")
        stats = DecodeStats(stages=[StageStats(d.name) for d in self.stages],
                            prompt_tokens=len(prompt))
        result = Generation(stats=stats)
        sampling = request.sampling
        rng = np.random.default_rng(sampling.seed)
        stream = TextStream(self.target.model.piece, request.stop)
        clock = stats.seconds

        t0 = time.perf_counter()
        self.target.reset()
        self.target.prefill(prompt[:-1])
        for d in self.stages:
            d.begin(prompt)
        clock["prefill"] += time.perf_counter() - t0

        tree = self._tree
        root = prompt[-1]
        self._held = 0
        self._plain_before = True
        while True:
            if self.target.room < 2:
                result.finish_reason = "context"
                break
            if should_stop is not None and should_stop():
                result.finish_reason = "stopped"
                tail = stream.flush()
                if tail:
                    result.text += tail
                    yield tail
                break
            t = time.perf_counter()
            arm = self._choose()
            shape = self.controller.arms[arm] if self.controller else self._fixed
            tree.reset(root)
            for i in range(len(self._ran)):
                self._ran[i] = False
            if self.stages and shape.nodes > 0:
                self._propose(tree, shape, sampling, rng)
            self._pruned_from = None
            tree = self._prune(tree, stats, shape)
            if self._ordered is not None and tree.n > 2:   # exact numerics: likeliest path first
                score = (self._acceptance.node_probs(tree).tolist() if self._acceptance is not None
                         else tree.logp[:tree.n].tolist())
                tree = tree.copy_depth_first(self._ordered, score)
            t1 = time.perf_counter()
            rows = self._verify(tree, shape)
            self._plain_before = tree.n <= 1
            t2 = time.perf_counter()
            walk = self._walk(tree, rows, sampling, rng)
            t3 = time.perf_counter()
            self.target.commit(tree, walk.path)
            stats.redecoded = self.target.redecoded
            t4 = time.perf_counter()
            stats.record_round(tree, walk.path)
            new = [int(tree.tokens[n]) for n in walk.path] + [walk.token]
            if self._acceptance is not None:
                self._acceptance.update(tree, walk.path)
                if self._pruned_from is not None:
                    self._acceptance.observe_pruned(*self._pruned_from, new, sampling.greedy)
            if self._worth is not None:
                accepted = [0] * len(self.stages)
                for n in walk.path:
                    accepted[tree.drafter[n]] += 1
                self._worth.credit(self._ran, accepted)
            text, emitted, reason = self._emit(new, result, stream, request.max_tokens)
            if emitted:
                names = [self.stages[int(tree.drafter[n])].name for n in walk.path[:emitted]]
                names += ["target"] * (emitted - len(names))
                result.sources += names
                if observer is not None:
                    observer(result.tokens[-emitted:], names)
            stats.tokens = len(result.tokens)
            stats.drafted_tokens += min(len(walk.path), emitted)
            for d in self.stages:
                d.accept(new)
            t5 = time.perf_counter()
            clock["propose"] += t1 - t
            clock["verify"] += t2 - t1
            clock["accept"] += (t3 - t2) + (t5 - t4)
            clock["commit"] += t4 - t3
            if self.controller:
                self.controller.update(arm, len(new), t5 - t)
            if reason:
                text += stream.flush()
            if text:
                result.text += text
                yield text
            if reason:
                result.finish_reason = reason
                break
            root = walk.token
            tree = self._tree
        if self.controller:
            stats.budget = self.controller.summary()
        return result

    def learnt(self) -> dict:
        """What this engine measured about its drafters on this machine, to start the next run
        from (session.py keeps it next to the calibration)."""
        out: dict = {"stages": [d.name for d in self.stages]}
        if self.controller is not None:
            out["budget"] = self.controller.state()
        if self._acceptance is not None:
            out["acceptance"] = self._acceptance.state()
        return out

    def resume(self, learnt: dict) -> None:
        """Start from `learnt()` of an earlier engine with the same stages (else ignore it)."""
        if learnt.get("stages") != [d.name for d in self.stages]:
            return
        if self.controller is not None and isinstance(learnt.get("budget"), dict):
            self.controller.load(learnt["budget"])
        if self._acceptance is not None and isinstance(learnt.get("acceptance"), dict):
            self._acceptance.load(learnt["acceptance"])

    def _verify(self, tree: DraftTree, shape: Arm) -> np.ndarray:
        """One target call over `tree`, padded as this machine's batch shapes want it. A root-only
        tree (no drafter had a guess) stays one token: padding it to the arm's size cost free arms
        more than CUDA-graph churn does (H200, edit workload)."""
        if tree.n <= 1 or not shape.nodes:
            return self.target.verify(tree)
        if self._buckets:
            return self.target.verify(tree, min(bucket(tree.n, shape.nodes + 1), self.target.room),
                                      top_up=False)
        if self.stable_shapes:
            return self.target.verify(tree, min(shape.nodes + 2, self.target.room))
        return self.target.verify(tree)

    def _prune(self, tree: DraftTree, stats: DecodeStats, shape: Arm) -> DraftTree:
        """The part of the tree worth verifying on this machine (prune.py): `tree` itself, or a
        copy of its kept nodes (drafters keep their own node numbering of `tree`)."""
        if self._acceptance is None or tree.n <= 1 or not shape.pruned:
            return tree
        cost = self._cost_table(shape, tree.n).__getitem__
        keep = prune.choose(tree, self._acceptance.node_probs(tree), cost)
        if keep.all():
            return tree
        self._pruned_from = (tree, keep)
        stats.pruned += int(tree.n - keep.sum())
        return tree.copy_kept(keep, self._kept)

    def _cost_table(self, shape: Arm, n: int) -> list[float]:
        """[k] seconds a verify of k tokens costs this round, k up to at least n (index 0 unused):
        the calibrated curve, as this machine's batch shapes make it. Cached per arm and whether
        the round leaves a plain stretch (pruning asks for every k, each round)."""
        key = (shape.nodes, self._plain_before)
        table = self._cost_tables.get(key)
        if table is not None and len(table) > n:
            return table
        curve, switch = self.costs.target_cost, self.costs.switch if self._plain_before else 0.0
        size = max(n, shape.nodes + 1) + 1
        if self.stable_shapes:   # any tree beyond the root is verified padded to the arm's size
            padded = curve(shape.nodes + 2) + switch   # leaving the 1-token shape: a CUDA graph, both ways
            table = [0.0, curve(1)] + [padded] * (size - 2)
        elif self._buckets:      # a tree is verified padded to its bucket, a switch at a price
            top = shape.nodes + 1
            table = [0.0, curve(1)] + [curve(bucket(k, top)) + switch for k in range(2, size)]
        else:
            table = [0.0] + [curve(k) for k in range(1, size)]
        self._cost_tables[key] = table
        return table

    def _choose(self) -> int:
        """The arm of this round: the controller's choice, kept HOLD rounds with stable shapes."""
        if self.controller is None:
            return 0
        if not self.stable_shapes:
            return self.controller.choose()
        if self._held <= 0:
            self._arm, self._held = self.controller.choose(), HOLD
        self._held -= 1
        return self._arm

    def _emit(self, new: list[int], result: Generation, stream: TextStream,
              max_tokens: int) -> tuple[str, int, str]:
        """Append committed tokens to the result until a stop; (text, tokens emitted, reason)."""
        out: list[str] = []
        for n, token in enumerate(new):
            if self.target.model.is_eog(token):
                return "".join(out), n, "stop"
            result.tokens.append(token)
            out.append(stream.feed(token))
            if stream.stopped:
                return "".join(out), n + 1, "stop"
            if len(result.tokens) >= max_tokens:
                return "".join(out), n + 1, "length"
        return "".join(out), len(new), ""

    def _propose(self, tree: DraftTree, shape: Arm, sampling: SamplingParams,
                 rng: np.random.Generator) -> None:
        room = min(shape.nodes, self.target.room - 1, tree.capacity - 1)
        # With a model drafter after them, the free stages fill at most half the tree: the model
        # checks their chains along (vertical cascade) and spends the rest on its own guesses.
        free_room = room // 2 if shape.models and self._has_models else room
        if not shape.pruned and not shape.models:   # the cheapest stage's tree, verified whole
            self.stages[self._cheapest_free].propose(tree, self._cheapest_free, room, sampling, rng)
            return
        for stage, d in enumerate(self.stages):
            if d.uses_model and not shape.models:
                continue
            budget = (room if d.uses_model else free_room) - (tree.n - 1)
            if budget <= 0:
                if d.uses_model:
                    break
                continue
            if self._worth is None or d.uses_model:
                d.propose(tree, stage, budget, sampling, rng)
            elif self._worth.runs(stage, self.costs.target_cost(1)):
                d.catch_up()
                t = time.perf_counter()
                d.propose(tree, stage, budget, sampling, rng)
                self._worth.ran(stage, time.perf_counter() - t)
                self._ran[stage] = True

    @staticmethod
    def _walk(tree: DraftTree, rows: np.ndarray, sampling: SamplingParams,
              rng: np.random.Generator) -> Walk:
        if sampling.greedy:
            return greedy_walk(tree, rows)
        return sample_walk(tree, rows, sampling, rng)
