"""i0, i0e, i1, i1e natively: against CPU over both expansions' ranges and
their switch point, special values, 0-d / 1-element inputs, and backward."""
import pytest
import torch
from no_fallback import native

import torch_tpu  # noqa: F401

FNS = [torch.i0, torch.special.i0e, torch.special.i1, torch.special.i1e]
X = torch.cat([torch.linspace(-60, 60, 2401), torch.tensor([0.0, -0.0, 14.99, 15.0, 15.01, -15.01])])


@pytest.mark.parametrize("fn", FNS, ids=lambda f: f.__name__)
def test_bessel_matches_cpu_and_float64(fn):
    with native():
        actual = fn(X.to("tpu")).cpu()
    torch.testing.assert_close(actual, fn(X), rtol=2e-6, atol=0)
    exact = fn(X.double())
    assert ((actual.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max() < 1e-6


@pytest.mark.parametrize("fn", FNS, ids=lambda f: f.__name__)
def test_bessel_special_values_small_shapes_bf16(fn):
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 89.5, -89.5])
    with native():
        got = fn(specials.to("tpu")).cpu()
        one, zero_d = fn(torch.tensor([3.0], device="tpu")).cpu(), fn(torch.tensor(14.0, device="tpu")).cpu()
        half = fn(X.bfloat16().to("tpu")).cpu()
    cpu = fn(specials)
    finite = cpu.isfinite()  # past ~88.7 CPU's i0/i1 overflow, the tpu's are still finite
    torch.testing.assert_close(got[~finite & ~cpu.isinf()], cpu[~finite & ~cpu.isinf()], equal_nan=True)
    torch.testing.assert_close(got[:3], cpu[:3], equal_nan=True)
    torch.testing.assert_close(got, fn(specials.double()).float(), equal_nan=True, rtol=2e-6, atol=0)
    torch.testing.assert_close(one, fn(torch.tensor([3.0])))
    torch.testing.assert_close(zero_d, fn(torch.tensor(14.0)))
    torch.testing.assert_close(half, fn(X.bfloat16()), rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("fn", FNS, ids=lambda f: f.__name__)
def test_bessel_backward(fn):
    x = torch.linspace(-20, 20, 81)
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    fn(xc).sum().backward()
    with native():
        fn(xt).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=2e-5, atol=1e-6)


def test_bessel_out_and_inplace_and_float64_fallback():
    x = torch.linspace(-5, 5, 11)
    with native():
        out = torch.empty(11, device="tpu")
        torch.special.i1e(x.to("tpu"), out=out)
        y = x.to("tpu")
        y.i0_()
    torch.testing.assert_close(out.cpu(), torch.special.i1e(x))
    torch.testing.assert_close(y.cpu(), torch.i0(x))
    torch.testing.assert_close(torch.i0(x.double().to("tpu")).cpu(), torch.i0(x.double()))  # CPU kernel
