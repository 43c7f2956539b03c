"""A draft head: one attention layer on the target's own hidden states, the cheapest neural drafter.

The target hands every stage, next to its logits, the final hidden states of the tokens it put
in its cache (the Drafter protocol's `states`, base.py): the prompt's last tokens after prefill,
the root and accepted path after each verify. The head (head_net.py) keeps its own KV cache of (state, next token) pairs over a
window of the committed text, appended each round with the target's true states; a tree node's
pair has its parent's predicted state and attends to that cache and to its own ancestors. A
round costs one step for the new pairs (its last row is the root's: the first tree level) and
one step per further tree level; every step is one batch of rows: five d x d-sized matmuls, one
attention over the window and one [V_sub, d] product with the target's output rows of the draft
vocabulary (tokens outside it are never drafted). Trees grow through `grow` like the other
neural drafters'.

Weights are a .npz (models/head_file.py) written by engine/head_train.py for one target, whose
fingerprint it records: a head made for another target is refused. The frozen tables (the draft
vocabulary's embedding and output rows) are read from the target's GGUF at load; other tokens'
embedding rows when first met.
"""
from __future__ import annotations

import hashlib
import os
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from localspec.models.gguf_file import GGUFInfo, fingerprint, read_gguf, tensor_rows
from localspec.models.head_file import bad_head, read_head

from ..config import DraftLimits, SamplingParams
from ..distribution import Dist
from ..errors import LocalspecError
from ..tree import DraftTree
from .base import States
from .grow import GrowLimits, grow
from .head_net import HeadNet, HeadShape, attend, shape_problem
from .head_step import StepNet, attend_few
from .torch_draft import greedy_rows, process_rows

if TYPE_CHECKING:
    from ..calibrate import Progress
    from ..costs import Costs

_BUCKETS = (1, 2, 4, 8, 16, 32)   # rows a step is padded to on a GPU (one CUDA graph each)
_EXTRA = 4096                     # embedding rows for tokens outside the draft vocabulary
_TOPK = 4                         # top guesses a step hands back for greedy drafting (>= branching)
# Queued pairs a round's first step takes along with the root's, in one batch of rows with their
# outputs; a longer backlog (rounds the head sat out) goes in first by `DraftHead.store`, keys and
# values alone. A step's cost grows little with its rows up to a graph's size, while attention,
# MLP and output rows for hundreds of pairs whose outputs nobody reads cost many steps.
_FOLD = _BUCKETS[-1]
# Rows up to which a CPU step attends by `attend_few` (faster there for a few rows, slower for more)
_FEW = 4
# inductor's mode for a GPU step (`DraftHead._compiled`)
COMPILE_MODE = "default"
# The head's cache: the last WINDOW pairs of the committed text (a ring; older ones drop out) and
# TREE rows for the nodes of a round's tree, the last a scratch row for padding.
WINDOW, TREE = 1024, 128
_EMB, _OUT, _NORM = "token_embd.weight", "output.weight", "output_norm.weight"


