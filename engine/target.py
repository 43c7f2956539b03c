"""The target model: verifies a whole draft tree in ONE llama.cpp decode, then commits one path.

KV layout. The committed context lives in sequence 0 at positions 0..n_past-1. To verify a tree,
every root-to-leaf path gets a sequence id; the committed context is tagged with all of them
(`seq_cp`, metadata only in a unified cache) and each tree node carries the ids of the paths through
it, at position n_past + depth. So each node attends to the context and its own ancestors, nothing
else. `commit` is the one method that rolls the cache back: it removes every tree node off the
accepted path, and the accepted ones (root included) join every path's sequence, leaving the cache
as if only the accepted tokens had ever been evaluated.

The tags stay between rounds: sequence s holds the context up to `_tagged[s]`, and a verify tags
only what its paths lack (the tokens committed since they last served). Why: each tag is an entry
in llama.cpp's per-sequence position maps, so tagging the whole context for every path and
stripping it again after each round (and llama.cpp's seq_keep, which rewrites every cell) costs
time that grows with the context, paid every round: on a GPU more than a tenth of a round at a
1,000-token context (docs/decisions/0035). Kept, a round touches only its own cells.

Exact numerics (LlamaModel's exact) also need the cache's cells in position order: ggml's CPU flash
attention sums over cells in cell order, and llama.cpp puts a batch's tokens into the first free
cells, so a hole left by a rejected node before an accepted one would take a later token and
change the sums. There a commit keeps only the batch's accepted prefix in place (its rows are
cells in order after the context, and every cell after them goes, leaving no hole); accepted
nodes behind a rejected row are decoded again at the head of the next batch (`_pending`), their
logits already known and their KV recomputed bit for bit.

Across generations. The target remembers the tokens sequence 0 holds (`tokens`): a conversation's
next turn starts with the whole of the last one, so `keep_prefix` keeps the longest common prefix
and drops every cell after it, in every sequence, and only the new tokens are prefilled. With exact
numerics the kept cells are the context's in position order (the commits above leave no hole), and
the dropped tail frees the cells after them, where the next batch goes.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import LocalspecError
from .llama_model import EXACT_MAX_ROWS, LlamaModel, padded_rows
from .prefix import common_prefix
from .tree import DraftTree, TreeLayout


class Target:
    def __init__(self, model: LlamaModel, hidden_tail: int = 1) -> None:
        """hidden_tail: with hidden states, how many of a prefill's last tokens hand theirs back
        (`new_hidden`): a draft head's context (each costs an output row of logits)."""
        self.model = model
        self.hidden_tail = max(1, hidden_tail)
        self._new: tuple[int, np.ndarray] | None = None   # (position, batch rows): new_hidden's
        self.n_past = 0                      # committed tokens in the cache (sequence 0)
        self._layout: TreeLayout | None = None
        self._alone = False                  # the last verify decoded its root alone, unpadded
        self._pos = np.zeros(model.n_batch, np.int32)
        self.exact = model.exact
        self._pending: list[int] = []        # exact mode: committed tokens not in the cache yet
        self._row0 = 0                       # batch row of the tree's root in the last verify
        self.redecoded = 0                   # pending tokens decoded since the last reset
        self._tagged = np.zeros(model.n_seq_max, np.int64)   # [seq] context positions it holds
        self._tokens: list[int] = []         # every committed token: the cache's n_past, then pending

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def room(self) -> int:
        """Cache cells left for a tree (the root included)."""
        return self.model.n_ctx - self.n_past - len(self._pending)

    @property
    def tokens(self) -> list[int]:
        """The tokens the cache holds, positions 0..n_past-1 of sequence 0 (a copy)."""
        return self._tokens[:self.n_past]

    def reset(self) -> None:
        self.model.clear()
        self._forget(0)

    def keep_prefix(self, context: Sequence[int]) -> int:
        """Keep the cache's longest prefix that `context` starts with and drop everything after
        it (tree tags, exact mode's pending tokens); returns how many tokens were kept, from which
        `prefill` goes on. The tail is dropped whatever the bookkeeping says (a decode cut off by
        Ctrl+C leaves cells past n_past); a cache that cannot drop one (llama.cpp refuses) is
        cleared."""
        keep = common_prefix(self._tokens[:self.n_past], context)
        if not self.model.trim(keep):
            self.reset()
            return 0
        self._forget(keep)
        return keep

    def load_state(self, tokens: Sequence[int], state: np.ndarray) -> bool:
        """Replace the cache with a saved sequence 0 (`model.seq_state`) that holds `tokens`;
        False, and an empty cache, where llama.cpp refuses it or it does not hold them."""
        self.reset()
        if (len(tokens) >= self.model.n_ctx or not self.model.set_seq_state(state, 0)
                or self.model.seq_pos_max(0) != len(tokens) - 1):
            self.reset()
            return False
        self._tokens = [int(t) for t in tokens]
        self.n_past = len(tokens)
        return True

    def _forget(self, keep: int) -> None:
        """The bookkeeping of a cache that holds positions 0..keep-1 of sequence 0 and nothing else."""
        del self._tokens[keep:]
        self.n_past = keep
        self._layout = None
        self._new = None
        self._pending = []
        self.redecoded = 0
        np.minimum(self._tagged, keep, out=self._tagged)

    def prefill(self, tokens: Sequence[int]) -> None:
        """Evaluate committed tokens (not the root) into sequence 0, after any pending ones."""
        need = self.n_past + len(self._pending) + len(tokens) + 1
        if need > self.model.n_ctx:
            raise LocalspecError("Prompt is longer than the context",
                                 f"{need} tokens, context holds {self.model.n_ctx}",
                                 "Shorten the prompt, or raise the context with --ctx "
                                 f"(the model was trained for {self.model.n_ctx_train})")
        self._tokens += [int(t) for t in tokens]
        tokens = self._pending + list(tokens)
        self.redecoded += len(self._pending)
        self._pending = []
        if tokens:
            tail = min(self.hidden_tail, len(tokens), self.model.n_batch) if self.model.hidden else 1
            self.model.prefill(tokens, self.n_past, hidden_tail=tail)
            self.n_past += len(tokens)
            self._new = (self.n_past - tail, np.arange(tail))

    def new_hidden(self) -> tuple[int, np.ndarray] | None:
        """The target's final hidden states of the tokens the last prefill (its tail) or commit
        (the root and accepted path) put in the cache: (position of the first, [r, n_embd] copy).
        None without hidden states. Read it before the next verify."""
        if self._new is None or not self.model.hidden:
            return None
        start, rows = self._new
        return start, self.model.hidden_rows()[rows]   # fancy indexing: a copy

    def verify(self, tree: DraftTree, pad_to: int = 0, top_up: bool = True) -> np.ndarray:
        """Decode every tree node in one batch; returns [tree.n, vocab] logits (zero-copy view).

        pad_to: fill the batch up to this many tokens (at least one more than the tree) with
        padding in the context's reserved padding sequences, which share no cell with the tree or
        the context, so no node sees it and `commit` drops it (top_up: LlamaModel.decode). Every
        round then has the same batch
        shape: on a GPU llama.cpp reuses its graph and replays its CUDA graph instead of
        re-capturing it when the shape changes (docs/decisions/0008).
        """
        layout = tree.layout()
        n_paths = len(layout.leaf_seq)
        n = padded_rows(tree.n, pad_to, top_up)
        if self._pending and (pad_to or len(self._pending) + n > EXACT_MAX_ROWS):
            self.prefill(())   # their own batch: within ggml's row-alone attention, unpadded
        k = len(self._pending)
        if n_paths > self.model.n_seq_max or n + k > min(self.model.n_batch, self.room + k):
            raise ValueError(f"tree of {tree.n} nodes / {n_paths} paths (padded to {n}) exceeds the "
                             "target's limits")
        for seq in range(1, n_paths):        # the context each path lacks (committed since)
            if self._tagged[seq] < self.n_past:
                self.model.seq_cp(0, seq, int(self._tagged[seq]), self.n_past)
                self._tagged[seq] = self.n_past
        pos = self._pos[:k + tree.n]
        np.add(layout.depth, self.n_past + k, out=pos[k:])      # [tree.n] position of each node
        self._row0 = k
        self._layout = layout
        self._alone = tree.n == 1 and not pad_to
        if not k:
            self.model.decode(tree.tokens[:tree.n], pos, layout.seq_ids, logits=True,
                              pad_to=n if pad_to else 0, top_up=top_up)
            return self.model.logits()[:tree.n]
        # exact mode: the pending tokens first, seen by every path (never padded: see above)
        pos[:k] = np.arange(self.n_past, self.n_past + k)
        tokens = np.concatenate([np.asarray(self._pending, np.int32), tree.tokens[:tree.n]])
        seq_ids = (tuple(range(n_paths)),) * k + layout.seq_ids
        self.redecoded += k
        self._pending = []
        mask = np.ones(k + tree.n, bool)
        mask[:k] = False
        self.model.decode(tokens, pos, seq_ids, logits=mask)
        return self.model.logits()

    def commit(self, tree: DraftTree, path: Sequence[int]) -> None:
        """Keep the root and the accepted `path` (node indices, root excluded) in the context:
        sequence 0 and every sequence of the verify's paths."""
        layout = self._layout
        if layout is None:
            raise RuntimeError("commit() without a verify()")
        last = path[-1] if path else 0
        k = self._row0                  # pending tokens decoded ahead of the tree
        self._new = (self.n_past + k, k + np.asarray([0, *path]))   # tree node i is batch row k + i
        self._layout = None
        self._tokens += [int(tree.tokens[node]) for node in (0, *path)]
        if self._alone:   # a root decoded alone in sequence 0, unpadded: nothing to roll back
            self.n_past += k + 1
            return
        seq = layout.leaf_seq[tree.first_leaf_below(last)]
        kept = len(path)
        if self.exact:   # only the batch's accepted prefix stays: nodes 0..kept-1 are rows 0..kept-1
            kept = next((i for i, node in enumerate(path) if node != i + 1), len(path))
            self._pending = [int(tree.tokens[node]) for node in path[kept:]]
        end = self.n_past + k + kept           # position of the last node kept in the cache
        self._keep(seq, len(layout.leaf_seq), self.n_past, end)
        self.n_past = end + 1

    def _keep(self, seq: int, n_paths: int, start: int, end: int) -> None:
        """After a verify of `n_paths` paths whose batch began at position `start`: keep path
        `seq`'s cells up to position `end` and make every path's sequence hold them; drop every
        other cell of the batch (padding included). Cells before `start` are not touched."""
        model = self.model
        for s in range(n_paths):
            if s != seq:
                model.seq_rm(s, start, -1)     # other paths' nodes, and their tags on ours
        model.seq_rm(seq, end + 1, -1)         # our path's nodes past the accepted ones
        for s in range(n_paths):
            if s != seq:
                model.seq_cp(seq, s, start, end + 1)
        self._tagged[:n_paths] = end + 1
        model.drop_padding()
