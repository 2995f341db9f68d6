"""linalg.matrix_exp natively (scaling and squaring, Pade 13), values and gradients vs CPU."""
from __future__ import annotations

import math

import pytest
import torch

import torch_tpu


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.to(ref.dtype) - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("shape,scale", [((3, 3), 0.1), ((2, 5, 5), 3.0), ((6, 6), 20.0),
                                         ((1, 1), 2.0), ((3, 3), 0.0)])
def test_matrix_exp_matches_the_exact_exponential_as_closely_as_cpu(dtype, shape, scale) -> None:
    # Relative to the (CPU) float64 exponential. The rule computes in
    # float64 and rounds once, so 32-bit results are within CPU's own error
    # plus one ulp; float64 within 128 ulps per squaring (each may double
    # the error; the reference is CPU's float64 result, with errors of its
    # own; s: the rule's count, norm 1 over theta_13 = 5.37).
    torch.manual_seed(0)
    a = torch.randn(*shape, dtype=dtype) * scale
    exact = torch.linalg.matrix_exp(a.to(torch.complex128 if dtype.is_complex else torch.float64))
    before = _fallbacks()
    got = torch.linalg.matrix_exp(a.to("tpu")).cpu()
    assert _fallbacks() == before
    eps = torch.finfo(dtype).eps
    norm = a.abs().sum(-2).max().item()
    s = max(0, math.ceil(math.log2(norm / 5.37))) if norm > 0 else 0
    if dtype == torch.float64:
        assert _rel(got, exact) <= 128 * eps * (1 + s)
    else:
        assert _rel(got, exact) <= _rel(torch.linalg.matrix_exp(a), exact) + eps


def test_matrix_exp_gradient_and_batches_of_different_norms() -> None:
    torch.manual_seed(1)
    # one small and one large matrix in a batch: squared 0 and 5 times
    a = torch.stack([torch.randn(4, 4) * 0.01, torch.randn(4, 4) * 10])
    torch.testing.assert_close(torch.linalg.matrix_exp(a.to("tpu")).cpu(), torch.linalg.matrix_exp(a),
                               rtol=2e-5, atol=1e-6)
    x = torch.randn(4, 4)
    xt, xc = x.to("tpu").requires_grad_(), x.clone().requires_grad_()
    w = torch.randn(4, 4)
    before = _fallbacks()
    (torch.linalg.matrix_exp(xt) * w.to("tpu")).sum().backward()
    assert _fallbacks() == before
    (torch.linalg.matrix_exp(xc) * w).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)
