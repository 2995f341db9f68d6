"""adaptive_max_pool2d/3d with indices, and their backward, natively vs CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


@pytest.mark.parametrize("shape,size", [
    ((2, 3, 7, 9), (3, 4)),    # uneven, overlapping bins
    ((3, 5, 5), (2, 2)),       # unbatched
    ((1, 2, 8, 8), (4, 4)),    # even bins
    ((2, 2, 6, 5), (6, 5)),    # identity
    ((1, 1, 5, 7), (1, None)),  # global rows, None keeps the size
])
def test_adaptive_max_pool2d_values_indices_and_gradient(shape, size) -> None:
    torch.manual_seed(0)
    x = torch.randn(*shape)
    x.view(-1)[4] = x.view(-1)[3]  # a tie: the first in row-major order wins
    xt, xc = x.to("tpu").requires_grad_(), x.clone().requires_grad_()
    before = _fallbacks()
    vt, it = F.adaptive_max_pool2d(xt, size, return_indices=True)
    w = torch.randn(vt.shape)
    (vt * w.to("tpu")).sum().backward()
    assert _fallbacks() == before
    vc, ic = F.adaptive_max_pool2d(xc, size, return_indices=True)
    (vc * w).sum().backward()
    torch.testing.assert_close(vt.cpu(), vc, rtol=0, atol=0)
    assert torch.equal(it.cpu(), ic)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=0, atol=0)


def test_adaptive_max_pool_nan_bf16_and_3d() -> None:
    x = torch.randn(1, 2, 5, 5)
    x[0, 0, 1, 1] = x[0, 0, 2, 2] = float("nan")  # the last NaN of a bin wins, as CPU
    vt, it = F.adaptive_max_pool2d(x.to("tpu"), 2, return_indices=True)
    vc, ic = F.adaptive_max_pool2d(x, 2, return_indices=True)
    torch.testing.assert_close(vt.cpu(), vc, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(it.cpu(), ic)
    xb = torch.randn(2, 3, 6, 7).bfloat16()
    torch.testing.assert_close(F.adaptive_max_pool2d(xb.to("tpu"), (4, 3)).cpu(),
                               F.adaptive_max_pool2d(xb, (4, 3)), rtol=0, atol=0)
    x3 = torch.randn(2, 3, 5, 6, 7)
    before = _fallbacks()
    vt, it = F.adaptive_max_pool3d(x3.to("tpu"), (2, 3, 4), return_indices=True)
    assert _fallbacks() == before
    vc, ic = F.adaptive_max_pool3d(x3, (2, 3, 4), return_indices=True)
    torch.testing.assert_close(vt.cpu(), vc, rtol=0, atol=0)
    assert torch.equal(it.cpu(), ic)
    # adaptive_max_pool1d goes through the 2-d op
    x1 = torch.randn(2, 3, 10)
    torch.testing.assert_close(F.adaptive_max_pool1d(x1.to("tpu"), 4).cpu(),
                               F.adaptive_max_pool1d(x1, 4), rtol=0, atol=0)
