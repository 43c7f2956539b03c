"""The draft head's network: one decoder layer over the head's own past, fed by the target's state.

Each input is a pair: the target's final hidden state f_t (after its output norm: what its output
matrix reads to choose token t+1) and the embedding of the token t+1 that followed. The head
predicts the target's next state f_{t+1} and reads it through the target's own output rows
(EAGLE's design, one layer):

    u   = W_in [rms(f_t); rms(e(x_{t+1}))]
    a   = u + Attn(norm(u))             over the pairs before it (the head's KV cache), RoPE at t
    m   = a + MLP(norm(a))              SiLU-gated
    f'  = g * rms(m)                    the predicted f_{t+1}; logits = O_sub f'

While drafting, a pair of the committed context has the target's true state; a tree node's pair
has its parent's predicted one. The same functions serve training (batches of sequences) and
drafting (rows against a cache), so both run one definition of the layer.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from localspec.models.head_file import ARRAYS, OPTIONAL

_EPS = 1e-6
# grouped KV heads without copying them: torch 2.5's scaled_dot_product_attention(enable_gqa=)
_GQA = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + _EPS).to(x.dtype)


@dataclass(frozen=True)
class HeadShape:
    d: int
    heads: int
    kv_heads: int
    head_dim: int
    ff: int
    rope_base: float = 10000.0
    taps: tuple[int, ...] = ()   # target layers whose input states the head reads beside the last

    @classmethod
    def for_target(cls, d: int, ff: int | None = None, taps: tuple[int, ...] = ()) -> HeadShape:
        """Heads of 128 (64, or the whole width for tiny models); a quarter as many KV heads; an
        MLP as wide as the target (a wider one guessed no better in the same training time and
        stepped slower on a CPU: docs/decisions/0030)."""
        head_dim = next((h for h in (128, 64) if d % h == 0 and d > h), d)
        heads = d // head_dim
        kv = heads // 4 if heads >= 4 and heads % 4 == 0 else heads
        return cls(d, heads, kv, head_dim, ff or d, taps=tuple(taps))

    def to_json(self) -> dict:
        out = asdict(self)
        out["taps"] = list(self.taps)
        return out

    @classmethod
    def from_json(cls, d: dict) -> HeadShape:
        taps = d.get("taps", [])
        if not isinstance(taps, list) or not all(isinstance(t, int) and t >= 0 for t in taps):
            raise TypeError(f"taps {taps!r} is not a list of layer numbers")
        return cls(**{k: d[k] for k in ("d", "heads", "kv_heads", "head_dim", "ff", "rope_base")}, taps=tuple(taps))


def expected_shapes(shape: HeadShape) -> dict[str, tuple[int, ...]]:
    """Each array's shape in a head file of this `shape` (models/head_file.py)."""
    d, qd, kvd, ff = shape.d, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.ff
    return {"w_in": (d, 2 * d), "attn_norm": (d,), "wq": (qd, d), "wk": (kvd, d), "wv": (kvd, d),
            "wo": (d, qd), "mlp_norm": (d,), "w_gate": (ff, d), "w_up": (ff, d), "w_down": (d, ff),
            "norm": (d,), **({"w_taps": (d, d * len(shape.taps))} if shape.taps else {})}


def shape_problem(meta: dict, arrays: dict[str, np.ndarray], n_embd: int, vocab_size: int) -> str | None:
    """What makes a head file's layer unusable for a target of this size, or None: its shape
    as the meta claims it, checked against the arrays (nothing is allocated from a claim)."""
    try:
        shape = HeadShape.from_json(meta["shape"])
        if not all(isinstance(v, int) and v > 0 for v in (shape.heads, shape.kv_heads, shape.head_dim, shape.ff)):
            return f"its layer's shape {meta['shape']} is not positive integers"
    except (KeyError, TypeError, AttributeError) as err:
        return f"its meta has no layer shape ({err})"
    if shape.d != n_embd or shape.heads % shape.kv_heads:
        return f"its layer's shape {shape.to_json()} does not fit a target {n_embd} wide"
    for name, want in expected_shapes(shape).items():
        if name not in arrays:
            return f"its shape reads layers {list(shape.taps)} but it has no {name}"
        if arrays[name].dtype.kind != "f":
            return f"array {name} holds {arrays[name].dtype}, not floats"
        if arrays[name].shape != want:
            return f"array {name} is {arrays[name].shape}, its shape says {want}"
        # NaN or inf in any weight makes every draft NaN: checked once here, a pass over the
        # arrays (milliseconds), rather than found as a broken run later
        if not np.isfinite(arrays[name]).all():
            return (f"array {name} holds weights that are not finite (NaN or inf): its training "
                    "diverged or the file was damaged")
    vocab = arrays["vocab"]
    if vocab.ndim != 1 or not vocab.size or vocab.dtype.kind not in "iu":
        return "its draft vocabulary is not a list of token ids"
    if vocab.min() < 0 or vocab.max() >= vocab_size or np.any(np.diff(vocab.astype(np.int64)) <= 0):
        return f"its draft vocabulary is not ascending token ids below {vocab_size}"
    return None


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary positions (rotate-half form): x [..., n, heads, hd], pos [..., n]."""
    hd = x.shape[-1]
    inv = base ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)   # [hd/2]
    ang = pos.to(torch.float32)[..., None] * inv                                    # [..., n, hd/2]
    cos, sin = ang.cos()[..., None, :].to(x.dtype), ang.sin()[..., None, :].to(x.dtype)
    a, b = x[..., :hd // 2], x[..., hd // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, n, H, hd] against k, v [B, S, KVH, hd] where mask [B or 1, n, S] (True: seen);
    [B, n, H*hd]. Every query must see at least one key (itself)."""
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if _GQA:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[:, None], enable_gqa=True)
    else:
        rep = q.shape[2] // k.shape[2]
        out = F.scaled_dot_product_attention(qh, kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1),
                                             attn_mask=mask[:, None])
    return out.transpose(1, 2).flatten(2)


