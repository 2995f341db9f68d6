"""Products whose right operand is a transposed weight (nn.Linear's
`x @ W.t()`). On XLA:CPU they are emitted as (W x^T)^T behind an
optimization barrier (csrc/lowering/linalg.cpp: SwappedTransposedDot), so
that Eigen does not repack the whole weight on every call
(benchmarks/linear_shapes.py). Results must equal CPU's for every row count,
dtype, epilogue and view the swap can meet, and through backward.
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
    x, w, b = (torch.randn(*s, generator=g).to(dtype) for s in ((rows, 96), (200, 96), (200,)))
    assert_matches(F.linear(x.to("tpu"), w.to("tpu")), F.linear(x, w), dtype)
    assert_matches(F.linear(x.to("tpu"), w.to("tpu"), b.to("tpu")), F.linear(x, w, b), dtype)


def test_integer_product_with_a_transposed_operand():
    x, w = torch.randint(-50, 50, (5, 33)), torch.randint(-50, 50, (21, 33))
    assert_matches(x.to("tpu") @ w.to("tpu").t(), x @ w.t(), torch.int64)


def test_addmm_epilogue_and_a_3d_input():
    g = torch.Generator().manual_seed(1)
    self_, x, w = torch.randn(4, 40, generator=g), torch.randn(4, 24, generator=g), torch.randn(40, 24, generator=g)
    want = torch.addmm(self_, x, w.t(), beta=0.5, alpha=-2.0)
    got = torch.addmm(self_.to("tpu"), x.to("tpu"), w.to("tpu").t(), beta=0.5, alpha=-2.0)
    assert_matches(got, want, torch.float32)
    x3 = torch.randn(2, 7, 24, generator=g)
    assert_matches(F.linear(x3.to("tpu"), w.to("tpu")), F.linear(x3, w), torch.float32)


def test_views_of_weights():
    g = torch.Generator().manual_seed(2)
    big, x = torch.randn(64, 50, generator=g), torch.randn(6, 20, generator=g)
    w = big[5:45:2, 10:30]  # a strided window, then transposed
    assert_matches(x.to("tpu") @ w.to("tpu").t(), x @ w.t(), torch.float32)
    dev_big = big.to("tpu")
    assert_matches(x.to("tpu") @ dev_big[5:45:2, 10:30].t(), x @ w.t(), torch.float32)


def test_backward_through_linear():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(3, 16, generator=g), torch.randn(10, 16, generator=g)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    F.linear(xc, wc).square().sum().backward()
    F.linear(xt, wt).square().sum().backward()
    assert_matches(xt.grad, xc.grad, torch.float32)
    assert_matches(wt.grad, wc.grad, torch.float32)