def window_rows(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A step of `n` tree rows after a full window, as `DraftHead.measure` times one: their
    positions [n], cache rows [n] and mask [n, cache rows] (each row sees the window and itself)."""
    mask = np.zeros((n, WINDOW + TREE), bool)
    mask[:, :WINDOW] = True
    mask[np.arange(n), WINDOW + np.arange(n)] = True
    return np.arange(n) + WINDOW, WINDOW + np.arange(n), mask


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
    """A trained head with the target's frozen tables and its cache, on one device, ready to step."""

    def __init__(self, path: str | Path, target_gguf: str | Path, *, n_embd: int, vocab_size: int,
                 device: str | None = None, dtype: torch.dtype | None = None, int8: bool | None = None
                 ) -> None:
        """dtype: None picks it (bfloat16 on a GPU; on a CPU whichever steps faster here). int8
        (CPU only): the matmuls' weights in int8, float32 activations; None picks it on a CPU
        with dtype None, as the faster."""
        path = Path(path).expanduser()
        meta, arrays = read_head(path)
        self._gguf = target_info(target_gguf)
        made_for = f"{meta.get('target')} ({meta.get('n_embd')} wide, {meta.get('vocab_size')} tokens)"
        if meta.get("n_embd") != n_embd or meta.get("vocab_size") != vocab_size:
            raise bad_head(path, f"made for {made_for}; this target has hidden size {n_embd} and "
                                 f"{vocab_size} tokens")
        if meta.get("target_id") != fingerprint(self._gguf):
            raise bad_head(path, f"made for another target, {made_for}, not '{self._gguf.path.name}'")
        problem = shape_problem(meta, arrays, n_embd, vocab_size)
        if problem:
            raise bad_head(path, problem)
        self.path, self.meta = path, meta
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.device = dev
        self.dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
        self.vocab = arrays["vocab"].astype(np.int64)                          # [V_sub]
        emb, out, _ = target_tables(self._gguf, self.vocab, emb_rows=self.vocab)   # [V_sub, d] each
        self.shape = shape = HeadShape.from_json(meta["shape"])
        trained = HeadNet(shape)
        trained.load_arrays(arrays)
        self.net = StepNet(trained).to(dev, self.dtype).eval()
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
        rows = WINDOW + TREE
        self.k = torch.zeros(1, rows, shape.kv_heads, shape.head_dim, device=dev, dtype=self.dtype)
        self.v = torch.zeros_like(self.k)
        # On a GPU a step is ~40 small kernels: fused by inductor into fewer (compiled once a
        # shape, kept on disk), and replayed as one CUDA graph per row bucket. `compiled` False:
        # the eager kernels in the graphs (where compiling failed, or a probe's comparison).
        self._graphs: dict[int, tuple] = {}
        self._pad = self._padded(_BUCKETS[-1])     # padding rows' inputs
        self.graphs = self.compiled = dev.type == "cuda"
        self.compile_error: str | None = None
        self._compiled_run = None
        self._qout: torch.nn.Module | None = None         # int8 weights: the output rows
        self._float_net: StepNet | None = None            # with int8 on, the float net until let go
        if int8 and dev.type == "cpu":
            self._set_int8(True)
            self._drop_float()
        elif dev.type == "cpu" and dtype is None and int8 is None:
            self._pick_dtype()

    @property
    def int8(self) -> bool:
        return self._qout is not None

    def _set_int8(self, on: bool) -> None:
        """int8 weights for every matmul (the net's and the output rows'), quantized per output
        row, activations float32 quantized per call (torch's dynamic quantization): a CPU step
        reads a quarter of float32's weight bytes, which is what a step of a few rows waits on."""
        if not on:
            if self._float_net is not None:
                self.net, self._float_net = self._float_net, None
            self._qout = None
            return
        self.dtype = torch.float32
        self.net.to(dtype=self.dtype)
        self.emb, self.out, self.k, self.v = (t.to(self.dtype) for t in (self.emb, self.out, self.k, self.v))
        out = torch.nn.Linear(self.out.shape[1], self.out.shape[0], bias=False)
        with torch.no_grad():
            out.weight.copy_(self.out)
        with warnings.catch_warnings():   # torch.ao's deprecation notice: the kernels are current
            warnings.simplefilter("ignore")
            spec = {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
            self._float_net = self.net
            self.net = torch.ao.quantization.quantize_dynamic(self.net, spec, dtype=torch.qint8)
            self._qout = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(out), spec,
                                                                dtype=torch.qint8)

    def _drop_float(self) -> None:
        """With int8 weights for good, the float net and output rows go (~4 bytes a weight the
        step no longer reads); the net's norms live on in the int8 copy."""
        self._float_net = None
        self.out = self.out.new_empty(0, self.out.shape[1])   # [0, d]: its width is still read

    def _pick_dtype(self) -> None:
        """On a CPU, the fastest here of float32, bfloat16 (CPUs with AMX or AVX-512 BF16 run a
        step of 8 rows in about the time of one, at half the bytes) and int8 weights: measured,
        fastest of three steps of 1 and of 8 rows each (docs/decisions/0024, 0032). Drafting
        needs no more precision: the target checks every token."""
        tensors = (self.emb, self.out, self.k, self.v)
        weights = {k: v.clone() for k, v in self.net.state_dict().items()}

        def cost() -> float:
            runs = [self.measure((1, 8), reps=2) for _ in range(2)]
            return sum(min(r[n] for r in runs) for n in (1, 8))
        costs = {"float32": cost()}
        self.dtype = torch.bfloat16
        self.net.to(dtype=self.dtype)
        self.emb, self.out, self.k, self.v = (t.to(self.dtype) for t in tensors)
        costs["bfloat16"] = cost()
        self.net.to(dtype=torch.float32).load_state_dict(weights)   # unrounded, for int8's copy
        self.emb, self.out, self.k, self.v = tensors
        self._set_int8(True)
        costs["int8"] = cost()
        best = min(costs, key=costs.get)
        if best == "int8":
            self._drop_float()
        else:
            self._set_int8(False)
            self.dtype = getattr(torch, best)
            self.net.to(dtype=self.dtype)
            self.emb, self.out, self.k, self.v = (t.to(self.dtype) for t in tensors)

    def _run(self, f, idx, mask) -> tuple[torch.Tensor, ...]:
        """idx [3, n]: embedding rows, positions and cache rows of the pairs. The next-token
        logits, and for greedy drafting their top _TOPK as full-softmax probabilities and draft
        indices (computed here, so a GPU step replays them in its graph). Called under
        inference_mode, or no_grad when compiled (inductor cannot trace inference tensors)."""
        net = self.net
        u = net.inputs(f, self.emb[idx[0]])                                    # [n, d]
        q, k, v = net.qkv(u[None], idx[1][None])                               # [1, n, ., hd]
        self.k[0].index_copy_(0, idx[2], k[0])
        self.v[0].index_copy_(0, idx[2], v[0])
        few = self.device.type == "cpu" and len(f) <= _FEW
        state = net.finish(u, (attend_few if few else attend)(q, self.k, self.v, mask[None])[0])
        logits = (self._qout(state) if self._qout is not None else state @ self.out.T).float()   # [n, V_sub]
        top = logits.topk(min(_TOPK, logits.shape[1]), dim=-1)
        probs = (top.values - logits.logsumexp(-1, keepdim=True)).exp()
        return state, logits, probs, top.indices

    @torch.inference_mode()
    def fuse(self, feats: np.ndarray) -> torch.Tensor:
        """The target's features ([n, n_feature] float32 on the host: its final states, then the
        tapped layers') as the head's steps read them, [n, d] on its device (`HeadNet.fuse`; a
        head without taps reads the final states as they are)."""
        return self.net.fuse(torch.from_numpy(feats).to(self.device, self.dtype))

    @torch.inference_mode()
    def store(self, f: torch.Tensor, tokens: Sequence[int], pos: np.ndarray, slots: np.ndarray) -> None:
        """Pairs whose keys and values alone are wanted (committed text, read by later rows'
        attention): f [n, d] states before `tokens` [n] at positions `pos` [n], their keys and
        values into cache rows `slots` [n]. A pair's key and value come from its own inputs alone,
        so no attention, MLP or output rows run: a fraction of a step, eager."""
        idx = torch.from_numpy(np.stack([self._slots(tokens), np.asarray(pos, np.int64),
                                         np.asarray(slots, np.int64)])).to(self.device)
        u = self.net.inputs(f, self.emb[idx[0]])
        _, k, v = self.net.qkv(u[None], idx[1][None])
        self.k[0].index_copy_(0, idx[2], k[0])
        self.v[0].index_copy_(0, idx[2], v[0])

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
    def step(self, f: torch.Tensor, tokens: Sequence[int], pos: np.ndarray, slots: np.ndarray,
             mask: np.ndarray) -> tuple[torch.Tensor, ...]:
        """One batch of pairs: f [n, d] states before `tokens` [n] at positions `pos` [n]; their
        keys go to cache rows `slots` [n]; row i attends to the cache rows `mask[i]` [n, rows]
        marks (its own included). (states after the tokens [n, d], logits [n, V_sub] f32, top
        probabilities and indices [n, _TOPK]); on a GPU views of a graph's buffers, valid until
        the next step of that size."""
        return self._step(f, False, tokens, pos, slots, mask)

    @torch.inference_mode()
    def step_features(self, feats: np.ndarray, tokens: Sequence[int], pos: np.ndarray, slots: np.ndarray,
                      mask: np.ndarray) -> tuple[torch.Tensor, ...]:
        """`step` on the target's own features, [n, n_feature] float32 on the host (its final
        states, then the tapped layers'), fused as `fuse` fuses them: on a GPU the fusion runs in
        the step's graph and the features go over in one asynchronous copy from pinned memory."""
        return self._step(feats, True, tokens, pos, slots, mask)

    def _step(self, f, raw: bool, tokens: Sequence[int], pos: np.ndarray, slots: np.ndarray,
              mask: np.ndarray) -> tuple[torch.Tensor, ...]:
        n = len(tokens)
        ids = self._slots(tokens)
        if not self.graphs or n > _BUCKETS[-1]:
            if raw:
                f = self.fuse(f)
            idx = torch.from_numpy(np.stack([ids, np.asarray(pos, np.int64), np.asarray(slots, np.int64)]))
            return self._run(f, idx.to(self.device), torch.from_numpy(mask).to(self.device))
        g = self._graph(next(b for b in _BUCKETS if b >= n))
        if g is None:
            return self._step(f, raw, tokens, pos, slots, mask)
        graph, _, _, outs = g
        self._graph_inputs(g, f, raw, ids, pos, slots, mask)
        graph.replay()
        return tuple(o[:n] for o in outs)

    def _graph_inputs(self, g: tuple, f, raw: bool, ids: np.ndarray, pos: np.ndarray,
                      slots: np.ndarray, mask: np.ndarray) -> None:
        """A captured step's inputs for n pairs (`_step`'s, `ids` their embedding rows): every
        row's, the padding rows' too (stale cache rows from a bigger step would be written
        there), into pinned host buffers, then asynchronous copies. A graph reads features
        (`_run_features`): a tree node's are its parent's state and zeros for the taps, which
        the fusion passes through unchanged."""
        _, (f_in, idx_in, mask_in), (idx_host, mask_host, f_host), _ = g
        n, rows, d = len(ids), len(f_in), self.shape.d
        idx_np, mask_np = idx_host.numpy(), mask_host.numpy()
        idx_np[0, :n], idx_np[1, :n], idx_np[2, :n] = ids, pos, slots
        idx_np[:, n:] = self._pad[0][:, n:rows]
        mask_np[:n], mask_np[n:] = mask, self._pad[1][n:rows]
        if raw:
            f_host.numpy()[:n] = f
            f_in[:n].copy_(f_host[:n], non_blocking=True)
        else:
            f_in[:n, :d].copy_(f)
            if f_in.shape[1] > d:
                f_in[:n, d:].zero_()
        idx_in.copy_(idx_host, non_blocking=True)
        mask_in.copy_(mask_host, non_blocking=True)

    def _run_features(self, x: torch.Tensor, idx, mask) -> tuple[torch.Tensor, ...]:
        """`_run` on features x [n, n_feature] float32, fused first (a graph's step)."""
        return self._run(self.net.fuse(x.to(self.dtype)), idx, mask)

    def _padded(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Inputs of `rows` padding rows (idx [3, rows], mask [rows, cache rows]): each writes its
        key to the scratch row and sees it alone."""
        total = WINDOW + TREE
        mask = np.zeros((rows, total), bool)
        mask[:, total - 1] = True
        idx = np.zeros((3, rows), np.int64)
        idx[2] = total - 1
        return idx, mask

    def _graph(self, rows: int) -> tuple | None:
        """The captured step of `rows` rows, captured now if it is new; None on a card or build
        that cannot capture (`graphs` turns False: eager steps from then on, slower)."""
        g = self._graphs.get(rows)
        if g is None:
            try:
                g = self._capture(rows)
            except RuntimeError:
                self.graphs = False
        return g

    def _capture(self, rows: int) -> tuple:
        """A step of `rows` rows captured in a CUDA graph: compiled where it compiles, else eager."""
        if self.compiled:
            try:
                with torch.inference_mode(False), torch.no_grad():
                    return self._capture_with(rows, self._compiled())
            except (torch._dynamo.exc.TorchDynamoException, RuntimeError) as err:   # no triton, no compiler
                self.compiled, self.compile_error = False, f"{type(err).__name__}: {err}".splitlines()[0]
                torch.cuda.synchronize()
        with torch.inference_mode():
            return self._capture_with(rows, self._run_features)

    def _compiled(self):
        """`_run_features` compiled by inductor, one shape per bucket, its kernels cached on disk under
        localspec's data folder (unless TORCHINDUCTOR_CACHE_DIR names another): compiling a
        shape takes seconds to a minute the first time, and a fraction of that after."""
        if self._compiled_run is None:
            from localspec.models.paths import data_dir

            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(data_dir() / "compiled"))
            self._compiled_run = torch.compile(self._run_features, mode=COMPILE_MODE, dynamic=False)
        return self._compiled_run

    def _capture_with(self, rows: int, run) -> tuple:
        dev = self.device
        idx, mask = self._padded(rows)
        width = self.shape.d * (1 + len(self.shape.taps))
        host = (torch.from_numpy(idx).pin_memory(), torch.from_numpy(mask).pin_memory(),
                torch.zeros(rows, width).pin_memory())
        ins = (torch.zeros(rows, width, device=dev), host[0].to(dev), host[1].to(dev))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                run(*ins)                 # warm-up outside the graph (compiling, allocations, kernels)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = run(*ins)
        self._graphs[rows] = (graph, ins, host, outs)
        return self._graphs[rows]

    def prepare(self, progress: Progress | None = None) -> None:
        """On a GPU, every bucket's graph captured now (compiled the first time: seconds to a
        minute a shape, each announced to `progress`), not in the middle of a reply."""
        if not self.graphs:
            return
        from ..calibrate import Step

        todo = [rows for rows in _BUCKETS if rows not in self._graphs]
        for i, rows in enumerate(todo):
            if progress is not None:
                what = "compiling" if self.compiled else "capturing"
                progress(Step(f"draft head {what} its step for {rows} rows", i + 1, len(todo)))
            with torch.inference_mode():
                if self._graph(rows) is None:
                    return

    def measure(self, sizes: Sequence[int] = (1, 2, 4, 8), reps: int = 5) -> dict[int, float]:
        """Seconds per tree step of n rows against a full window (the adaptive budget's draft
        curve), fastest of `reps`; the mask built as a round builds it."""
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        best = {n: float("inf") for n in sizes}
        for rep in range(reps + 1):
            for n in sizes:
                f = torch.ones(n, self.out.shape[1], device=self.device, dtype=self.dtype)
                sync()
                t = time.perf_counter()
                _, _, probs, top = self.step(f, [(1000 + 7 * i) % self.vocab_size for i in range(n)],
                                             *window_rows(n))
                torch.cat([probs, top.float()], 1).cpu()   # what greedy drafting reads back
                sync()
                if rep:
                    best[n] = min(best[n], time.perf_counter() - t)
        return best


def head_tag(path: Path) -> str:
    """A head file's name in the calibration cache: its path, size and modification time (a
    head trained again is measured again)."""
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()} {st.st_size} {st.st_mtime_ns}".encode()).hexdigest()[:8]


def head_costs(costs: Costs, head: DraftHead) -> Costs:
    """`costs` with a draft head's step times, measured now, as the draft curve (learnt
    estimates kept apart from the draft models')."""
    file = costs.file.with_name(f"{costs.file.stem}-head-{head_tag(head.path)}.json") if costs.file else None
    return replace(costs, draft=head.measure(), file=file)


