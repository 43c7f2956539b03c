"""A GGUF model in llama.cpp through llama-cpp-python's low-level API: one model, one context.

Both the target and the GGUF draft use it. What the rest of the engine needs from llama.cpp is
small: tokenize and detokenize, decode a batch whose tokens each carry a set of sequence ids, read
logits as zero-copy numpy views of llama.cpp's buffer, and the memory's sequence operations. The
context uses a unified KV cache so a token shared by several tree paths is stored once and tagged
with every path's sequence id. What llama.cpp would abort on is checked here first, so every
command refuses it with the fix; its process-wide state is engine/native.py's, a draft head's
hidden states hidden_states.py's, what only `head train` asks of a model head_train_model.py's.
"""
from __future__ import annotations

from .native import (ExactNumerics, errors_since, gpu_offload_supported,  # first: see native.py
                     has_exact_switches, last_log, log_mark)

import ctypes
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import llama_cpp as lc
import numpy as np

from localspec.models.architectures import check_runnable
from localspec.models.gguf_file import GGUFInfo, read_gguf

from .cores import governor, process_cpus
from .errors import LocalspecError
from .hidden_states import HiddenStates
from .options import MAX_CTX

EXACT_FIX = ("Run exact numerics on the CPU (--gpu-layers 0), or leave out --exact (in the chat: "
             "switch off Exact numerics in the settings)")

KV_TYPES = {"f16": 1, "q8_0": 8}   # ggml_type of the KV cache's cells, by name
EXACT_MAX_ROWS = 63   # ggml's CPU flash attention sums each row alone below its 64-row tile
MAX_SEQUENCES = 256   # llama.cpp's LLAMA_MAX_SEQ: more sequence ids and it refuses the context


def exact_in_process() -> bool:
    """Whether an exact model is open in this process (its switches are process-wide)."""
    return ExactNumerics.held()


def default_threads() -> int:
    return max(1, len(process_cpus()))


def padded_rows(n: int, pad_to: int, top_up: bool) -> int:
    """The rows a batch of n tokens decodes with `pad_to` and `top_up` (LlamaModel.decode)."""
    return (max(n + 1, pad_to) if top_up else max(n, pad_to)) if pad_to else n


def check_context(n_ctx: int, n_ctx_train: int, n_batch: int, sequences: int) -> None:
    """Refuse, with the fix, a context llama.cpp would abort on or refuse. It sizes its output
    buffer at creation for one row per sequence id and caps a batch at the context (an abort
    past it): the context must hold as many tokens as speculation has sequences (a path per
    node, and as many padding ones). n_ctx 0 would mean the trained size, which can need far
    more memory: refused too. `n_batch` below the sequences is the caller's bug."""
    if not 1 <= n_ctx <= MAX_CTX:
        raise LocalspecError("Invalid context size", f"--ctx {n_ctx}",
                             f"Pass a number of tokens from 1 to {MAX_CTX} (or leave --ctx out: the default fits this machine; the "
                             f"model was trained for {n_ctx_train})")
    if sequences > MAX_SEQUENCES:
        raise LocalspecError("Draft trees too large for llama.cpp",
                             f"{sequences} sequences asked for (a tree's paths and its padding); "
                             f"llama.cpp allows {MAX_SEQUENCES}",
                             f"Use --tree-nodes {MAX_SEQUENCES // 2 - 1} or fewer")
    if sequences > n_batch:
        raise ValueError(f"a batch of {n_batch} rows cannot hold {sequences} sequences' outputs")
    if n_ctx < sequences:
        raise LocalspecError("Context too small for speculation",
                             f"--ctx {n_ctx}: speculation here uses {sequences} sequences (a tree's "
                             f"paths and its padding), and llama.cpp needs a context of at least as "
                             f"many tokens",
                             f"Use --ctx {sequences} or more (or leave it out), lower --tree-nodes, "
                             f"or run with --no-speculation")


