"""The target's hidden states: what a draft head drafts from, read out of llama.cpp's context.

With hidden states on, every decode also hands back each output row's final hidden state (after
the output norm: the input of the output matrix), and with taps the inputs of some layers too
(0: the token's embedding; layer i's: the output of the layers below it), laid after the final
state: EAGLE-3's fused features, `n_feature` wide. llama.cpp then outputs every row of a batch,
which costs a logits row each, so they are switched off where no head reads them (a prefill's
head, bench's configurations without a head).

Mixed into LlamaModel (llama_model.py), which holds the context (`_ctx`, `_model`), its sizes
(`n_embd`, `n_batch`) and the last decode's output count (`_n_outputs`); decode and prefill there
read `hidden` to ask llama.cpp for the rows these need.
"""
from __future__ import annotations

from .native import has_layer_inputs, last_log, layer_inputs_api  # first: see native.py

import contextlib
from typing import Iterator, Sequence

import llama_cpp as lc
import numpy as np

from .errors import LocalspecError


class HiddenStates:
    """LlamaModel's hidden states and taps (see the module docstring)."""

    def _open_hidden(self, hidden: bool, taps: Sequence[int]) -> None:
        """At open: hidden states on or off, and the taps' layer inputs asked for."""
        self.hidden = self._opened_hidden = hidden
        if hidden:
            lc.llama_set_embeddings(self._ctx, True)
        self.taps = tuple(int(t) for t in taps) if hidden else ()
        self._open_taps(self.n_batch)
        self.n_feature = self.n_embd * (1 + len(self.taps))

    def _open_taps(self, n_batch: int) -> None:
        """Ask llama.cpp for the taps' layer inputs and make the buffer `hidden_rows` fills."""
        if not self.taps:
            self._wide = None
            return
        n_layer = lc.llama_model_n_layer(self._model)
        if not has_layer_inputs(self.info.architecture):
            raise LocalspecError("This llama.cpp cannot hand back the model's layer states",
                                 f"a draft head reads layers {list(self.taps)} of '{self.path.name}' "
                                 f"({self.info.architecture}); localspec's build serves Qwen2 models",
                                 "Reinstall with `make install` (it builds llama.cpp with "
                                 "packaging/patches), or train a head without --taps")
        if not all(0 <= t < n_layer for t in self.taps):
            raise LocalspecError("No such layers", f"taps {list(self.taps)}: '{self.path.name}' has "
                                 f"layers 0..{n_layer - 1} to read", "Name layers in that range")
        set_, _ = layer_inputs_api()
        for t in self.taps:
            set_(self._ctx, t, True)
        self._wide = np.empty((n_batch, self.n_embd * (1 + len(self.taps))), np.float32)

    def _widen(self, final: np.ndarray, rows: slice | np.ndarray) -> np.ndarray:
        """`final` [n, n_embd] (the rows `rows` of the last decode) with the taps' layer inputs
        of those rows after it, in the buffer made at open: [n, n_feature], valid until the next
        call."""
        n, d = len(final), self.n_embd
        out = self._wide[:n]
        out[:, :d] = final
        _, get = layer_inputs_api()
        for j, t in enumerate(self.taps):
            layer = np.ctypeslib.as_array(get(self._ctx, t), shape=(self.n_batch, d))
            out[:, d * (j + 1):d * (j + 2)] = layer[rows]
        return out

    def hidden_row(self, i: int) -> np.ndarray:
        """[n_embd] float32: the final hidden state (after the output norm, the input of the
        output matrix) of batch row i of the last decode, which must have had logits there; a
        zero-copy view, valid until the next decode. Needs the model opened with hidden=True.
        With taps: [n_feature], the taps' layer inputs after it, valid until the next call."""
        ptr = lc.llama_get_embeddings_ith(self._ctx, i)
        if not ptr:
            raise RuntimeError(f"no hidden state for batch row {i} ({last_log()})")
        final = np.ctypeslib.as_array(ptr, shape=(self.n_embd,))
        return final if not self.taps else self._widen(final[None], slice(i, i + 1))[0]

    def hidden_rows(self) -> np.ndarray:
        """[n_outputs, n_embd] float32: every row's final hidden state of the last decode (with
        hidden states llama.cpp outputs every batch row, padding included), one zero-copy view,
        valid until the next decode: what reading many rows costs one call, not one per row.
        With taps: [n_outputs, n_feature], the taps' layer inputs after the final state, in a
        buffer of the model's (valid until the next call)."""
        ptr = lc.llama_get_embeddings(self._ctx)
        if not ptr or not self.hidden or self._n_outputs == 0:
            raise RuntimeError(f"no hidden states in the last decode ({last_log()})")
        final = np.ctypeslib.as_array(ptr, shape=(self._n_outputs, self.n_embd))
        return final if not self.taps else self._widen(final, slice(0, self._n_outputs))

    def set_hidden(self, on: bool) -> None:
        """From now on decode with hidden states or without, as if opened so (a draft head left
        out after loading; bench's configurations without the head): without, llama.cpp no
        longer outputs every batch row. On only for a model opened with hidden=True."""
        if on and not self._opened_hidden:
            raise ValueError("set_hidden(True) needs the model opened with hidden=True")
        self._switch_hidden(on)

    @contextlib.contextmanager
    def _without_hidden(self) -> Iterator[None]:
        """Decodes inside go without hidden states (llama.cpp would otherwise output, and copy
        out, every row's logits); as it was after, whatever happens inside."""
        was = self.hidden
        if was:
            self._switch_hidden(False)
        try:
            yield
        finally:
            if was:
                self._switch_hidden(True)

    def _switch_hidden(self, on: bool) -> None:
        """Hidden states, and the taps' layer inputs with them, on or off for the decodes after."""
        lc.llama_set_embeddings(self._ctx, on)
        if self.taps:
            set_, _ = layer_inputs_api()
            for t in self.taps:
                set_(self._ctx, t, on)
        self.hidden = on
