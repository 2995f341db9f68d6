"""Special functions and NaN-aware binary math (csrc/lowering/special_math.cpp): natively,
equal to CPU, special values (NaN, +-inf, +-0, poles) included."""
import pytest
import torch

from no_fallback import native

SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 2.5, -2.5,
                        1e-3, 30.0, -8.4784])


def _x(dtype, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([SPECIAL, torch.randn(20, generator=g) * 4])
    return (x.abs() if positive else x).to(dtype)


def _check(fn, *args, dtype=torch.float32, rtol=None, atol=None):
    tpu_args = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
    with native():
        got = fn(*tpu_args).cpu()
    want = fn(*args)
    tol = {} if rtol is None else {"rtol": rtol, "atol": atol}
    if dtype == torch.bfloat16 and not tol:
        tol = {"rtol": 1.6e-2, "atol": 1e-2}
    torch.testing.assert_close(got, want, equal_nan=True, **tol)


UNARY = [torch.erfc, torch.sinc, torch.special.entr, torch.isposinf, torch.isneginf, torch.signbit]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", UNARY, ids=["erfc", "sinc", "entr", "isposinf", "isneginf", "signbit"])
def test_unary(fn, dtype):
    _check(fn, _x(dtype), dtype=dtype)


def test_ndtri():  # CPU has no bfloat16 kernel
    p = torch.cat([torch.tensor([0.0, 1.0, 0.5, 1e-4, 1 - 1e-4, -0.5, 2.0]), torch.rand(20)])
    _check(torch.special.ndtri, p, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_predicates_on_integers(dtype):
    x = torch.tensor([-3, 0, 2, 1]).to(dtype)
    for fn in (torch.isposinf, torch.isneginf, torch.signbit):
        _check(fn, x, dtype=dtype)


BINARY = {"xlogy": torch.xlogy, "xlog1py": torch.special.xlog1py, "logaddexp": torch.logaddexp,
          "logaddexp2": torch.logaddexp2, "heaviside": torch.heaviside, "fmax": torch.fmax,
          "fmin": torch.fmin, "zeta": torch.special.zeta}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name, dtype):
    x, y = _x(dtype, 0), _x(dtype, 1).flip(0)
    if name == "zeta" and dtype == torch.bfloat16:
        pytest.skip("CPU has no bfloat16 zeta")
    if name == "zeta":
        x = x.nan_to_num(posinf=3.0)  # s = inf: cephes' direct sum of 0 ** -inf terms
    _check(BINARY[name], x, y, dtype=dtype)


def test_binary_scalar_operands_and_ints():
    y = _x(torch.float32, 1)
    _check(torch.xlogy, 2.0, y)
    _check(torch.xlogy, y, 3.0)
    _check(torch.special.xlog1py, 0.0, y)
    a, b = torch.tensor([1, -5, 7]), torch.tensor([3, -9, 7])
    _check(torch.fmax, a, b, dtype=torch.int64)
    _check(torch.fmin, a, b, dtype=torch.int64)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7])
def test_polygamma(n):
    # CPU's float kernel sums zeta's series in double; the rule sums in f32 (Kahan
    # compensated). For n >= 2 at negative x the terms cancel (polygamma(4, -2.5):
    # +-32 terms, result 0.068): measured 1.7e-4 relative off there, ~1e-7 elsewhere.
    _check(lambda x: torch.polygamma(n, x), _x(torch.float32), rtol=3e-4, atol=1e-5)
