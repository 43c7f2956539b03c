"""The target as `head train` runs it: many independent sequences at once, each row's next token
chosen where the model runs, and every row's hidden states kept in float16.

A head learns from the target's hidden states over text and over the target's own continuations
(head_train.py). Generating those continuations side by side wants what decoding never does: a
KV stream per sequence (a row attends over its own sequence's cells only), prompts packed across
sequences into long batches, and llama.cpp's backend greedy sampler, so that no row's logits are
copied out. Kept apart from LlamaModel (one model, one context, what a round needs) as a model
that opens its context so.
"""
from __future__ import annotations

from .native import last_log, to_half  # first: see native.py

import ctypes
from pathlib import Path
from typing import Sequence

import llama_cpp as lc
import numpy as np

from .errors import LocalspecError
from .llama_model import LlamaModel


class TrainingModel(LlamaModel):
    """A LlamaModel whose context serves head training (the module docstring)."""

    def __init__(self, path: str | Path, *, n_ctx: int, n_batch: int, n_seq_max: int,
                 n_gpu_layers: int = -1, n_threads: int | None = None, hidden: bool = False,
                 taps: Sequence[int] = (), unified: bool = True, greedy_on_device: bool = False) -> None:
        """unified: one KV cache that every sequence shares, as decoding's; False splits n_ctx
        into one stream per sequence, so a row attends over its own sequence's cells only (many
        independent continuations at once).
        greedy_on_device: each sequence gets llama.cpp's backend greedy sampler (its experimental
        backend-sampling API): a decode hands back each output row's most likely token
        (`sampled`), chosen where the model runs, and no row's logits are copied out (`logits`
        is then not to be read)."""
        self._unified = unified
        self._greedy = greedy_on_device
        self._samplers: list = []   # backend greedy chains, freed after the context
        super().__init__(path, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq_max,
                         n_gpu_layers=n_gpu_layers, n_threads=n_threads, hidden=hidden, taps=taps)

    def _context_params(self, n_ctx: int, n_batch: int, n_seq_max: int, n_pad_seqs: int,
                        threads: int) -> lc.llama_context_params:
        cparams = super()._context_params(n_ctx, n_batch, n_seq_max, n_pad_seqs, threads)
        cparams.kv_unified = self._unified
        if self._greedy:
            configs = self._configs = (lc.llama_sampler_seq_config * n_seq_max)()  # held: read at init
            for seq in range(n_seq_max):
                chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
                self._samplers.append(chain)
                configs[seq].seq_id, configs[seq].sampler = seq, ctypes.cast(chain, ctypes.c_void_p)
            cparams.samplers = ctypes.cast(configs, type(cparams.samplers))
            cparams.n_samplers = n_seq_max
            cparams.n_outputs_max_per_seq = n_batch   # every row of a sequence may be sampled
        return cparams

    def sampled(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """[len(rows)] int32: the token each batch row's sequence's backend greedy sampler chose
        in the last decode (a model opened with greedy_on_device)."""
        out = np.fromiter((lc.llama_get_sampled_token_ith(self._ctx, int(i)) for i in rows), np.int32, len(rows))
        if out.size and out.min() < 0:
            raise LocalspecError("llama.cpp's backend sampling chose no token",
                                 f"rows {rows}: {last_log()}",
                                 "Open the model without greedy_on_device (take the most likely "
                                 "token from its logits), or update llama.cpp")
        return out

    def hidden_rows_to(self, out: np.ndarray) -> None:
        """Write the first len(out) rows of `hidden_rows()` into `out` ([r, n_feature] float16,
        C-contiguous), rounded as numpy's cast rounds but in one vectorised pass (native.to_half):
        what a draft head's corpus keeps of every row."""
        to_half(self.hidden_rows()[:len(out)], out)

    def prefill_many(self, prompts: Sequence[Sequence[int]]) -> None:
        """Prompt i into sequence i from position 0, packed across sequences into batches of up
        to n_batch tokens (one call per sequence would take as many calls as prompts: many
        short batches where a GPU wants few long ones). No hidden states and one output row a
        batch (its last): what starting many continuations side by side needs."""
        lengths = [len(p) for p in prompts]
        if not lengths or min(lengths) < 1 or len(prompts) > self.n_seq_max:
            raise ValueError(f"{len(prompts)} prompts (1..{self.n_seq_max}, none empty)")
        tokens = np.concatenate([np.asarray(p, np.int32) for p in prompts])
        positions = np.concatenate([np.arange(m, dtype=np.int32) for m in lengths])
        seqs = [(s,) for s, m in enumerate(lengths) for _ in range(m)]
        with self._without_hidden():
            for lo in range(0, len(tokens), self.n_batch):
                hi = min(lo + self.n_batch, len(tokens))
                self.decode(tokens[lo:hi], positions[lo:hi], seqs[lo:hi], logits=False)

    def _free_context(self) -> None:
        super()._free_context()
        samplers, self._samplers = getattr(self, "_samplers", []), []
        while samplers:
            lc.llama_sampler_free(samplers.pop())
