"""Everything that adapts, behind one object the decode loop asks three things a round.

`plan`: which tree to grow (the arm: how many nodes, which stages, how many nodes each may add).
`select`: the batch to verify: the part of the drafted tree worth verifying on this machine, in
the order and padding it goes to the target. `observe`: what that batch accepted and what the
round cost; `select` changes nothing, so everything `observe` learns from is in the `Batch` it is
handed. The loop itself stays the same for every policy; the choices live here.

FixedPolicy grows one tree size and verifies every drafted node: nothing is measured, so there is
nothing to weigh. Plain decoding is a FixedPolicy with no stages. AdaptivePolicy owns the measured
parts: the bandit over arms (budget.py), the acceptance model that prices each node and prunes what
does not pay (prune.py), each free stage's one gate, its worth against its Python time and its
growth by what pruning kept of it (worth.py), the price and padding of a verify in the batch-shape
mode (shapes.py), and the state carried to the next run. `make_policy` chooses between them and
builds the arms, once. Tuned constants: engine/tuning.py.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

import numpy as np

from . import prune, tuning
from .budget import AdaptiveBudget, Arm
from .costs import Costs
from .config import TreeBudget
from .drafters.base import Drafter
from .shapes import Shapes
from .tree import DraftTree
from .worth import StageWorth


@dataclass(frozen=True)
class Plan:
    """One round's tree: the arm, the stages that may grow it (in order) and their room."""

    arm: Arm
    stages: tuple[int, ...]   # stage indices, cheapest first
    room: int                 # nodes the stages may add below the root
    free_room: int            # of which the free stages may fill
    free: tuple[int, ...] = ()    # which of `stages` are free (`free_stages`)
    allowed: tuple[int, ...] = ()  # per stage index, the most nodes its gate lets it add (): no gate

    def budget(self, stage: int, grown: int) -> int:
        """Nodes `stage` may add to a tree that has `grown` below its root (0 or less: none)."""
        room = (self.free_room if stage in self.free else self.room) - grown
        return min(room, self.allowed[stage]) if self.allowed else room


@dataclass(frozen=True, slots=True)
class Batch:
    """What a round verifies (`Policy.select`): `tree`, the drafted tree or a copy of the nodes
    worth verifying, in batch order; `pad_to` rows (0: unpadded) and `top_up` for
    `Target.verify`; where nodes were pruned, the drafted tree and its keep mask, whose pruned
    nodes' fates `observe` counts."""

    tree: DraftTree
    pad_to: int = 0
    top_up: bool = True
    pruned: tuple[DraftTree, np.ndarray] | None = None


class Policy(Protocol):
    """What the decode loop asks a policy, in a round's order."""

    arms: tuple[Arm, ...]
    dropped: tuple[Arm, ...]       # arms ruled out by the calibration before any round
    bandit: AdaptiveBudget | None  # the choice among several arms (bench records its trace)
    capacity: int                  # the most nodes a plan's tree holds, the root included

    def begin(self) -> None:
        """A generation starts."""

    def plan(self, room: int) -> Plan:
        """This round's tree, with at most `room` nodes below the root."""

    def ran(self, stage: int, seconds: float) -> None:
        """Free stage `stage` of this round's plan proposed, in `seconds` (Plan.free)."""

    def select(self, tree: DraftTree, room: int, ordered: DraftTree | None) -> Batch:
        """The batch to verify of the drafted `tree`, with `room` tokens left in the target's
        context. ordered: a tree to copy the batch into likeliest path first (exact numerics'
        order, docs/exact-numerics.md), or None to keep the drafted order. Changes nothing."""

    def observe(self, batch: Batch, path: tuple[int, ...], tokens: list[int], greedy: bool,
                started: float) -> None:
        """The round verified `batch`, accepted `path` and committed `tokens`; it began at
        `started` (time.perf_counter)."""

    def summary(self) -> dict:
        """Measured tok/s and rounds per arm (DecodeStats.budget); {} where nothing is chosen."""

    def learnt(self) -> dict:
        """What to start the next run over the same stages from (JSON-ready)."""

    def resume(self, learnt: dict) -> None:
        """Start from an earlier `learnt()`; parts that do not fit are ignored."""


