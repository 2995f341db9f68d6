"""fractional_max_pool2d (given random samples) and its backward natively, vs CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape,kernel,size", [
    ((2, 3, 9, 11), (2, 3), (4, 5)),
    ((3, 8, 8), 2, (4, 4)),          # unbatched
    ((1, 2, 7, 7), 3, (1, 1)),       # one window: the last one
    ((2, 2, 10, 6), (3, 2), (8, 5)),  # overlapping windows
])
def test_values_indices_and_gradient_match_cpu(dtype, shape, kernel, size) -> None:
    # The window starts come from the samples in the input's arithmetic
    # (bfloat16 rounds each step, as CPU's kernel): indices must be CPU's.
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype)
    samples = torch.rand(shape[0] if len(shape) == 4 else 1, shape[-3], 2, dtype=dtype)
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    kw = dict(output_size=size, return_indices=True)
    before = _fallbacks()
    vt, it = F.fractional_max_pool2d(xt, kernel, _random_samples=samples.to("tpu"), **kw)
    w = torch.randn(vt.shape, dtype=dtype)
    (vt * w.to("tpu")).sum().backward()
    assert _fallbacks() == before
    vc, ic = F.fractional_max_pool2d(xc, kernel, _random_samples=samples, **kw)
    (vc * w).sum().backward()
    assert torch.equal(it.cpu(), ic)
    torch.testing.assert_close(vt.detach().cpu(), vc.detach(), rtol=0, atol=0)
    if dtype != torch.bfloat16:
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=0, atol=0)
        return
    # bfloat16: overlapping windows add several gradients into one input.
    # CPU rounds after every add, the tpu adds in float32 and rounds once:
    # within one bfloat16 rounding of the float64 sum.
    exact = torch.zeros(x.shape, dtype=torch.float64).flatten(-2).scatter_add(
        -1, ic.flatten(-2), w.double().flatten(-2)).view(x.shape)
    assert ((xt.grad.cpu().double() - exact).abs() <= exact.abs() * 2**-8).all()


def test_drawn_samples_pick_window_maxima() -> None:
    # Without _random_samples the samples are drawn on the device (not CPU's
    # stream): each output is still the maximum of a kernel-sized window.
    x = torch.randn(2, 3, 9, 9)
    v, i = F.fractional_max_pool2d(x.to("tpu"), 2, output_size=(4, 4), return_indices=True)
    flat = x.flatten(2)
    torch.testing.assert_close(v.cpu(), flat.gather(2, i.cpu().flatten(2)).view_as(v.cpu()))
