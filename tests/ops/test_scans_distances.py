"""torch.logcumsumexp, torch.cdist (forward and backward), searchsorted and
bucketize on tpu vs CPU, with no CPU fallback."""
from __future__ import annotations

import pytest
import torch

from no_fallback import native


def test_logcumsumexp_with_infinities_and_grad() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 7, 5)
    x[0, 2, 1] = float("-inf")
    x[1, :, 2] = float("-inf")
    x[2, 3, 3] = float("inf")
    for dim in (0, 1, -1):
        with native():
            got = torch.logcumsumexp(x.to("tpu"), dim).cpu()
        torch.testing.assert_close(got, torch.logcumsumexp(x, dim), rtol=1e-6, atol=1e-6)
    y = torch.randn(4, 6, requires_grad=True)
    ty = y.detach().to("tpu").requires_grad_()
    torch.logcumsumexp(y, 1).sum().backward()
    with native():
        torch.logcumsumexp(ty, 1).sum().backward()
    torch.testing.assert_close(ty.grad.cpu(), y.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, float("inf")])
def test_cdist_forward_backward(p: float) -> None:
    torch.manual_seed(1)
    a, b, w = torch.randn(2, 5, 3), torch.randn(2, 4, 3), torch.randn(2, 5, 4)
    a[0, 0] = b[0, 0]  # a zero distance: its gradient is 0
    leaves = [t.clone().requires_grad_() for t in (a, b)]
    tleaves = [t.to("tpu").requires_grad_() for t in (a, b)]
    ref = torch.cdist(*leaves, p)
    (ref * w).sum().backward()
    with native():
        got = torch.cdist(*tleaves, p)
        (got * w.to("tpu")).sum().backward()
    torch.testing.assert_close(got.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    for g, r in zip(tleaves, leaves):
        torch.testing.assert_close(g.grad.cpu(), r.grad, rtol=1e-5, atol=1e-5)


def test_searchsorted_bucketize_match_cpu() -> None:
    torch.manual_seed(2)
    bd = torch.tensor([1.0, 2.0, 2.0, 3.0, 5.0])
    v = torch.tensor([[0.0, 1.0, 2.0, 2.5], [3.0, 5.0, 6.0, 2.0]])
    s2, v2 = torch.sort(torch.randn(2, 6)).values, torch.randn(2, 3)
    cases = [
        lambda s, x, s2, x2: torch.searchsorted(s, x),
        lambda s, x, s2, x2: torch.searchsorted(s, x, right=True),
        lambda s, x, s2, x2: torch.searchsorted(s, x, side="right", out_int32=True),
        lambda s, x, s2, x2: torch.searchsorted(s, 2.0),
        lambda s, x, s2, x2: torch.searchsorted(s.flip(0), x, sorter=torch.arange(4, -1, -1, device=s.device)),
        lambda s, x, s2, x2: torch.searchsorted(s2, x2),  # batched rows
        lambda s, x, s2, x2: torch.searchsorted(s[:0], x[0, :0], sorter=s[:0].long()),  # empty
        lambda s, x, s2, x2: torch.bucketize(x, s),
        lambda s, x, s2, x2: torch.bucketize(x, s, right=True),
        lambda s, x, s2, x2: torch.bucketize(2.0, s),
        lambda s, x, s2, x2: torch.bucketize(torch.tensor([0, 3, 7], device=s.device),
                                             torch.tensor([1, 3, 5], device=s.device)),
    ]
    for f in cases:
        ref = f(bd, v, s2, v2)
        with native():
            got = f(bd.to("tpu"), v.to("tpu"), s2.to("tpu"), v2.to("tpu")).cpu()
        assert got.dtype == ref.dtype and torch.equal(got, ref)


def test_logcumsumexp_large_values_rounded_once_and_its_gradient() -> None:
    """x = 1e4 (an f32 ulp of 1e-3 there): the result rounds once, as CPU's
    double accumulator does, so the gradient through it (which divides by
    exp(result)) stays as close to float64 as CPU's (op_db's sample)."""
    torch.manual_seed(0)
    x = torch.randn(5, 6) * 3
    x[0, 2] = x[3, 4] = 1e4
    g = torch.randn(5, 6)
    grads = []
    for dev, dt in (("cpu", torch.float64), ("cpu", torch.float32), ("tpu", torch.float32)):
        xi = x.to(dev, dt).clone().requires_grad_()
        with native():
            torch.logcumsumexp(xi, 0).backward(g.to(dev, dt))
        grads.append(xi.grad.cpu().double())
    exact, cpu, tpu = grads
    assert (tpu - exact).abs().max() <= (cpu - exact).abs().max() + 1e-5
    torch.testing.assert_close(tpu, cpu, rtol=1e-5, atol=1e-5)
