"""hardshrink, softshrink, threshold and the pointwise losses (csrc/lowering/shrink_losses.cpp):
natively, equal to CPU."""
import pytest
import torch
import torch.nn.functional as F

from no_fallback import native


def _pair(dtype, shape=(4, 6)):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * 2
    x[0, 0] = float("nan")
    return x.to(dtype), (torch.randn(*shape, generator=g) * 2).to(dtype)


def _check(fn, *args, dtype=torch.float32):
    tpu_args = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
    with native():
        got = fn(*tpu_args).cpu()
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got, fn(*args), equal_nan=True, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shrinks_and_threshold(dtype):
    x, _ = _pair(dtype)
    _check(lambda t: F.hardshrink(t, 0.7), x, dtype=dtype)
    _check(lambda t: F.softshrink(t, 0.7), x, dtype=dtype)
    _check(lambda t: F.threshold(t, 0.3, -2.0), x, dtype=dtype)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_losses(reduction, dtype):
    x, y = _pair(dtype)
    x[0, 0] = 0.5
    _check(lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=0.8), x, y, dtype=dtype)
    _check(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.5), x, y, dtype=dtype)
    _check(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.0), x, y, dtype=dtype)
    p, t = torch.sigmoid(x.float()).to(dtype), torch.rand(4, 6).to(dtype)
    p[1, 1], p[2, 2] = 0.0, 1.0  # log clamped at -100
    w = torch.rand(6).to(dtype)
    _check(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), p, t, dtype=dtype)
    _check(lambda a, b, c: F.binary_cross_entropy(a, b, c, reduction=reduction), p, t, w, dtype=dtype)