def free_stages(stages: Sequence[Drafter], costs: Costs | None) -> tuple[bool, ...]:
    """Per stage, whether it is free: the drafters without a model, and with a calibration a
    model whose one-row step costs at most tuning.FREE_STEP_SHARE of the target's (a draft head
    on a CPU). A free stage runs in the free drafters' arm behind its own gate (worth.py); a model
    stage runs only in the arms the bandit weighs against that one (budget.py)."""
    cheap = (costs is not None and bool(costs.draft)
             and costs.draft_cost(1) <= tuning.FREE_STEP_SHARE * costs.target_cost(1))
    return tuple(not d.uses_model or cheap for d in stages)


def draft_order(stages: Sequence[Drafter], free: Sequence[bool]) -> tuple[int, ...]:
    """The order a round's stages draft in: the free ones that copy (Max-Gram), the free ones
    with a model (a head on a CPU), the other free ones (the n-grams), then the model stages;
    each group in the stages' own order (cheapest first). A token two stages would both draft is
    added, and credited to its worth, by the first: a head after the n-grams saw them take the
    first tokens it would have drafted, and its worth gate, fed the rest, turned it off for
    stretches (docs/decisions/0042). Max-Gram stays first: where the text repeats its copies are
    likelier than any guess, and a model extends them."""
    def group(i: int) -> int:
        if not free[i]:
            return 3
        return 0 if stages[i].copies else 1 if stages[i].uses_model else 2
    return tuple(sorted(range(len(stages)), key=lambda i: (group(i), i)))


