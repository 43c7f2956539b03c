"""A draft head: a small network on the target's own hidden state, the cheapest neural drafter.

The target hands back, next to its logits, the final hidden state h of every row it decodes
(`Target.last_hidden`: the state whose logits chose the root). The head predicts the next state
from a state and the token that follows it, and reads next-token logits through the target's own
output matrix, restricted to the tokens it was trained to draft (EAGLE's idea, without attention):

    u = W_in [rms(f); rms(e(x))]        f: the state before token x, e: the target's embedding
    f' = g * rms(u + W2 silu(W1 u))     the predicted state after x (trained to match h there)
    logits = O_sub f'                   O_sub: the target's output rows of the draft vocabulary

The root is drafted from (h, root); a deeper node from its parent's predicted state and its own
token, so a tree layer is one batched step: three d x d matmuls and one [V_sub, d] product, where
the target runs its whole model. Trees grow through `grow` like the other neural drafters'.

Weights are a .npz (models/head_file.py) written by `localspec.models.head_train`. The frozen tables (the draft vocabulary's embedding and output
rows) are read from the target's GGUF at load; other tokens' embedding rows when first met.

A step costs a fraction of a target step on a GPU, but the heads trained so far guess the
target's token too rarely to pay for the rows they add to a verify: it is experimental (`--head`;
docs/decisions/0011).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from localspec.models.gguf_file import GGUFInfo, read_gguf, tensor_rows
from localspec.models.head_file import ARRAYS, bad_head, read_head

from ..config import DraftLimits, SamplingParams
from ..distribution import Dist
from ..errors import LocalspecError
from ..tree import DraftTree
from .grow import GrowLimits, grow
from .torch_draft import greedy_rows, process_rows

if TYPE_CHECKING:
    from ..calibrate import Costs

_BUCKETS = (1, 2, 4, 8, 16, 32)   # rows a GPU step is padded to (one CUDA graph each)
_EXTRA = 4096                     # embedding rows for tokens outside the draft vocabulary
_EPS = 1e-6
_EMB, _OUT, _NORM = "token_embd.weight", "output.weight", "output_norm.weight"


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + _EPS).to(x.dtype)


class HeadNet(torch.nn.Module):
    """The trainable part: (state, token embedding) -> the next state."""

    def __init__(self, d: int, ff: int | None = None) -> None:
        super().__init__()
        ff = ff or 2 * d
        self.w_in = torch.nn.Linear(2 * d, d, bias=False)
        self.w1 = torch.nn.Linear(d, ff, bias=False)
        self.w2 = torch.nn.Linear(ff, d, bias=False)
        self.norm = torch.nn.Parameter(torch.ones(d))
        torch.nn.init.normal_(self.w2.weight, std=0.02 / d ** 0.5)

    def forward(self, f: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        u = self.w_in(torch.cat([rms(f), rms(e)], dim=-1))
        return rms(u + self.w2(F.silu(self.w1(u)))) * self.norm

    def arrays(self) -> dict[str, np.ndarray]:
        """The weights as the head file keeps them (models/head_file.py), float16."""
        params = {"w_in": self.w_in.weight, "w1": self.w1.weight, "w2": self.w2.weight, "norm": self.norm}
        return {k: params[k].detach().float().cpu().numpy().astype(np.float16) for k in ARRAYS}


def target_info(path: str | Path) -> GGUFInfo:
    """The target's GGUF, as a head reads its tables: one file (a split model's tables may sit in
    later parts)."""
    info = read_gguf(Path(path))
    if int(info.metadata.get("split.count", 1) or 1) > 1 or not {_EMB, _NORM} <= set(info.tensors):
        raise LocalspecError("Draft heads need a one-file target",
                             f"'{info.path}' is part of a split model (or lacks its embedding)",
                             "Merge the parts into one .gguf (llama.cpp's gguf-split --merge), "
                             "or run without --head")
    return info


def target_tables(target: str | Path | GGUFInfo, vocab: np.ndarray | None, emb_rows: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From the target's GGUF (its path, or `target_info`): the token embedding's rows `emb_rows`
    (None: all) [., d], the output rows for `vocab` (None: all) [., d] and the output norm [d],
    float32, dequantised from the memory-mapped file."""
    info = target if isinstance(target, GGUFInfo) else target_info(target)
    emb = tensor_rows(info, _EMB, emb_rows)
    if _OUT in info.tensors:
        out = tensor_rows(info, _OUT, vocab)
    elif emb_rows is vocab:                    # tied embeddings: the embedding is the output
        out = emb
    else:
        out = emb[np.asarray(vocab, np.int64)] if emb_rows is None else tensor_rows(info, _EMB, vocab)
    return emb, out, tensor_rows(info, _NORM).reshape(-1)


