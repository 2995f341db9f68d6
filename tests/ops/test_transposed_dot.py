"""Products whose right operand is a transposed weight (nn.Linear's
`x @ W.t()`). On XLA:CPU they are emitted as (W x^T)^T behind an
optimization barrier (csrc/lowering/linalg.cpp: SwappedTransposedDot), so
that Eigen does not repack the whole weight on every call
(benchmarks/linear_shapes.py); float32 weights of at least 65536 elements,
more than one row. Results must equal CPU's for every row count, dtype,
epilogue and view the swap can meet (or refuses), and through backward.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1.6e-2, 1e-1), torch.float16: (1e-3, 5e-2)}


def assert_matches(got, want, dtype):
    if dtype.is_floating_point:
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(got.cpu(), want, rtol=rtol, atol=atol)
    else:
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 34])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_equals_cpu(rows, dtype):
    g = torch.Generator().manual_seed(rows)
    x, w, b = (torch.randn(*s, generator=g).to(dtype) for s in ((rows, 256), (300, 256), (300,)))
    assert_matches(F.linear(x.to("tpu"), w.to("tpu")), F.linear(x, w), dtype)
    assert_matches(F.linear(x.to("tpu"), w.to("tpu"), b.to("tpu")), F.linear(x, w, b), dtype)


def test_integer_product_with_a_transposed_operand():
    x, w = torch.randint(-50, 50, (5, 33)), torch.randint(-50, 50, (21, 33))
    assert_matches(x.to("tpu") @ w.to("tpu").t(), x @ w.t(), torch.int64)


def test_addmm_epilogue_and_a_3d_input():
    g = torch.Generator().manual_seed(1)
    self_, x, w = torch.randn(4, 320, generator=g), torch.randn(4, 224, generator=g), torch.randn(320, 224, generator=g)
    want = torch.addmm(self_, x, w.t(), beta=0.5, alpha=-2.0)
    got = torch.addmm(self_.to("tpu"), x.to("tpu"), w.to("tpu").t(), beta=0.5, alpha=-2.0)
    assert_matches(got, want, torch.float32)
    x3 = torch.randn(2, 7, 224, generator=g)
    assert_matches(F.linear(x3.to("tpu"), w.to("tpu")), F.linear(x3, w), torch.float32)


def test_views_of_weights():
    g = torch.Generator().manual_seed(2)
    big, x = torch.randn(700, 300, generator=g), torch.randn(6, 256, generator=g)
    w = big[5:605:2, 10:266]  # a strided [300, 256] window, then transposed
    assert_matches(x.to("tpu") @ w.to("tpu").t(), x @ w.t(), torch.float32)
    dev_big = big.to("tpu")
    assert_matches(x.to("tpu") @ dev_big[5:605:2, 10:266].t(), x @ w.t(), torch.float32)


def test_backward_through_linear():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(3, 256, generator=g), torch.randn(300, 256, generator=g)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    F.linear(xc, wc).square().sum().backward()
    F.linear(xt, wt).square().sum().backward()
    # Gradients of a square-sum are sums of 300 products of magnitude ~10:
    # float32 rounding differs from CPU's order by up to ~1e-4 relative.
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=2e-4, atol=2e-3)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=2e-4, atol=2e-3)