def route(arm: Arm, free: Sequence[bool], order: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """(the stages `arm` runs, in `order` (draft_order); which of them are free; whether the free
    ones get half the room) over stages whose freedom is `free`. A plain arm runs none. With a
    model drafter after them the free stages fill at most half the tree: the model checks their
    chains along (vertical cascade) and spends the rest on its own guesses."""
    if arm.nodes == 0:
        return (), (), False
    chosen = tuple(i for i in order if arm.models or free[i])
    return chosen, tuple(i for i in chosen if free[i]), arm.models and not all(free[i] for i in chosen)


def _plan(arm: Arm, routed: tuple[tuple[int, ...], tuple[int, ...], bool], room: int) -> Plan:
    stages, free, halved = routed
    room = min(arm.nodes, room)
    return Plan(arm, stages, room, room // 2 if halved else room, free=free)


def capacity(arms: Sequence[Arm]) -> int:
    """The most nodes a tree of `arms` holds, the root included."""
    return max(2, max(a.nodes for a in arms) + 1)


def _in_order(tree: DraftTree, ordered: DraftTree | None,
              likelihood: Callable[[], list[float]]) -> DraftTree:
    """`tree`, or with `ordered` its copy likeliest path first by `likelihood()` [tree.n]."""
    if ordered is None or tree.n <= 2:
        return tree
    return tree.copy_depth_first(ordered, likelihood())


class FixedPolicy:
    """One tree size every round, every drafted node verified; nothing is learnt."""

    dropped: tuple[Arm, ...] = ()
    bandit = None
    shapes = Shapes.FREE   # no measured cost to weigh padding against: trees verify as they are

    def __init__(self, arm: Arm, stages: Sequence[Drafter]) -> None:
        self.arms = (arm,)
        self.capacity = capacity(self.arms)
        free = free_stages(stages, None)
        self._route = route(arm, free, draft_order(stages, free))

    def begin(self) -> None:
        """Nothing carries between generations."""

    def plan(self, room: int) -> Plan:
        return _plan(self.arms[0], self._route, room)

    def ran(self, stage: int, seconds: float) -> None:
        """Nothing is measured."""

    def select(self, tree: DraftTree, room: int, ordered: DraftTree | None) -> Batch:
        """Every drafted node, unpadded; in order, likeliest by the drafters' own log probabilities."""
        return Batch(_in_order(tree, ordered, lambda: tree.logp[:tree.n].tolist()))

    def observe(self, batch: Batch, path: tuple[int, ...], tokens: list[int], greedy: bool,
                started: float) -> None:
        """Nothing is measured."""

    def summary(self) -> dict:
        return {}

    def learnt(self) -> dict:
        return {}

    def resume(self, learnt: dict) -> None:
        """Nothing to resume."""


class AdaptivePolicy:
    """Arms chosen by measured throughput (with several) and nodes pruned to what pays (with a
    cost curve)."""

    def __init__(self, arms: tuple[Arm, ...], stages: Sequence[Drafter], costs: Costs | None,
                 shapes: Shapes, dropped: tuple[Arm, ...] = (), free: Sequence[bool] | None = None) -> None:
        """free: per stage, whether it is free (`free_stages`; None: the drafters without a model)."""
        self.arms = arms
        self.dropped = dropped
        self.shapes = shapes
        self.costs = costs
        self.capacity = capacity(arms)
        self.bandit = AdaptiveBudget(arms) if len(arms) > 1 else None
        free = tuple(free) if free is not None else free_stages(stages, None)
        order = draft_order(stages, free)
        self._routes = [route(a, free, order) for a in arms]
        # per arm: no model stage in its route, so the free stages' gates bound their growth
        # (with a model stage, what the free ones leave is the model's room: bounding them would
        # change its share)
        self._bounded = [all(free[s] for s in r[0]) for r in self._routes]
        self._acceptance = prune.AcceptanceModel(len(stages)) if costs is not None else None
        self._worth = StageWorth(len(stages), costs.target_cost(1)) if costs is not None else None
        self._kept = DraftTree(self.capacity)
        self._cost_tables: dict[tuple[int, bool], list[float]] = {}   # by (arm nodes, after plain)
        self._index = 0                # this round's arm
        self._held = 0                 # rounds left on it (stable shapes)
        self._after_plain = True       # the last round verified the root alone
        self._free = free

    def begin(self) -> None:
        """A new generation: choose afresh, and count the first round as leaving plain ones."""
        self._held = 0
        self._after_plain = True

    def plan(self, room: int) -> Plan:
        """This round's tree, with at most `room` nodes below the root; each free stage the arm
        runs asks its gate (worth.py) how many nodes it may add."""
        if self.bandit is not None and (self.shapes is not Shapes.STABLE or self._held <= 0):
            self._index, self._held = self.bandit.choose(), tuning.HOLD   # held only with stable shapes
        self._held -= 1
        plan = _plan(self.arms[self._index], self._routes[self._index], room)
        if self._worth is None:
            return plan
        bounded = self._bounded[self._index]
        allowed = [plan.room] * len(self._free)
        stages = []
        for s in plan.stages:
            if self._free[s]:
                most = self._worth.allows(s)
                if not most:
                    continue                  # it sits out this round
                if bounded:
                    allowed[s] = most
            stages.append(s)
        return replace(plan, stages=tuple(stages), allowed=tuple(allowed))

    def ran(self, stage: int, seconds: float) -> None:
        """A free stage's propose took `seconds` (its worth's cost)."""
        if self._worth is not None:
            self._worth.ran(stage, seconds)

    def select(self, tree: DraftTree, room: int, ordered: DraftTree | None) -> Batch:
        """The part of `tree` worth verifying on this machine (prune.py): `tree` itself, or a copy
        of its kept nodes (drafters keep their own node numbering of `tree`), padded as the
        batch-shape mode wants (Shapes.padding)."""
        if self._acceptance is None:
            chosen, pruned = tree, None
        else:
            chosen, pruned = self._pruned(tree)
        if ordered is not None:
            chosen = _in_order(chosen, ordered, lambda: self._likelihood(chosen))
        pad_to, top_up = self.shapes.padding(chosen.n, self.arms[self._index].nodes, room)
        return Batch(chosen, pad_to, top_up, pruned)

    def _pruned(self, tree: DraftTree) -> tuple[DraftTree, tuple[DraftTree, np.ndarray] | None]:
        """The nodes of `tree` that pay (a copy where some do not) and, then, (tree, keep mask)."""
        if tree.n <= 1:
            return tree, None
        cost = self._cost_table(self.arms[self._index], tree.n).__getitem__
        keep = prune.choose(tree, self._acceptance.node_probs(tree), cost)
        if keep.all():
            return tree, None
        return tree.copy_kept(keep, self._kept), (tree, keep)

    def _likelihood(self, tree: DraftTree) -> list[float]:
        """[tree.n] a score per node: its chance to be accepted, where that is modelled."""
        if self._acceptance is None:
            return tree.logp[:tree.n].tolist()
        return self._acceptance.node_probs(tree).tolist()

    def observe(self, batch: Batch, path: tuple[int, ...], tokens: list[int], greedy: bool,
                started: float) -> None:
        """The round verified `batch`, accepted `path` and committed `tokens`; it began at
        `started` (time.perf_counter), and is charged up to the end of this bookkeeping."""
        tree = batch.tree
        if self._acceptance is not None:
            self._acceptance.update(tree, path)
            if batch.pruned is not None:
                self._acceptance.observe_pruned(*batch.pruned, tokens, greedy)
        if self._worth is not None:
            n_stages = len(self._free)
            accepted = [0] * n_stages
            for node in path:
                accepted[tree.drafter[node]] += 1
            self._worth.observe(accepted, np.bincount(tree.drafter[1:tree.n], minlength=n_stages)[:n_stages])
        if self.bandit is not None:
            self.bandit.update(self._index, len(tokens), time.perf_counter() - started)
        self._after_plain = tree.n <= 1

    def _cost_table(self, arm: Arm, n: int) -> list[float]:
        """`Shapes.cost_table` for this round, cached per arm size and whether the round leaves a
        plain stretch (pruning asks for every k, each round)."""
        key = (arm.nodes, self._after_plain)
        table = self._cost_tables.get(key)
        if table is None or len(table) <= n:
            table = self._cost_tables[key] = self.shapes.cost_table(self.costs, arm.nodes,
                                                                    self._after_plain, n)
        return table

    def summary(self) -> dict:
        """Measured tok/s and rounds per arm (DecodeStats.budget)."""
        return self.bandit.summary() if self.bandit is not None else {}

    def learnt(self) -> dict:
        """What this policy measured about its drafters on this machine, to start the next run."""
        out: dict = {}
        if self.bandit is not None:
            out["budget"] = self.bandit.state()
        if self._acceptance is not None:
            out["acceptance"] = self._acceptance.state()
        if self._worth is not None:
            out["worth"] = self._worth.state()
        return out

    def resume(self, learnt: dict) -> None:
        """Start from `learnt()` of an earlier policy over the same stages."""
        if self.bandit is not None and isinstance(learnt.get("budget"), dict):
            self.bandit.load(learnt["budget"])
        if self._acceptance is not None and isinstance(learnt.get("acceptance"), dict):
            self._acceptance.load(learnt["acceptance"])
        if self._worth is not None and isinstance(learnt.get("worth"), dict):
            self._worth.load(learnt["worth"])


def make_policy(budget: TreeBudget, stages: Sequence[Drafter], costs: Costs | None,
                offloaded: bool) -> Policy:
    """The policy an engine over `stages` runs. costs: this machine's calibration (None: not
    measured); with it every round keeps only the drafted nodes that pay, which is the per-round
    gate (a round with no guess worth its batch is a plain step), and arms that could not beat
    plain decoding even in the best case are never tried. offloaded: the target runs on a GPU,
    which picks the batch-shape mode (Shapes.of)."""
    if not stages:
        return FixedPolicy(Arm(0), stages)
    free = free_stages(stages, costs)
    arms = budget.arms(not all(free), pruned=costs is not None, with_free=any(free))
    if costs is None and len(arms) == 1:
        return FixedPolicy(arms[0], stages)
    dropped: tuple[Arm, ...] = ()
    if costs is not None and len(arms) > 1:
        limits = next((d.limits for d, f in zip(stages, free) if not f), None)
        viable = costs.viable(arms, limits.width if limits else 4, limits.max_depth if limits else 8)
        # the free drafters' arm stands in for plain decoding (pruned rounds can be plain steps)
        kept = tuple(a for a in arms if a in viable or not a.models)
        dropped = tuple(a for a in arms if a not in kept)
        arms = kept
    return AdaptivePolicy(arms, stages, costs, Shapes.of(offloaded, costs), dropped, free)