class DraftHead:
    """A trained head with the target's frozen tables, on one device, ready to step."""

    def __init__(self, path: str | Path, target_gguf: str | Path, *, n_embd: int, vocab_size: int,
                 device: str | None = None) -> None:
        path = Path(path).expanduser()
        meta, arrays = read_head(path)
        if meta.get("n_embd") != n_embd or meta.get("vocab_size") != vocab_size:
            raise bad_head(path, f"made for a target with hidden size {meta.get('n_embd')} and "
                                  f"{meta.get('vocab_size')} tokens ({meta.get('target')}); this "
                                  f"target has {n_embd} and {vocab_size}")
        self.path, self.meta = path, meta
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.device = dev
        self.dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        self.vocab = arrays["vocab"].astype(np.int64)                          # [V_sub]
        self._gguf = target_info(target_gguf)
        emb, out, _ = target_tables(self._gguf, self.vocab, emb_rows=self.vocab)   # [V_sub, d] each
        self.net = HeadNet(n_embd, arrays["w1"].shape[0])
        with torch.no_grad():
            for name in ("w_in", "w1", "w2"):
                getattr(self.net, name).weight.copy_(torch.from_numpy(arrays[name].astype(np.float32)))
            self.net.norm.copy_(torch.from_numpy(arrays["norm"].astype(np.float32)))
        self.net.to(dev, self.dtype).eval()
        # Embedding rows: the draft vocabulary's, then _EXTRA slots filled on demand with other
        # tokens' (a root or a cheaper stage's node may be any token), dequantised from the file.
        # Loading the whole [V, d] table would take seconds and half a gigabyte (docs/decisions/0011).
        self.emb = torch.zeros(len(self.vocab) + _EXTRA, n_embd, device=dev, dtype=self.dtype)
        self.emb[:len(self.vocab)] = torch.from_numpy(emb).to(dev, self.dtype)
        self._slot = np.full(vocab_size, -1, np.int64)                         # token -> emb row
        self._slot[self.vocab] = np.arange(len(self.vocab))
        self._extra: list[int] = []                                            # tokens in extra rows
        self.out = torch.from_numpy(out).to(dev, self.dtype)                   # [V_sub, d]
        self.vocab_size = vocab_size
        # On a GPU a step is ~20 small kernels: replayed as one CUDA graph per row bucket
        self._graphs: dict[int, tuple] = {}
        self.graphs = dev.type == "cuda"

    @torch.inference_mode()
    def _run(self, f: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        nxt = self.net(f, self.emb[slots])
        return nxt, (nxt @ self.out.T).float()

    def _slots(self, tokens: Sequence[int]) -> np.ndarray:
        """Embedding rows of `tokens`, bringing in the rows of tokens outside the draft vocabulary."""
        ids = np.asarray(tokens, np.int64)
        slots = self._slot[ids]
        missing = sorted({int(t) for t in ids[slots < 0]})
        if missing:
            base = len(self.vocab)
            if len(self._extra) + len(missing) > _EXTRA:   # full: start the extra rows over
                self._slot[self._extra] = -1
                self._extra.clear()
                missing = sorted({int(t) for t in ids[self._slot[ids] < 0]})   # this batch's too
            rows = tensor_rows(self._gguf, _EMB, missing)
            at = base + len(self._extra)
            with torch.inference_mode():
                self.emb[at:at + len(missing)] = torch.from_numpy(rows).to(self.device, self.dtype)
            self._slot[missing] = np.arange(at, at + len(missing))
            self._extra += missing
            slots = self._slot[ids]
        return slots

    @torch.inference_mode()
    def step(self, f: torch.Tensor, tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """f [n, d] states before `tokens` [n]: (states after them [n, d], logits [n, V_sub] f32).
        On a GPU both are views of a graph's buffers, valid until the next step of that size."""
        n = len(tokens)
        ids = torch.from_numpy(self._slots(tokens))
        if not self.graphs or n > _BUCKETS[-1]:
            return self._run(f, ids.to(self.device))
        rows = next(b for b in _BUCKETS if b >= n)
        g = self._graphs.get(rows) or self._capture(rows)
        graph, f_in, ids_in, state, logits = g
        f_in[:n].copy_(f)
        ids_in[:n].copy_(ids, non_blocking=True)
        graph.replay()
        return state[:n], logits[:n]

    def _capture(self, rows: int) -> tuple:
        d = self.out.shape[1]
        f_in = torch.zeros(rows, d, device=self.device, dtype=self.dtype)
        ids_in = torch.zeros(rows, dtype=torch.int64, device=self.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._run(f_in, ids_in)          # warm-up outside the graph (allocations, kernels)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            state, logits = self._run(f_in, ids_in)
        self._graphs[rows] = (graph, f_in, ids_in, state, logits)
        return self._graphs[rows]

    def measure(self, sizes: Sequence[int] = (1, 2, 4, 8), reps: int = 5) -> dict[int, float]:
        """Seconds per step of n rows (the adaptive budget's draft curve), fastest of `reps`."""
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        best = {n: float("inf") for n in sizes}
        for rep in range(reps + 1):
            for n in sizes:
                f = torch.ones(n, self.out.shape[1], device=self.device, dtype=self.dtype)
                sync()
                t = time.perf_counter()
                _, logits = self.step(f, [(1000 + 7 * i) % self.vocab_size for i in range(n)])
                greedy_rows(logits, 2)
                sync()
                if rep:
                    best[n] = min(best[n], time.perf_counter() - t)
        return best


def head_costs(costs: Costs, head: DraftHead) -> Costs:
    """`costs` with a draft head's step times, measured now, as the draft curve (learnt
    estimates kept apart from the draft models')."""
    st = head.path.stat()
    tag = hashlib.sha256(f"{head.path.resolve()} {st.st_size} {st.st_mtime_ns}".encode()).hexdigest()[:8]
    file = costs.file.with_name(f"{costs.file.stem}-head-{tag}.json") if costs.file else None
    return replace(costs, draft=head.measure(), file=file)


class HeadDrafter:
    """A `Drafter` (and `grow`'s `TreeEvaluator`) on a `DraftHead` and the target's hidden state.

    `source` is the Target: its `last_hidden()` is read when a round starts, before the target
    decodes again. Without one (a one-token prompt) the head sits the round out."""

    name = "head"
    uses_model = True

    def __init__(self, head: DraftHead, source, limits: DraftLimits = DraftLimits()) -> None:
        self.head, self.source, self.limits = head, source, limits
        self.vocab_size = head.vocab_size
        self._state: dict[int, torch.Tensor] = {}   # tree node -> its predicted state, this round
        self._sampling = SamplingParams()
        self._hidden: np.ndarray | None = None

    def begin(self, context: Sequence[int]) -> None:
        self._state.clear()

    def accept(self, tokens: Sequence[int]) -> None:
        pass   # the state comes from the target each round

    def catch_up(self) -> None:
        pass   # the state comes from the target each round

    def cost_curve(self, costs: Costs) -> Costs:
        return head_costs(costs, self.head)

    def close(self) -> None:
        pass   # the DraftHead belongs to whoever loaded it (bench shares one)

    def propose(self, tree: DraftTree, stage: int, budget: int, sampling: SamplingParams,
                rng: np.random.Generator) -> None:
        self._hidden = self.source.last_hidden()
        if self._hidden is None or budget <= 0:
            return
        self._sampling = sampling
        try:
            grow(tree, stage, GrowLimits.of(budget, self.limits), sampling, rng, self)
        finally:
            self.rollback()

    # -- TreeEvaluator ---------------------------------------------------------------------------

    def evaluate_root(self, tree: DraftTree) -> Dist:
        h = torch.from_numpy(self._hidden).to(self.head.device, self.head.dtype)[None]   # [1, d]
        state, logits = self.head.step(h, [int(tree.tokens[0])])
        self._state[0] = state[0].clone()   # a graph's buffer on a GPU: the next step reuses it
        return self._dists(logits)[0]

    def evaluate(self, tree: DraftTree, nodes: Sequence[int]) -> list[Dist]:
        """Nodes whose parents have a state step together; a node checked along below another
        of the same call (a cheaper stage's chain) waits for its parent's step."""
        out: dict[int, Dist] = {}
        pending = list(nodes)
        while pending:
            ready = [n for n in pending if int(tree.parent[n]) in self._state]
            if not ready:
                raise ValueError("evaluate() got nodes whose parents were never evaluated")
            parents = torch.stack([self._state[int(tree.parent[n])] for n in ready])   # [r, d]
            states, logits = self.head.step(parents, [int(tree.tokens[n]) for n in ready])
            states = states.clone()
            for i, (n, dist) in enumerate(zip(ready, self._dists(logits))):
                self._state[n] = states[i]
                out[n] = dist
            pending = [n for n in pending if n not in out]
        return [out[n] for n in nodes]

    def rollback(self) -> None:
        self._state.clear()

    def _dists(self, logits: torch.Tensor) -> list[Dist]:
        """Distributions over the draft vocabulary, in target token ids (zero mass elsewhere)."""
        if self._sampling.greedy:
            dists = greedy_rows(logits, self.limits.branching)
        else:
            dists = process_rows(logits, self._sampling)
        vocab = self.head.vocab
        return [Dist(vocab[d.ids], d.probs) for d in dists]
