"""A GGUF draft model run by llama.cpp in its own context: the draft for CPU-only machines.

It grows trees best-first through `grow`, evaluating each layer of the tree in one batch. Tree
nodes live in sequences 1.. of the draft's own cache (the committed context is sequence 0): a node
extends its parent's sequence when it is the first child to do so, otherwise it starts a new one
from a copy of the parent's path. After each round the tree sequences are dropped; committed
tokens are fed again at the next root evaluation, together with the new root.

On a GPU (`stable_shapes`) every forward has one shape, so that llama.cpp reuses its graph and
ggml-cuda replays its CUDA graph: after any change of batch shape ggml-cuda runs two forwards
uncaptured and captures again, which costs several steady forwards. A linear draft decodes one
token per forward, its root's catch-up too, token by token; a wider one pads every forward to
`limits.pad_rows` rows (the padding goes in the context's padding sequences and is removed at
once). Rows are not free there, so the padding is the least that keeps one shape. With a
llama.cpp that keeps a CUDA graph per shape (packaging/patches; `Costs.cheap_switch`) the builder
passes `stable_shapes=False` and the draft's batches take whatever size they need. The figures:
docs/decisions/0008.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..config import DraftLimits, SamplingParams
from ..distribution import Dist, process, top_dist
from ..errors import LocalspecError
from ..llama_model import LlamaModel
from ..prefix import common_prefix
from ..tree import DraftTree
from .base import States
from .grow import GrowLimits, grow

if TYPE_CHECKING:
    from ..costs import Costs




class LlamaDraft:
    name = "gguf-draft"
    uses_model = True
    copies = False

    def __init__(self, model: LlamaModel, limits: DraftLimits = DraftLimits(),
                 stable_shapes: bool = False) -> None:
        self.model = model
        self.limits = limits
        # rows of every forward when shapes are kept stable (0: unpadded)
        self.pad = 0
        if stable_shapes:
            if model.n_pad_seqs < limits.pad_rows - 1 or model.n_batch < limits.pad_rows:
                raise ValueError(f"stable shapes need {limits.pad_rows - 1} padding sequences and a "
                                 f"batch of {limits.pad_rows}")
            self.pad = limits.pad_rows
        self.vocab_size = model.vocab_size
        self._context: list[int] = []
        self._cached = 0                    # committed tokens in sequence 0
        self._seq_of: dict[int, int] = {}   # tree node -> its sequence this round
        self._claimed: set[int] = set()     # nodes whose sequence a child already extends
        self._next_seq = 1
        self._sampling = SamplingParams()
        self._tree: DraftTree | None = None

    @classmethod
    def load(cls, path: str | Path, *, n_ctx: int, max_nodes: int, n_gpu_layers: int = -1,
             n_threads: int | None = None, limits: DraftLimits = DraftLimits(),
             stable_shapes: bool | None = None) -> "LlamaDraft":
        """stable_shapes None: when the draft is offloaded to a GPU."""
        model = LlamaModel(path, n_ctx=n_ctx, n_seq_max=max_nodes + 1,
                           n_gpu_layers=n_gpu_layers, n_threads=n_threads,
                           n_pad_seqs=limits.pad_rows - 1)
        stable = model.n_gpu_layers != 0 if stable_shapes is None else stable_shapes
        return cls(model, limits, stable)

    # ---- Drafter protocol --------------------------------------------------------------------
    def begin(self, context: Sequence[int], states: States = None) -> None:
        if len(context) + 1 > self.model.n_ctx:
            raise LocalspecError("Prompt is longer than the draft's context",
                                 f"{len(context)} tokens, draft context {self.model.n_ctx}",
                                 "Shorten the prompt or raise --ctx")
        self.rollback()
        # the cache's part that this context starts with stays (a conversation's next turn);
        # the root is never cached before its round
        keep = common_prefix(self._context[:self._cached], context[:-1])
        if not self.model.trim(keep):
            self.model.clear()
            keep = 0
        self._context = list(context)
        self._cached = keep
        self._forget_tree()

    def propose(self, tree: DraftTree, stage: int, budget: int, sampling: SamplingParams,
                rng: np.random.Generator) -> None:
        room = self.model.n_ctx - len(self._context) - 1 - self.pad
        limits = GrowLimits.of(min(budget, room, self.model.n_seq_max - 1), self.limits)
        self._sampling = sampling
        self._tree = tree
        try:
            grow(tree, stage, limits, sampling, rng, self)
        except BaseException:
            self.rollback()
            raise

    def accept(self, tokens: Sequence[int], states: States = None) -> None:
        """Keep the evaluated part of the accepted path in the cache; drop the other tree nodes."""
        node, deepest = 0, 0
        tree = self._tree
        if tree is not None:
            for tok in tokens[:-1]:
                node = tree.child_with_token(node, tok)
                if node < 0 or node not in self._seq_of:
                    break
                deepest = node
        if deepest:
            self.model.keep_path(self._seq_of[deepest], self._cached - 1 + int(tree.depth[deepest]))
            self._cached += int(tree.depth[deepest])
            self._forget_tree()
        else:
            self.rollback()
        self._context.extend(tokens)

    def catch_up(self) -> None:
        """The engine times this apart from the round (decode.py)."""
        self._read_backlog()

    def _read_backlog(self) -> None:
        """The committed tokens not in the cache yet, all but the root, as one prefill; on stable
        shapes only a long backlog: evaluate_root's padded steps take the last `pad - 1`."""
        todo = self._context[self._cached:]
        keep = max(1, self.pad - 1) if self.pad else 1   # left for evaluate_root, the root among them
        if len(todo) <= (4 * keep if self.pad else 1):
            return
        self.model.prefill(todo[:-keep], self._cached)
        self._cached += len(todo) - keep

    def cost_curve(self, costs: Costs) -> Costs:
        return costs          # calibrate.py measured this draft beside the target

    def close(self) -> None:
        self.model.close()

    # ---- TreeEvaluator -----------------------------------------------------------------------
    def _dist(self, row: np.ndarray) -> Dist:
        if self._sampling.greedy:
            return top_dist(row, self.limits.branching)
        return process(row, self._sampling)

    def evaluate_root(self, tree: DraftTree) -> Dist:
        self._read_backlog()                  # a long backlog: one unpadded prefill
        todo = self._context[self._cached:]   # always holds at least the root
        if not self.pad:
            self.model.prefill(todo, self._cached)
            row = self.model.logits()[-1]
        else:
            start = self._cached
            step = max(1, self.pad - 1)              # real tokens a forward takes
            for lo in range(0, len(todo), step):
                chunk = todo[lo:lo + step]
                self._decode(chunk, np.arange(start + lo, start + lo + len(chunk), dtype=np.int32),
                             None)
            row = self.model.logits()[len(chunk) - 1]
        self._cached = len(self._context)
        self._seq_of = {0: 0}
        self._claimed = set()
        self._next_seq = 1
        return self._dist(row)

    def evaluate(self, tree: DraftTree, nodes: Sequence[int]) -> list[Dist]:
        root_pos = self._cached - 1
        seqs = []
        for node in nodes:
            parent = int(tree.parent[node])
            pseq = self._seq_of[parent]
            if parent != 0 and parent not in self._claimed:
                seq = pseq                        # extend the parent's own path
            else:                                 # a new path: copy context + path to parent
                seq = self._next_seq
                self._next_seq += 1
                self.model.seq_cp(pseq, seq, -1, root_pos + int(tree.depth[parent]) + 1)
            self._claimed.add(parent)
            self._seq_of[node] = seq
            seqs.append((seq,))
        pos = root_pos + tree.depth[list(nodes)]
        self._decode(tree.tokens[list(nodes)], pos, seqs)
        rows = self.model.logits()
        return [self._dist(rows[i]) for i in range(len(nodes))]

    def _decode(self, tokens: Sequence[int] | np.ndarray, pos: np.ndarray,
                seqs: Sequence[Sequence[int]] | None) -> None:
        """One forward with logits for every token; padded to `pad` rows (its padding removed at
        once) unless it is larger."""
        if self.pad > 1 and len(tokens) < self.pad:
            self.model.decode(tokens, pos, seqs, logits=True, pad_to=self.pad)
            self.model.drop_padding()
        else:
            self.model.decode(tokens, pos, seqs, logits=True)

    def rollback(self) -> None:
        for seq in range(1, self._next_seq):
            self.model.seq_rm(seq, -1, -1)
        self._forget_tree()

    def _forget_tree(self) -> None:
        self._tree = None
        self._next_seq = 1
        self._seq_of = {0: 0}
        self._claimed = set()
