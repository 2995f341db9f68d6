"""complex64 asin / acos / asinh / acosh on tpu against CPU, natively.

CHLO's complex forms ignore the sign of a zero on the branch cuts; the rules
(lowering/complex_branch_cuts.cpp) set each part's sign from the functions'
symmetries, so signed zeros pick the side of a cut as CPU's std:: functions.
"""
from __future__ import annotations

import pytest
import torch

from no_fallback import native


def _values() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    z = torch.complex(torch.randn(60, generator=g) * 3, torch.randn(60, generator=g) * 3)
    axes = [0, 1, -1, 1j, -1j, 0.5, -0.5, 2, -2, 2j, -2j, 0.5 + 1e-3j, 3 - 0.25j, -4 + 5j,
            10 + 10j, -20 - 1j, 1e-3 + 1e-3j, -1e-3 - 5j, 50 - 0.5j]
    re = torch.tensor([-0.0, -0.0, 2.0, -2.0, 0.0, -0.0, 0.0, 0.5, -0.5, 0.0, -0.0, 3.0, -3.0])
    im = torch.tensor([2.0, -2.0, -0.0, -0.0, -3.0, 0.5, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0])
    return torch.cat([z, torch.tensor(axes, dtype=torch.complex64), torch.complex(re, im)]).to(torch.complex64)


@pytest.mark.parametrize("name", ["asin", "acos", "asinh", "acosh"])
def test_inverse_functions_match_cpu_on_and_off_the_cuts(name: str) -> None:
    z = _values()
    fn = getattr(torch, name)
    with native():
        got = fn(z.to("tpu"))
    ref = fn(z)
    torch.testing.assert_close(got.cpu(), ref, rtol=2e-5, atol=2e-5)
    # the signs of zero parts too (assert_close treats -0 == 0)
    for part in ("real", "imag"):
        g, r = getattr(got.cpu(), part), getattr(ref, part)
        zero = r == 0
        assert torch.equal(torch.signbit(g[zero]), torch.signbit(r[zero])), (name, part)
        big = r.abs() > 1e-6
        assert torch.equal(torch.signbit(g[big]), torch.signbit(r[big])), (name, part)


@pytest.mark.parametrize("name", ["asin", "acos", "asinh", "acosh"])
def test_inverse_functions_special_values_match_cpu(name: str) -> None:
    # C99's values for infinite and NaN parts (e.g. asinh(nan + 0j) = nan + 0j)
    inf, nan = float("inf"), float("nan")
    parts = [inf, -inf, nan, 0.0, -0.0, 2.0, -2.0, 0.5, 1e30, -1e30]
    z = torch.tensor([complex(a, b) for a in parts for b in parts], dtype=torch.complex64)
    fn = getattr(torch, name)
    with native():
        got = fn(z.to("tpu")).cpu()
    ref = fn(z)
    for part in ("real", "imag"):
        g, r = getattr(got, part), getattr(ref, part)
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5, equal_nan=True)
        zero = r == 0
        assert torch.equal(torch.signbit(g[zero]), torch.signbit(r[zero])), (name, part)
