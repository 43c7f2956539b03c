"""The head's layer as drafting runs it: HeadNet's weights, fewer and larger operations.

Training needs HeadNet's parameters one per matrix; a drafting step is a handful of rows, so what it
costs is the number of operations, not their arithmetic: on a GPU each is a kernel launch of a few
microseconds (a step is a CUDA graph of them), on a CPU each is dispatch and, with int8 weights, a
quantization of its input. So q, k and v come from one matrix and gate and up from another (their
rows stacked: each output row is the same dot product as before, and int8's per-row scales are
the same rows' scales), and RoPE's angles are computed once for q and k, from a table of inverse
frequencies built at load. The functions match HeadNet's (`inputs`, `qkv`, `finish`, `fuse`), so a
step reads the same either way.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .head_net import HeadNet, rms


class StepNet(torch.nn.Module):
    """A trained HeadNet's layer, its matrices stacked for stepping (not for training)."""

    def __init__(self, net: HeadNet) -> None:
        super().__init__()
        s = self.shape = net.shape
        d, qd, kvd = s.d, s.heads * s.head_dim, s.kv_heads * s.head_dim
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.w_in, self.wo, self.w_down = lin(2 * d, d), lin(qd, d), lin(s.ff, d)
        self.wqkv, self.w_gu = lin(d, qd + 2 * kvd), lin(d, 2 * s.ff)
        self.w_taps = lin(d * len(s.taps), d) if s.taps else None
        with torch.no_grad():
            for name in ("w_in", "wo", "w_down") + (("w_taps",) if s.taps else ()):
                getattr(self, name).weight.copy_(getattr(net, name).weight)
            self.wqkv.weight.copy_(torch.cat([net.wq.weight, net.wk.weight, net.wv.weight]))
            self.w_gu.weight.copy_(torch.cat([net.w_gate.weight, net.w_up.weight]))
        self.attn_norm = torch.nn.Parameter(net.attn_norm.detach().clone(), requires_grad=False)
        self.mlp_norm = torch.nn.Parameter(net.mlp_norm.detach().clone(), requires_grad=False)
        self.norm = torch.nn.Parameter(net.norm.detach().clone(), requires_grad=False)
        half = torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim
        self.register_buffer("inv_freq", s.rope_base ** -half)   # [hd/2], float32 in any dtype
        self._qk_dim = qd + kvd   # q's and k's columns of wqkv's output; v's follow

    def _apply(self, fn, recurse=True):
        """Moves and casts as any module's, but the inverse frequencies stay float32 (angles of
        positions in the thousands need its precision)."""
        inv = self.inv_freq
        out = super()._apply(fn, recurse)
        self.inv_freq = inv.to(self.inv_freq.device)
        return out

    def fuse(self, f: torch.Tensor) -> torch.Tensor:
        """HeadNet.fuse."""
        if self.w_taps is None:
            return f
        d, taps = self.shape.d, len(self.shape.taps)
        return f[..., :d] + self.w_taps(rms(f[..., d:].unflatten(-1, (taps, d))).flatten(-2))

    def inputs(self, f: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.w_in(torch.cat([rms(f), rms(e)], dim=-1))

    def qkv(self, u: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """HeadNet.qkv: u [..., n, d], pos [..., n] -> q [..., n, H, hd], k and v [..., n, KVH, hd];
        q and k rotated together, as one tensor of H + KVH heads."""
        s = self.shape
        x = self.wqkv(rms(u) * self.attn_norm)
        qk = x[..., :self._qk_dim].unflatten(-1, (s.heads + s.kv_heads, s.head_dim))
        v = x[..., self._qk_dim:].unflatten(-1, (s.kv_heads, s.head_dim))
        ang = pos.to(torch.float32)[..., None] * self.inv_freq             # [..., n, hd/2]
        cos, sin = ang.cos()[..., None, :].to(qk.dtype), ang.sin()[..., None, :].to(qk.dtype)
        a, b = qk[..., :s.head_dim // 2], qk[..., s.head_dim // 2:]
        qk = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
        return qk[..., :s.heads, :], qk[..., s.heads:, :], v

    def finish(self, u: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        a = u + self.wo(att)
        gate, up = self.w_gu(rms(a) * self.mlp_norm).chunk(2, dim=-1)
        m = a + self.w_down(F.silu(gate) * up)
        return rms(m) * self.norm


def attend_few(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """head_net.attend for a step's few rows on a CPU, as two batched products per KV group:
    q [1, n, H, hd] against k, v [1, S, KVH, hd] where mask [1, n, S]; [1, n, H*hd]. For one to
    four query rows torch's CPU attention kernel, built for long queries, takes longer
    (docs/decisions/0042)."""
    _, n, heads, hd = q.shape
    groups, S = k.shape[2], k.shape[1]
    per = heads // groups
    qg = q[0].reshape(n, groups, per, hd).permute(1, 0, 2, 3).reshape(groups, n * per, hd)
    scores = torch.bmm(qg, k[0].permute(1, 2, 0)).mul_(hd ** -0.5)           # [G, n*per, S]
    scores = scores.view(groups, n, per, S).masked_fill_(~mask[0][None, :, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).view(groups, n * per, S)
    out = torch.bmm(weights, v[0].transpose(0, 1))                          # [G, n*per, hd]
    return out.view(groups, n, per, hd).permute(1, 0, 2, 3).reshape(1, n, heads * hd)