class HeadDrafter:
    """A `Drafter` (and `grow`'s `TreeEvaluator`) on a `DraftHead` and the target's hidden states.

    The target's `states` (base.py: those of the tokens its last prefill or commit put in the
    cache), handed over when a generation begins and after each commit, are queued as pairs; a round's first step adds them to the head's cache, the last being the root's pair.
    Without the root's pair (a one-token prompt) the head sits the round out."""

    name = "head"
    uses_model = True
    copies = False

    def __init__(self, head: DraftHead, limits: DraftLimits = DraftLimits()) -> None:
        self.head, self.limits = head, limits
        self.vocab_size = head.vocab_size
        self._state: dict[int, torch.Tensor] = {}   # tree node -> its predicted state, this round
        self._sampling = SamplingParams()
        self._slot_pos = np.full(WINDOW, -1, np.int64)   # ring row -> the position of its pair
        self._feats: list[np.ndarray] = []              # queued pairs: states [d] ...
        self._toks: list[int] = []                      # ... the token after each ...
        self._pos: list[int] = []                       # ... and the state's position
        self._root_pos = -1
        self._anc = np.zeros((TREE, TREE), bool)        # node -> its tree ancestors and itself

    def begin(self, context: Sequence[int], states: States = None) -> None:
        self._slot_pos[:] = -1
        self._feats, self._toks, self._pos = [], [], []
        self._state.clear()
        self._queue(context, states)

    def accept(self, tokens: Sequence[int], states: States = None) -> None:
        """`tokens`: the accepted path and the next root; `states`: those of the old root and the
        path."""
        self._queue(tokens, states)

    def _queue(self, after: Sequence[int], got: States) -> None:
        if got is None:
            return
        start, states = got   # states [r, d] at positions start..; the token after each is in `after`
        r = len(states)
        if len(after) < r:
            return
        follow = list(after)[-r:]
        self._feats += list(states)
        self._toks += [int(t) for t in follow]
        self._pos += range(start, start + r)
        if len(self._pos) > WINDOW:   # the ring keeps no more
            del self._feats[:-WINDOW], self._toks[:-WINDOW], self._pos[:-WINDOW]

    def catch_up(self) -> None:
        """A backlog of pairs queued while the head sat out, all but the root's, into its cache
        (the engine times this apart from the round: decode.py); a short one rides along in the
        round's first step."""
        if len(self._toks) > _FOLD:
            self._store(len(self._toks) - 1)

    def cost_curve(self, costs: Costs) -> Costs:
        return head_costs(costs, self.head)

    def close(self) -> None:
        pass   # the DraftHead belongs to whoever loaded it (bench shares one)

    def propose(self, tree: DraftTree, stage: int, budget: int, sampling: SamplingParams,
                rng: np.random.Generator) -> None:
        budget = min(budget, TREE - 1 - tree.n)   # the tree rows of the head's cache
        if not self._toks or self._toks[-1] != int(tree.tokens[0]) or budget <= 0:
            return   # no state before the root: the first round of a one-token prompt
        self._sampling = sampling
        try:
            grow(tree, stage, GrowLimits.of(budget, self.limits), sampling, rng, self)
        finally:
            self.rollback()

    # -- TreeEvaluator ---------------------------------------------------------------------------

    def evaluate_root(self, tree: DraftTree) -> Dist:
        """The queued pairs into the ring, the last being the root's: its step's guesses are the
        root's children (a long backlog went in by `catch_up`, which the engine calls first)."""
        p, state, outs = self._insert(len(self._toks))
        self._root_pos = p
        self._state[0] = state[-1].clone()   # a graph's buffer on a GPU: the next step reuses it
        return self._dists(*(o[-1:] for o in outs))[0]

    def _take(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The first `n` queued pairs, out of the queue and into the ring's bookkeeping: the
        target's features [n, n_feature] float32, tokens and positions."""
        feats = np.stack(self._feats[:n])
        toks, p = np.asarray(self._toks[:n]), np.asarray(self._pos[:n], np.int64)
        del self._feats[:n], self._toks[:n], self._pos[:n]
        self._slot_pos[p % WINDOW] = p
        return feats, toks, p

    def _store(self, n: int) -> None:
        """The first `n` queued pairs into the ring, keys and values alone (`DraftHead.store`)."""
        feats, toks, p = self._take(n)
        self.head.store(self.head.fuse(feats), toks, p, p % WINDOW)

    def _insert(self, n: int) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
        """The first `n` queued pairs into the ring (causal by position) in one step; (the last
        one's position, the step's outputs)."""
        feats, toks, p = self._take(n)
        mask = np.zeros((n, WINDOW + TREE), bool)
        seen = self._slot_pos[None, :]
        mask[:, :WINDOW] = (seen >= 0) & (seen <= p[:, None]) & (seen > p[:, None] - WINDOW)
        state, *outs = self.head.step_features(feats, toks, p, p % WINDOW, mask)
        return int(p[-1]), state, outs

    def evaluate(self, tree: DraftTree, nodes: Sequence[int]) -> list[Dist]:
        """Nodes whose parents have a state step together; a node checked along below another
        of the same call (a cheaper stage's chain) waits for its parent's step."""
        out: dict[int, Dist] = {}
        pending = list(nodes)
        ctx = (self._slot_pos >= 0) & (self._slot_pos <= self._root_pos)
        while pending:
            ready = [n for n in pending if int(tree.parent[n]) in self._state]
            if not ready:
                raise ValueError("evaluate() got nodes whose parents were never evaluated")
            idx = np.asarray(ready, np.int64)
            par = tree.parent[idx].astype(np.int64)
            self._anc[idx] = self._anc[par]   # row 0 stays empty: the root's pair is in the ring
            self._anc[idx, idx] = True
            mask = np.zeros((len(ready), WINDOW + TREE), bool)
            mask[:, :WINDOW] = ctx
            mask[:, WINDOW:] = self._anc[idx]
            parents = torch.stack([self._state[int(p)] for p in par])                    # [r, d]
            states, *outs = self.head.step(parents, [int(tree.tokens[n]) for n in ready],
                                            self._root_pos + tree.depth[idx].astype(np.int64), WINDOW + idx, mask)
            states = states.clone()
            for i, (n, dist) in enumerate(zip(ready, self._dists(*outs))):
                self._state[n] = states[i]
                out[n] = dist
            pending = [n for n in pending if n not in out]
        return [out[n] for n in nodes]

    def rollback(self) -> None:
        self._state.clear()

    def _dists(self, logits: torch.Tensor, probs: torch.Tensor, top: torch.Tensor) -> list[Dist]:
        """Distributions over the draft vocabulary, in target token ids (zero mass elsewhere):
        greedy, the step's own top guesses (one copy back); sampling, from the logits."""
        b = self.limits.branching
        vocab = self.head.vocab
        if self._sampling.greedy and b <= top.shape[1]:
            both = torch.cat([probs[:, :b], top[:, :b].float()], 1).cpu().numpy().astype(np.float64)
            return [Dist(vocab[row[b:].astype(np.int64)], row[:b]) for row in both]
        if self._sampling.greedy:
            dists = greedy_rows(logits, b)
        else:
            dists = process_rows(logits, self._sampling)
        vocab = self.head.vocab
        return [Dist(vocab[d.ids], d.probs) for d in dists]
