"""The head's stepping layer (head_step.py) computes what its trained layer (head_net.py) does."""
from __future__ import annotations

import pytest
import torch

from localspec.engine.drafters.head_net import HeadNet, HeadShape, attend
from localspec.engine.drafters.head_step import StepNet, attend_few


def _trained(shape: HeadShape) -> HeadNet:
    torch.manual_seed(0)
    net = HeadNet(shape)
    with torch.no_grad():   # every weight away from its initial value, taps included
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return net.eval()


@pytest.mark.parametrize("taps", [(), (1, 3)])
def test_step_net_matches_the_trained_layer(taps):
    shape = HeadShape.for_target(256, taps=taps)   # 2 heads of 128, grouped onto 2 KV heads
    net = _trained(shape)
    step = StepNet(net).eval()
    n, d = 5, shape.d
    f = torch.randn(n, d * (1 + len(taps)))
    e = torch.randn(n, d)
    pos = torch.tensor([3, 700, 701, 4095, 9000])
    with torch.no_grad():
        np_u = net.inputs(net.fuse(f), e)
        u = step.inputs(step.fuse(f), e)
        torch.testing.assert_close(u, np_u)
        for got, want in zip(step.qkv(u[None], pos[None]), net.qkv(np_u[None], pos[None])):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        att = torch.randn(n, shape.heads * shape.head_dim)
        torch.testing.assert_close(step.finish(u, att), net.finish(np_u, att), atol=1e-5, rtol=1e-5)


def test_step_net_keeps_rope_frequencies_in_float32():
    """Cast to bfloat16 for a GPU, the angles of positions in the thousands still come from
    float32 frequencies: the rotated keys are the float32 layer's, to bfloat16's precision."""
    shape = HeadShape.for_target(256)
    step = StepNet(_trained(shape)).eval()
    half = StepNet(_trained(shape)).to(dtype=torch.bfloat16).eval()
    assert half.inv_freq.dtype == torch.float32 and half.wqkv.weight.dtype == torch.bfloat16
    u = torch.randn(1, 3, shape.d)
    pos = torch.tensor([[5000, 12000, 30000]])
    with torch.no_grad():
        _, k32, _ = step.qkv(u, pos)
        _, k16, _ = half.qkv(u.bfloat16(), pos)
    torch.testing.assert_close(k16.float(), k32, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("rows", [1, 3, 4])
def test_attend_few_is_attend(rows):
    torch.manual_seed(1)
    q, k, v = torch.randn(1, rows, 8, 64), torch.randn(1, 50, 2, 64), torch.randn(1, 50, 2, 64)
    mask = torch.rand(1, rows, 50) < 0.3
    mask[0, torch.arange(rows), 40 + torch.arange(rows)] = True   # each row sees itself
    torch.testing.assert_close(attend_few(q, k, v, mask), attend(q, k, v, mask), atol=1e-5, rtol=1e-5)
