"""im2col / col2im (nn.functional.unfold / fold) natively, values and gradients vs CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


GEOMETRIES = [  # kernel, dilation, padding, stride
    ((2, 3), 1, 0, 1),
    ((3, 3), (2, 1), (1, 2), (2, 1)),
    (1, 1, 0, 2),
    ((2, 2), 1, 1, (3, 2)),
]


@pytest.mark.parametrize("kernel,dilation,padding,stride", GEOMETRIES)
@pytest.mark.parametrize("batched", [True, False])
def test_unfold_and_fold_match_cpu(kernel, dilation, padding, stride, batched: bool) -> None:
    torch.manual_seed(0)
    kw = dict(kernel_size=kernel, dilation=dilation, padding=padding, stride=stride)
    x = torch.randn(2, 3, 7, 8) if batched else torch.randn(3, 7, 8)
    xt = x.to("tpu").requires_grad_()
    xc = x.clone().requires_grad_()
    before = _fallbacks()
    cols_t = F.unfold(xt, **kw)
    back_t = F.fold(cols_t * 2, output_size=(7, 8), **kw)  # overlapping taps add up
    w = torch.randn(back_t.shape)
    (back_t * w.to("tpu")).sum().backward()
    assert _fallbacks() == before
    cols_c = F.unfold(xc, **kw)
    back_c = F.fold(cols_c * 2, output_size=(7, 8), **kw)
    (back_c * w).sum().backward()
    torch.testing.assert_close(cols_t.cpu(), cols_c, rtol=0, atol=0)
    torch.testing.assert_close(back_t.cpu(), back_c, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-6, atol=1e-6)


def test_fold_gradient_and_bf16() -> None:
    torch.manual_seed(1)
    cols = torch.randn(2, 3 * 4, 12)
    kw = dict(output_size=(4, 5), kernel_size=2, stride=1)
    ct, cc = cols.to("tpu").requires_grad_(), cols.clone().requires_grad_()
    F.fold(ct, **kw).pow(2).sum().backward()
    F.fold(cc, **kw).pow(2).sum().backward()
    torch.testing.assert_close(ct.grad.cpu(), cc.grad, rtol=1e-5, atol=1e-5)
    xb = torch.randn(1, 2, 5, 5).bfloat16()
    torch.testing.assert_close(F.unfold(xb.to("tpu"), 3, padding=1).cpu(), F.unfold(xb, 3, padding=1),
                               rtol=0, atol=0)


def test_complex_unfold_and_fold() -> None:
    torch.manual_seed(2)
    x = torch.randn(2, 3, 5, 6, dtype=torch.complex64)
    before = _fallbacks()
    cols = F.unfold(x.to("tpu"), 2, padding=1, stride=2)
    back = F.fold(cols, (5, 6), 2, padding=1, stride=2)
    assert _fallbacks() == before
    want = F.unfold(x, 2, padding=1, stride=2)
    torch.testing.assert_close(cols.cpu(), want, rtol=0, atol=0)
    torch.testing.assert_close(back.cpu(), F.fold(want, (5, 6), 2, padding=1, stride=2))
