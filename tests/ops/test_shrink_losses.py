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


def _check_grad(fn, x, *rest, dtype=torch.float32):
    """The gradient of fn(x, *rest) by x (a cotangent of ones scaled by 0.5), on tpu natively
    against CPU."""
    def grad(x, *rest):
        x = x.detach().requires_grad_()
        y = fn(x, *rest)
        return torch.autograd.grad(y, x, torch.full_like(y, 0.5))[0]

    with native():
        got = grad(x.to("tpu"), *[r.to("tpu") for r in rest]).cpu()
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got, grad(x, *rest), equal_nan=True, **tol)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_losses_backward(reduction, dtype):
    # huber_loss_backward, smooth_l1_loss_backward and binary_cross_entropy_backward
    # run natively (they fell back to the CPU before): at, inside and outside delta /
    # beta, beta 0 (the sign), and BCE's clamped denominator at p = 0 and 1, with a weight.
    x, y = _pair(dtype)
    x[0, 0], x[0, 1], y[0, 1] = 0.5, 1.0, 0.2  # x - y = 0.8 = delta: the clamp's edge
    _check_grad(lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=0.8), x, y, dtype=dtype)
    _check_grad(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.5), x, y, dtype=dtype)
    _check_grad(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.0), x, y, dtype=dtype)
    p, t = torch.sigmoid(x.float()).to(dtype), torch.rand(4, 6).to(dtype)
    p[1, 1], p[2, 2] = 0.0, 1.0
    w = torch.rand(6).to(dtype)
    _check_grad(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), p, t, dtype=dtype)
    _check_grad(lambda a, b, c: F.binary_cross_entropy(a, b, c, reduction=reduction), p, t, w, dtype=dtype)
