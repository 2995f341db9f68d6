"""torch.logcumsumexp and torch.cdist (forward and backward) on tpu vs CPU."""
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