class LlamaModel(HiddenStates):
    """Owns a llama.cpp model and context; close() frees them."""

    def __init__(self, path: str | Path, *, n_ctx: int = 4096, n_batch: int = 512,
                 n_seq_max: int = 64, n_gpu_layers: int = -1, n_threads: int | None = None,
                 n_pad_seqs: int = 0, hidden: bool = False, exact: bool = False,
                 taps: Sequence[int] = (), kv_type: str = "f16") -> None:
        """n_seq_max: sequence ids 0..n_seq_max-1 for the caller; n_pad_seqs more after them are
        reserved for padding (decode's pad_to). hidden: every decode also hands back the final
        hidden state of each row with logits (`hidden_row`), what a draft head drafts from.
        taps (with hidden): layers whose input states a row's hidden state carries too, after the
        final one: `hidden_rows` is then [rows, n_feature] (hidden_states.py).

        exact: batch-invariant numerics, CPU only: each row of a batch gets the logits it would
        get decoded alone, bit for bit, so greedy speculation emits plain decoding's tokens
        exactly; the switches that takes, and what they cost, are docs/exact-numerics.md's
        (native.ExactNumerics, held while open). Checked at load.

        kv_type: the KV cache's cells, "f16" (llama.cpp's default) or "q8_0" (half the memory;
        llama.cpp reads a quantized cache only with flash attention, which it then turns on)."""
        self._model = self._ctx = None
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type {kv_type!r}: one of {', '.join(KV_TYPES)}")
        self.kv_type = kv_type
        self._exact: ExactNumerics | None = None
        self.info: GGUFInfo = read_gguf(path)
        check_runnable(self.info)   # llama.cpp loads encoders and recurrent models it then cannot decode with here
        self.path = self.info.path
        self.exact = exact
        gpu_layers = n_gpu_layers if gpu_offload_supported() else 0
        if exact and gpu_layers != 0:
            raise LocalspecError("Exact numerics run on the CPU only",
                                 "llama.cpp's CUDA kernels change with the number of tokens in a "
                                 "batch", EXACT_FIX)
        if exact and not has_exact_switches():
            raise LocalspecError("Exact numerics need localspec's llama.cpp build",
                                 "the llama.cpp libraries loaded lack packaging/patches' switches "
                                 "for ggml's split-KV attention and tiled matmul (batches and "
                                 "contexts past 256 tokens would part from plain decoding)",
                                 "Reinstall with `make install` (it builds llama-cpp-python with "
                                 "packaging/patches), or leave out --exact")
        if exact:
            self._exact = ExactNumerics().__enter__()
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = gpu_layers
        if exact:
            mparams.use_extra_bufts = False
        mark = log_mark()
        self._model = lc.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            self.close()
            raise LocalspecError("llama.cpp could not load the model",
                                 f"'{self.path}': {errors_since(mark)}",
                                 "Check the file is a complete GGUF of an architecture this "
                                 "llama.cpp supports; re-download it if unsure")
        self.n_gpu_layers = mparams.n_gpu_layers
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.vocab_size = lc.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train = lc.llama_model_n_ctx_train(self._model)
        try:
            check_context(n_ctx, self.n_ctx_train, n_batch, n_seq_max + n_pad_seqs)
        except BaseException:
            self.close()
            raise
        threads = self.n_threads = n_threads or default_threads()
        # without a count, the threads follow the cores other processes leave free (cores.py)
        self._governed = n_threads is None and not exact
        self.threads_now = threads
        if self._governed:
            governor().threads(threads)   # its watch starts with the first governed model
        cparams = self._context_params(n_ctx, n_batch, n_seq_max, n_pad_seqs, threads)
        mark = log_mark()
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise LocalspecError("llama.cpp could not create a context",
                                 f"n_ctx={n_ctx}: {errors_since(mark)}",
                                 "Lower --ctx, or free memory (close other model runs)")
        self.n_ctx = lc.llama_n_ctx(self._ctx)
        n_batch = self.n_batch = lc.llama_n_batch(self._ctx)   # at most n_ctx: llama.cpp's cap
        self.n_seq_max = n_seq_max
        self.n_pad_seqs = n_pad_seqs
        self._pad_used = 0               # padding sequences the last padded decode filled
        self._mem = lc.llama_get_memory(self._ctx)
        self.n_embd = lc.llama_model_n_embd(self._model)
        try:
            self._open_hidden(hidden, taps)
        except BaseException:
            self.close()
            raise
        all_seqs = n_seq_max + n_pad_seqs
        self._batch = lc.llama_batch_init(n_batch, 0, all_seqs)
        cap = n_batch
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(cap,))     # [cap] int32
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(cap,))       # [cap] int32
        self._nseq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(cap,))  # [cap] int32
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(cap,))     # [cap] int8
        self._seq = [np.ctypeslib.as_array(self._batch.seq_id[i], shape=(all_seqs,)) for i in range(cap)]
        self._ramp = np.arange(max(cap, all_seqs), dtype=np.int32)              # padding positions, ids
        self._n_outputs = 0
        self._pick: slice | np.ndarray | None = None   # the rows asked for, where llama.cpp output all
        self._logits_views: dict[tuple[int, int], np.ndarray] = {}   # (address, rows) -> view
        self._piece = ctypes.create_string_buffer(256)
        if exact:
            try:
                self._check_exact()
            except BaseException:
                self.close()
                raise

    def _context_params(self, n_ctx: int, n_batch: int, n_seq_max: int, n_pad_seqs: int,
                        threads: int) -> lc.llama_context_params:
        """llama.cpp's parameters for this model's context: one KV cache that every sequence
        shares (what tree verification needs: seq_cp tags the context with every path)."""
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_seq_max + n_pad_seqs
        cparams.kv_unified = True
        cparams.no_perf = True
        if self.exact or self.kv_type != "f16":
            cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cparams.type_k = cparams.type_v = KV_TYPES[self.kv_type]
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        return cparams

    _EXACT_PROBE = 9   # rows: past ggml's 8-row switch to its tiled matmul

    def _check_exact(self) -> None:
        """Exact mode's promise, checked on this machine: a batch's logits equal the same tokens'
        logits decoded one at a time, bit for bit."""
        n = min(self._EXACT_PROBE, self.n_batch, self.n_ctx)
        tokens = (np.arange(n, dtype=np.int64) * 7919 + 13) % self.vocab_size
        pos = self._ramp[:n]
        alone = np.empty((n, self.vocab_size), dtype=np.float32)
        try:
            for i in range(n):
                self.decode(tokens[i:i + 1], pos[i:i + 1])
                alone[i] = self.logits()[0]
            self.clear()
            self.decode(tokens, pos)
            same = np.array_equal(self.logits(), alone)
        finally:
            self.clear()
        if not same:
            raise LocalspecError("Exact numerics are not available for this model here",
                                 f"'{self.path.name}': a batch of {n} tokens got other logits than "
                                 "the same tokens one at a time. Weights in F32, F16, BF16, Q4_0 or "
                                 "Q8_0 take llamafile's batched sgemm on x86",
                                 "Use a K-quant GGUF (Q4_K_M, Q5_K_M, Q6_K: what `localspec pull` "
                                 "installs; Q4_1 and Q5_1 work too), or leave out --exact (in the "
                                 "chat: switch off Exact numerics in the settings)")

    # ---- vocabulary -------------------------------------------------------------------------
    def tokenize(self, text: str, *, special: bool = True, add_bos: bool | None = None) -> list[int]:
        raw = text.encode("utf-8")
        add = lc.llama_vocab_get_add_bos(self._vocab) if add_bos is None else add_bos
        cap = len(raw) + 16
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self._vocab, raw, len(raw), buf, cap, add, special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._vocab, raw, len(raw), buf, cap, add, special)
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        n = lc.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, special)
        if n < 0:
            big = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, token, big, -n, 0, special)
            return big.raw[:n]
        return self._piece.raw[:n]

    def token_text(self, token: int) -> str:
        return lc.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    def special_token(self, which: str) -> int:
        return int({"bos": lc.llama_vocab_bos, "eos": lc.llama_vocab_eos,
                    "eot": lc.llama_vocab_eot}[which](self._vocab))

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = lc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            lc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    # ---- decoding ---------------------------------------------------------------------------
    def _follow_cores(self) -> None:
        n = governor().threads(self.n_threads)
        if n != self.threads_now:
            lc.llama_set_n_threads(self._ctx, n, n)
            self.threads_now = n

    @contextmanager
    def threads_held(self) -> Iterator[int]:
        """The thread count the cores allow now, held until the block ends (yielded): a
        calibration measures under one count, the one its cache is keyed by (a curve at one
        thread is another curve: docs/decisions/0053)."""
        governed = self._governed
        if governed:
            governor().settled()
            self._follow_cores()
        self._governed = False
        try:
            yield self.threads_now
        finally:
            self._governed = governed

    def decode(self, tokens: Sequence[int] | np.ndarray, positions: Sequence[int] | np.ndarray,
               seq_ids: Sequence[Sequence[int]] | None = None, *, logits: bool | np.ndarray = True,
               pad_to: int = 0, top_up: bool = True) -> None:
        """Decode one batch (<= n_batch tokens). seq_ids None: every token in sequence 0.

        logits: True for every token, False for the last only, or a bool mask.
        pad_to: fill the batch up to this many rows (at least one is added) with padding, in
        the reserved sequences, which share no cell with any other, so no real token sees it;
        remove it with drop_padding() (or keep_path of a real sequence). Every row then has
        logits. llama.cpp reuses its graph (and ggml-cuda replays its CUDA graph) only while the
        batch's token, output and distinct sequence-id counts hold: so the padding tops the
        distinct ids up to pad_to (its first row carries the missing ids) and keeps one shape.
        top_up False: pad only the rows, all in the first padding sequence, and only when n is
        under pad_to (for a llama.cpp that keeps a CUDA graph per shape, packaging/patches, where
        a rebuilt compute graph costs only its CPU-side build).
        """
        if self._governed:
            self._follow_cores()
        n = len(tokens)
        total = padded_rows(n, pad_to, top_up)
        if n == 0 or total > self.n_batch:
            raise ValueError(f"batch of {total} tokens (1..{self.n_batch} allowed)")
        self._tok[:n] = tokens
        self._pos[:n] = positions
        if seq_ids is None:
            self._nseq[:n] = 1
            for i in range(n):
                self._seq[i][0] = 0
            distinct = 1
        else:
            for i, ids in enumerate(seq_ids):
                self._nseq[i] = len(ids)
                self._seq[i][:len(ids)] = ids
            distinct = len(set().union(*seq_ids)) if pad_to and top_up else 0
        if total > n:
            # padding ids: with top_up, those that bring the distinct ids up to total
            need = total - distinct if top_up else 1
            if need > self.n_pad_seqs:
                raise ValueError(f"padding {n} tokens to {total} needs {need} padding sequences; "
                                 f"the context reserved {self.n_pad_seqs}")
            base = self.n_seq_max
            self._tok[n:total] = self._tok[0]
            self._pos[n:total] = self._ramp[:total - n]
            self._nseq[n] = need
            self._seq[n][:need] = self._ramp[base:base + need]
            self._nseq[n + 1:total] = 1
            for i in range(n + 1, total):
                self._seq[i][0] = base
            self._pad_used = need
            self._out[:total] = 1
            outputs = total
        elif logits is True:
            self._out[:n] = 1
            outputs = n
        elif logits is False:
            self._out[:n] = 0
            self._out[n - 1] = 1
            outputs = 1
        else:
            self._out[:n] = logits
            outputs = int(self._out[:n].sum())
        self._pick: slice | np.ndarray | None = None
        if self.hidden and outputs != total:   # with hidden states llama.cpp outputs every row
            self._pick = slice(n - 1, n) if logits is False else np.flatnonzero(self._out[:n])
            self._out[:total] = 1               # (asking for fewer only draws its warning)
            outputs = total
        self._batch.n_tokens = total
        rc = lc.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise LocalspecError("llama.cpp decode failed", f"code {rc}: {last_log()}",
                                 "The context is probably full: start a new conversation or "
                                 "raise --ctx")
        self._n_outputs = outputs

    def logits(self) -> np.ndarray:
        """[n_outputs, vocab] float32: a zero-copy view, valid until the next decode (with hidden
        states llama.cpp outputs every row; the rows asked for are picked, a copy for a mask).

        llama_get_logits is called every time (it waits for the decode to finish); the numpy view
        of its buffer is kept while the buffer stays where it is: building one per decode is a
        measurable part of a plain step on a fast GPU (docs/decisions/0015)."""
        ptr = lc.llama_get_logits(self._ctx)
        key = (ctypes.cast(ptr, ctypes.c_void_p).value, self._n_outputs)
        view = self._logits_views.get(key)
        if view is None:
            if len(self._logits_views) > 64 or any(k[0] != key[0] for k in self._logits_views):
                self._logits_views.clear()   # the buffer moved (grew): old views are stale
            view = self._logits_views[key] = np.ctypeslib.as_array(
                ptr, shape=(self._n_outputs, self.vocab_size))
        return view if self._pick is None else view[self._pick]

    def prefill(self, tokens: Sequence[int], start: int, seq: int = 0, hidden_tail: int = 1) -> None:
        """Decode tokens at positions start.. in sequence `seq`, in n_batch chunks; last row kept.
        With hidden states, all but the last `hidden_tail` tokens go without them (llama.cpp would
        otherwise output, and copy out, every row's logits, the whole prompt's); the tail is the
        last decode, its rows 0..hidden_tail-1 (hidden_row), all with logits."""
        tail = max(1, min(hidden_tail, self.n_batch))
        if self.hidden and len(tokens) > tail:
            with self._without_hidden():
                self.prefill(tokens[:-tail], start, seq)
            start, tokens = start + len(tokens) - tail, tokens[-tail:]
        for lo in range(0, len(tokens), self.n_batch):
            chunk = tokens[lo:lo + self.n_batch]
            pos = np.arange(start + lo, start + lo + len(chunk), dtype=np.int32)
            self.decode(chunk, pos, [(seq,)] * len(chunk) if seq else None,
                        logits=True if self.hidden and len(chunk) > 1 else False)

    # ---- memory (KV cache) sequence operations ----------------------------------------------
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        if not lc.llama_memory_seq_rm(self._mem, seq, p0, p1):
            raise RuntimeError(f"llama.cpp refused to remove seq {seq} [{p0}, {p1})")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        lc.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        lc.llama_memory_seq_keep(self._mem, seq)

    def drop_padding(self) -> None:
        """Remove the cells the last padded decode added."""
        for seq in range(self.n_seq_max, self.n_seq_max + self._pad_used):
            lc.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._pad_used = 0

    def seq_pos_max(self, seq: int) -> int:
        return int(lc.llama_memory_seq_pos_max(self._mem, seq))

    def keep_path(self, seq: int, end: int) -> None:
        """Make sequence `seq` up to position `end` (inclusive) the new sequence 0; drop all else.

        The one rollback after a tree: cells off that path go (seq_keep), then the path's own
        cells past `end`, and the survivors are re-tagged as sequence 0.
        """
        self.seq_keep(seq)
        self.seq_rm(seq, end + 1, -1)
        if seq != 0:
            self.seq_cp(seq, 0, -1, -1)
            self.seq_rm(seq, -1, -1)

    def seq_state(self, seq: int = 0) -> np.ndarray:
        """[bytes] llama.cpp's state of sequence `seq`: its cells' keys and values (a copy)."""
        size = lc.llama_state_seq_get_size(self._ctx, seq)
        buf = np.empty(size, np.uint8)
        got = lc.llama_state_seq_get_data(self._ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                          size, seq)
        return buf[:got]

    def set_seq_state(self, state: np.ndarray, seq: int = 0) -> bool:
        """Load `seq_state`'s bytes into sequence `seq` (empty before); False where llama.cpp
        refuses them (another model's, or no room)."""
        state = np.ascontiguousarray(state, np.uint8)
        return lc.llama_state_seq_set_data(self._ctx, state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                           state.size, seq) > 0

    def trim(self, keep: int) -> bool:
        """Drop every cell at position `keep` or later, in every sequence; False where the memory
        cannot drop part of a sequence (llama.cpp's recurrent caches), which is then unchanged."""
        return bool(lc.llama_memory_seq_rm(self._mem, -1, keep, -1))

    def clear(self) -> None:
        lc.llama_memory_clear(self._mem, True)

    def close(self) -> None:
        """Free what llama.cpp allocated; again (`__del__` at exit) frees nothing twice. Each
        handle is let go of before it is freed: a Ctrl+C can land between any two lines here (a
        dropped one is raised again shortly after, app/exits.py), and a handle freed but still
        held would be freed again at exit ("double free or corruption"); one let go of but not
        freed only leaks until the process ends."""
        self._free_context()
        model, self._model = getattr(self, "_model", None), None
        if model:
            lc.llama_model_free(model)
        if getattr(self, "_exact", None) is not None:
            self._exact, exact = None, self._exact
            exact.__exit__(None, None, None)

    def _free_context(self) -> None:
        """The context and its batch (close, first: the model outlives what uses it)."""
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if ctx:
            batch, self._batch = getattr(self, "_batch", None), None   # none yet: refused at open
            if batch is not None:
                lc.llama_batch_free(batch)
            lc.llama_free(ctx)

    def __del__(self) -> None:
        self.close()
