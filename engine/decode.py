"""The decode loop: one round per target call, read top to bottom.

plan -> propose -> select -> verify -> walk -> commit -> emit -> observe. The policy (policy.py)
plans the round's tree; the stages grow it in the plan's order (policy.draft_order); the policy
selects the batch: the part worth verifying on this machine (prune.py), in its order and padding
(shapes.py); the target verifies it in a single decode; the accepted path is walked (greedy or
rejection sampling, verify.py), committed in the target's cache and emitted; every drafter is
told what was committed, with what the target's batch computed for it (the Drafter protocol's
states), and the policy what the batch accepted and the round cost. Plain decoding is the
same loop with no stages: a tree of just the root, one token per call, so both modes share every
line of the exact path. Every generation's first round is such a round (`_first_batch`): the first
token waits for the prefill and one step, as in plain decoding.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import numpy as np

from .config import GenerationRequest, SamplingParams
from .drafters.base import Drafter
from .errors import LocalspecError, vocab_mismatch
from .generation import Event, Finished, Generation, Round
from .policy import Batch, Plan, Policy
from .stats import DecodeStats, StageStats
from .target import Target
from .text import TextStream
from .timing import Stopwatch
from .tree import DraftTree
from .verify import greedy_walk, sample_walk


class Engine:
    """A target, its stages (cheapest first) and the policy that chooses their trees."""

    def __init__(self, target: Target, stages: Sequence[Drafter], policy: Policy,
                 likeliest_first: bool = True) -> None:
        """policy: built for these stages (policy.make_policy). likeliest_first: with exact
        numerics, verify each tree depth-first with its likeliest path first, the batch prefix
        that stays in place when accepted (False: proposal order, whose accepted rows behind a
        rejected one are decoded again)."""
        for d in stages:
            vocab = d.vocab_size
            if vocab is not None and vocab != target.vocab_size:
                raise vocab_mismatch(d.name, vocab, target.model.path.name, target.vocab_size)
        self.target = target
        self.stages = list(stages)
        self.policy = policy
        self._tree = DraftTree(policy.capacity)
        self._ordered = DraftTree(policy.capacity) if target.exact and likeliest_first else None

    def generate(self, request: GenerationRequest,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[Event]:
        """Stream a Round for each round that made text or tokens final, then one Finished with
        the Generation (generation.py).

        should_stop, when given, is asked before each round; True ends the generation there with
        finish_reason "stopped" (text held back for a possible stop string is released as a last
        Round), and the Generation keeps its statistics."""
        prompt = list(request.tokens)
        if not prompt:
            raise LocalspecError("Empty prompt", "the prompt has no tokens", "Pass some text")
        stats = DecodeStats(stages=[StageStats(d.name) for d in self.stages], prompt_tokens=len(prompt))
        texts: list[str] = []
        tokens: list[int] = []
        sources: list[str] = []
        sampling = request.sampling
        rng = np.random.default_rng(sampling.seed)
        stream = TextStream(self.target.model.piece, request.stop)
        watch = Stopwatch(stats.seconds)
        if request.reuse:
            stats.reused_tokens = self.target.keep_prefix(prompt[:-1])
        else:
            self.target.reset()
        stats.context_size = self.target.model.n_ctx
        self.target.prefill(prompt[stats.reused_tokens:-1])
        states = self.target.new_hidden()                 # what the batch hands the stages
        for d in self.stages:
            d.begin(prompt, states)
        watch.lap("prefill")
        self.policy.begin()
        root = prompt[-1]
        first = True   # the first round verifies its root alone: see _first_batch
        while True:
            if self.target.room < 2:
                finish_reason = "context"
                break
            if should_stop is not None and should_stop():
                finish_reason = "stopped"
                tail = stream.flush()
                if tail:
                    texts.append(tail)
                    yield Round(tail, (), ())
                break
            watch.start()
            if first:
                batch, owed = self._first_batch(root), 0.0
            else:
                plan = self.policy.plan(min(self.target.room, self.policy.capacity) - 1)
                drafted, owed = self._propose(root, plan, sampling, rng, stats.stages)
                batch = self.policy.select(drafted, self.target.room, self._ordered)
                stats.pruned += drafted.n - batch.tree.n
            tree = batch.tree
            watch.lap("propose")
            rows = self.target.verify(tree, batch.pad_to, batch.top_up)   # [tree.n, vocab] logits
            watch.lap("verify")
            walk = greedy_walk(tree, rows) if sampling.greedy else sample_walk(tree, rows, sampling, rng)
            watch.lap("accept")
            self.target.commit(tree, walk.path)
            stats.redecoded = self.target.redecoded
            watch.lap("commit")
            stats.record_round(tree, walk.path)
            new = [int(tree.tokens[n]) for n in walk.path] + [walk.token]   # the round's tokens
            text, emitted, reason = self._emit(new, tokens, stream, request.max_tokens)
            names = [self.stages[int(tree.drafter[n])].name for n in walk.path[:emitted]]
            names += ["target"] * (emitted - len(names))                   # [emitted] proposers
            sources += names
            stats.tokens = len(tokens)
            stats.drafted_tokens += min(len(walk.path), emitted)
            states = self.target.new_hidden()
            for d in self.stages:
                d.accept(new, states)
            if not first:
                self.policy.observe(batch, walk.path, new, sampling.greedy, watch.started + owed)
            first = False
            watch.lap("observe")
            if reason:
                text += stream.flush()
            if emitted or text:
                texts.append(text)
                yield Round(text, tuple(new[:emitted]), tuple(names))
            if reason:
                finish_reason = reason
                break
            root = walk.token
        stats.budget = self.policy.summary()
        yield Finished(Generation("".join(texts), tokens, finish_reason, stats, sources))

    def _first_batch(self, root: int) -> Batch:
        """The first round of a generation: its root alone, unpadded, drafted by no stage, as
        plain decoding runs it. The first token then waits for the prefill and one step only, not
        for a tree's drafting and its verify of many rows (which costs more than a step wherever
        rows are not free): a reply's time to first token is plain decoding's. The policy learns
        nothing from it (it chose nothing); the stages are told its token as after any round."""
        self._tree.reset(root)
        return Batch(self._tree)

    def _propose(self, root: int, plan: Plan, sampling: SamplingParams, rng: np.random.Generator,
                 counted: Sequence[StageStats]) -> tuple[DraftTree, float]:
        """This round's tree from `root`, grown by the plan's stages in order, and the seconds
        its stages spent catching up on rounds they sat out. Every planned stage its budget lets
        add a node proposes (Plan.budget: the room left, and a free stage's gate), its time
        counted in `counted` [stage] and, for a free stage, told to the policy (its worth); a
        model stage with no room left ends the round's drafting. The round's arm
        is charged without the catching up: a stage owes it for the tokens, whichever arm runs it
        next, and a stage played every round owes nothing, so an arm probed rarely would otherwise
        be charged for its absence (0024)."""
        tree = self._tree
        tree.reset(root)
        owed = 0.0
        for stage in plan.stages:
            d = self.stages[stage]
            free = stage in plan.free
            budget = plan.budget(stage, tree.n - 1)
            if budget <= 0:
                if not free:
                    break
                continue
            caught = time.perf_counter()
            d.catch_up()
            began = time.perf_counter()
            owed += began - caught
            d.propose(tree, stage, budget, sampling, rng)
            spent = time.perf_counter() - began
            counted[stage].rounds += 1
            counted[stage].seconds += spent
            if free:
                self.policy.ran(stage, spent)
        return tree, owed

    def learnt(self) -> dict:
        """What this engine measured about its drafters on this machine, to start the next run
        from (session.py keeps it next to the calibration)."""
        return {"stages": [d.name for d in self.stages], **self.policy.learnt()}

    def resume(self, learnt: dict) -> None:
        """Start from `learnt()` of an earlier engine with the same stages (else ignore it)."""
        if learnt.get("stages") == [d.name for d in self.stages]:
            self.policy.resume(learnt)

    def _emit(self, new: list[int], tokens: list[int], stream: TextStream,
              max_tokens: int) -> tuple[str, int, str]:
        """Append committed tokens to the generation's `tokens` until a stop; (text, tokens
        emitted, reason)."""
        out: list[str] = []
        for n, token in enumerate(new):
            if self.target.model.is_eog(token):
                return "".join(out), n, "stop"
            tokens.append(token)
            out.append(stream.feed(token))
            if stream.stopped:
                return "".join(out), n + 1, "stop"
            if len(tokens) >= max_tokens:
                return "".join(out), n + 1, "length"
        return "".join(out), len(new), ""
