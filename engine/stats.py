"""Acceptance and timing statistics: first-class output of every generation.

Per stage (drafter): nodes proposed and accepted at each tree depth, and the rounds it proposed
in and the time they took. Per generation: target calls, tokens, tokens per target call, and wall
time per phase of the round.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tree import DraftTree

# a round's phases, in order: "accept" is the walk down the verified tree, "observe" the emit and
# what the drafters and the policy are told of the round
PHASES = ("prefill", "propose", "verify", "accept", "commit", "observe")


@dataclass
class StageStats:
    name: str
    proposed: list[int] = field(default_factory=list)   # [depth-1] nodes proposed at that depth
    accepted: list[int] = field(default_factory=list)   # [depth-1] of those, accepted
    rounds: int = 0                                      # rounds it proposed in
    seconds: float = 0.0                                 # its propose calls' time, catch-up apart

    def _grow(self, depth: int) -> None:
        while len(self.proposed) < depth:
            self.proposed.append(0)
            self.accepted.append(0)

    @property
    def acceptance(self) -> float:
        total = sum(self.proposed)
        return sum(self.accepted) / total if total else 0.0

    def to_dict(self) -> dict:
        return {"name": self.name, "proposed": sum(self.proposed), "accepted": sum(self.accepted),
                "acceptance": round(self.acceptance, 4), "rounds": self.rounds,
                "propose_seconds": round(self.seconds, 4),
                "proposed_by_depth": list(self.proposed), "accepted_by_depth": list(self.accepted)}


@dataclass
class DecodeStats:
    stages: list[StageStats]
    prompt_tokens: int = 0
    reused_tokens: int = 0          # of the prompt, kept in the cache from the last generation
    context_size: int = 0           # the target's context in tokens (what the prompt and reply share)
    tokens: int = 0
    target_calls: int = 0
    drafted_tokens: int = 0         # emitted tokens that came from drafts
    pruned: int = 0                 # drafted nodes not verified: expected to cost more than they return
    redecoded: int = 0              # exact numerics: accepted tokens decoded again (a rejected row preceded them)
    seconds: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    budget: dict = field(default_factory=dict)   # adaptive budget: measured tok/s per node budget

    def record_round(self, tree: DraftTree, path: tuple[int, ...]) -> None:
        self.target_calls += 1
        if tree.n <= 1:   # a plain step (no guess, or all pruned): nothing drafted to count
            return
        depths, stages = tree.depth[1:tree.n], tree.drafter[1:tree.n]
        for s, stage in enumerate(self.stages):
            mine = depths[stages == s]
            if mine.size:
                stage._grow(int(mine.max()))
                counts = np.bincount(mine - 1)
                for d, c in enumerate(counts):
                    stage.proposed[d] += int(c)
        for node in path:
            stage = self.stages[int(tree.drafter[node])]
            d = int(tree.depth[node])
            stage._grow(d)
            stage.accepted[d - 1] += 1

    @property
    def decode_seconds(self) -> float:
        return sum(v for k, v in self.seconds.items() if k != "prefill")

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.target_calls if self.target_calls else 0.0

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "reused_tokens": self.reused_tokens,
                "context_size": self.context_size, "tokens": self.tokens,
                "target_calls": self.target_calls, "pruned": self.pruned, "redecoded": self.redecoded,
                "tokens_per_call": round(self.tokens_per_call, 3),
                "tokens_per_second": round(self.tokens_per_second, 2),
                "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
                "stages": [s.to_dict() for s in self.stages], "budget": self.budget}

    def summary(self) -> str:
        lines = [f"{self.tokens} tokens in {self.decode_seconds:.2f}s = {self.tokens_per_second:.1f} tok/s "
                 f"(prompt {self.prompt_tokens} tokens"
                 + (f", {self.reused_tokens} of them kept from the last reply" if self.reused_tokens else "")
                 + f", prefill {self.seconds['prefill']:.2f}s)",
                 f"target calls {self.target_calls}, tokens per call {self.tokens_per_call:.2f}"
                 + (f", drafted nodes pruned before verification {self.pruned}" if self.pruned else "")
                 + (f", accepted tokens decoded again (exact numerics) {self.redecoded}"
                    if self.redecoded else "")]
        for s in self.stages:
            by_depth = " ".join(f"{a}/{p}" for a, p in zip(s.accepted, s.proposed))
            lines.append(f"  {s.name}: accepted {sum(s.accepted)}/{sum(s.proposed)} "
                         f"({100 * s.acceptance:.1f}%)  by depth: {by_depth}")
        if self.budget:
            lines.append("  budget (nodes: tok/s over rounds): " + "  ".join(
                f"{k}: {v['tok_s']:.1f}/{v['rounds']}" for k, v in self.budget.items()))
        t = self.seconds
        lines.append("  time: " + "  ".join(f"{k} {t[k]:.3f}s" for k in PHASES))
        return "\n".join(lines)
