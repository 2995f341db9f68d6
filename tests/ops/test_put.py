"""put / put_ (Tensor.put_, torch.put) natively, values and gradients vs CPU."""
from __future__ import annotations

import pytest
import torch

import torch_tpu


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.complex64,
                                   torch.bool])
@pytest.mark.parametrize("accumulate", [False, True])
def test_put_matches_cpu(dtype: torch.dtype, accumulate: bool) -> None:
    torch.manual_seed(0)
    x = (torch.randn(3, 4, dtype=torch.complex64 if dtype.is_complex else torch.float32) * 5).to(dtype)
    # repeated indices only with accumulate (CPU keeps an unspecified one otherwise)
    idx = torch.tensor([[0, -1], [5, 11], [7, 0]]) if accumulate else torch.tensor([[0, -1], [5, 7]])
    src = (torch.randn(idx.shape, dtype=x.dtype if dtype.is_complex else torch.float32) * 5).to(dtype)
    before = _fallbacks()
    got = x.to("tpu").put_(idx.to("tpu"), src.to("tpu"), accumulate=accumulate)
    functional = torch.put(x.to("tpu"), idx.to("tpu"), src.to("tpu"), accumulate=accumulate)
    assert _fallbacks() == before
    want = x.clone().put_(idx, src, accumulate=accumulate)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    torch.testing.assert_close(functional.cpu(), want, rtol=0, atol=0)


def test_put_into_a_view_and_gradients() -> None:
    torch.manual_seed(1)
    base = torch.randn(4, 6)
    idx, src = torch.tensor([1, 4, -2]), torch.randn(3)
    bt = base.to("tpu")
    bt[1:3, ::2].put_(idx.to("tpu"), src.to("tpu"))
    base[1:3, ::2].put_(idx, src)
    torch.testing.assert_close(bt.cpu(), base, rtol=0, atol=0)
    x, s = torch.randn(2, 5), torch.randn(4)
    i = torch.tensor([3, 3, 0, 9])
    xt, st = x.to("tpu").requires_grad_(), s.to("tpu").requires_grad_()
    xc, sc = x.clone().requires_grad_(), s.clone().requires_grad_()
    w = torch.randn(2, 5)
    before = _fallbacks()
    (torch.put(xt, i.to("tpu"), st, accumulate=True) * w.to("tpu")).sum().backward()
    assert _fallbacks() == before
    (torch.put(xc, i, sc, accumulate=True) * w).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    torch.testing.assert_close(st.grad.cpu(), sc.grad)


def test_put_errors() -> None:
    x = torch.zeros(2, 2, device="tpu")
    with pytest.raises(IndexError, match="out of range"):
        x.put_(torch.tensor([4], device="tpu"), torch.ones(1, device="tpu")).cpu()
    with pytest.raises(RuntimeError, match="same number of elements"):
        x.put_(torch.tensor([0, 1], device="tpu"), torch.ones(3, device="tpu"))
