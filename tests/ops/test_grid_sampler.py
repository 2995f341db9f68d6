"""grid_sampler_2d (F.grid_sample, 4-d) and its backward natively, vs CPU."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import torch_tpu


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


CASES = list(itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"],
                               [True, False]))


@pytest.mark.parametrize("mode,padding,align", CASES)
def test_grid_sample_values_and_gradients_match_cpu(mode: str, padding: str, align: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 7)
    # points well outside [-1, 1] exercise the padding modes and reflections
    g = torch.rand(2, 4, 6, 2) * 3.2 - 1.6
    if mode == "nearest":  # keep taps away from ties of round-half-even
        g = g + 1e-3
    xc, gc = x.clone().requires_grad_(), g.clone().requires_grad_()
    xt, gt = x.to("tpu").requires_grad_(), g.to("tpu").requires_grad_()
    kw = dict(mode=mode, padding_mode=padding, align_corners=align)
    before = _fallbacks()
    yt = F.grid_sample(xt, gt, **kw)
    w = torch.randn(yt.shape)
    (yt * w.to("tpu")).sum().backward()
    assert _fallbacks() == before
    yc = F.grid_sample(xc, gc, **kw)
    (yc * w).sum().backward()
    torch.testing.assert_close(yt.cpu(), yc, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)
    # grad_grid sums C * 4 products of values ~1 scaled by size / 2
    torch.testing.assert_close(gt.grad.cpu(), gc.grad, rtol=1e-5, atol=2e-5)


def test_grid_sample_bf16_and_one_sided_gradients() -> None:
    torch.manual_seed(1)
    x = torch.randn(1, 2, 4, 4)
    g = torch.rand(1, 3, 3, 2) * 2 - 1
    xb, gb = x.bfloat16(), g.bfloat16()
    got = F.grid_sample(xb.to("tpu"), gb.to("tpu"), align_corners=False).cpu()
    # CPU's bf16 kernel rounds every step to bf16; the tpu computes in f32 and
    # rounds once, so both are compared with the float64 result of the same
    # bf16 inputs: the tpu's error is one bf16 rounding, never above CPU's.
    exact = F.grid_sample(xb.double(), gb.double(), align_corners=False)
    cpu = F.grid_sample(xb, gb, align_corners=False)
    err = (got.double() - exact).abs()
    assert got.dtype == torch.bfloat16
    assert (err <= exact.abs() * 2**-8 + 1e-6).all()
    assert err.max() <= (cpu.double() - exact).abs().max()
    # only the grid requires grad (an affine_grid warp): output_mask = [False, True]
    gt = g.to("tpu").requires_grad_()
    gc = g.clone().requires_grad_()
    F.grid_sample(x.to("tpu"), gt, align_corners=True).sum().backward()
    F.grid_sample(x, gc, align_corners=True).sum().backward()
    torch.testing.assert_close(gt.grad.cpu(), gc.grad, rtol=1e-5, atol=1e-5)
    # only the input: output_mask = [True, False]
    xt, xc = x.to("tpu").requires_grad_(), x.clone().requires_grad_()
    F.grid_sample(xt, g.to("tpu"), mode="nearest", align_corners=False).sum().backward()
    F.grid_sample(xc, g, mode="nearest", align_corners=False).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)


def test_bicubic_runs_through_the_cpu_fallback() -> None:
    x, g = torch.randn(1, 1, 4, 4), torch.rand(1, 2, 2, 2) * 2 - 1
    before = _fallbacks().get("grid_sampler_2d", 0)
    got = F.grid_sample(x.to("tpu"), g.to("tpu"), mode="bicubic", align_corners=False)
    assert _fallbacks().get("grid_sampler_2d", 0) == before + 1
    torch.testing.assert_close(got.cpu(), F.grid_sample(x, g, mode="bicubic", align_corners=False))