class HeadNet(torch.nn.Module):
    """The trainable part: (state, token embedding) pairs -> the next state, one attention layer."""

    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        s = self.shape = shape
        d, qd, kvd = s.d, s.heads * s.head_dim, s.kv_heads * s.head_dim
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.w_in, self.wq, self.wk, self.wv, self.wo = lin(2 * d, d), lin(d, qd), lin(d, kvd), lin(d, kvd), lin(qd, d)
        self.w_gate, self.w_up, self.w_down = lin(d, s.ff), lin(d, s.ff), lin(s.ff, d)
        self.attn_norm = torch.nn.Parameter(torch.ones(d))
        self.mlp_norm = torch.nn.Parameter(torch.ones(d))
        self.norm = torch.nn.Parameter(torch.ones(d))
        for w in (self.wo, self.w_down):   # the layer starts near the identity on its input
            torch.nn.init.normal_(w.weight, std=0.02 / d ** 0.5)
        if s.taps:   # zero: a new head starts as one without taps
            self.w_taps = lin(d * len(s.taps), d)
            torch.nn.init.zeros_(self.w_taps.weight)

    def fuse(self, f: torch.Tensor) -> torch.Tensor:
        """The target's features [..., d * (1 + taps)] (its final state, then the tapped layers'
        input states) -> a state [..., d]: the final one, plus a learned mix of the tapped layers'
        (each normalised alone: the residual stream grows through the layers). EAGLE-3 fuses
        low, middle and last layers this way. The mix enters where the target's states do: a
        tree node's input is its parent's predicted final state, as without taps."""
        taps, d = len(self.shape.taps), self.shape.d
        if not taps:
            return f
        return f[..., :d] + self.w_taps(rms(f[..., d:].unflatten(-1, (taps, d))).flatten(-2))

    def inputs(self, f: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.w_in(torch.cat([rms(f), rms(e)], dim=-1))

    def qkv(self, u: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """u [..., n, d], pos [..., n] -> q [..., n, H, hd], k and v [..., n, KVH, hd]."""
        s = self.shape
        x = rms(u) * self.attn_norm
        q = self.wq(x).unflatten(-1, (s.heads, s.head_dim))
        k = self.wk(x).unflatten(-1, (s.kv_heads, s.head_dim))
        v = self.wv(x).unflatten(-1, (s.kv_heads, s.head_dim))
        return rope(q, pos, s.rope_base), rope(k, pos, s.rope_base), v

    def finish(self, u: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        a = u + self.wo(att)
        x = rms(a) * self.mlp_norm
        m = a + self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
        return rms(m) * self.norm

    def arrays(self) -> dict[str, np.ndarray]:
        """The weights as the head file keeps them (models/head_file.py), float16."""
        def value(name: str) -> torch.Tensor:
            p = getattr(self, name)
            return p.weight if isinstance(p, torch.nn.Linear) else p
        return {k: value(k).detach().float().cpu().numpy().astype(np.float16) for k in self._names()}

    def _names(self) -> tuple[str, ...]:
        return ARRAYS + tuple(o for o in OPTIONAL if hasattr(self, o))

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for name in self._names():
                p = getattr(self, name)
                (p.weight if isinstance(p, torch.nn.Linear) else p).copy_(
                    torch.from_numpy(arrays[name].astype(np.float32)))
