"""complex64 abs / sgn / exp / log / log2 / log10 / sqrt with C99's special
values, as CPU's std:: functions, natively.

StableHLO's complex forms give NaN where C99 has infinities (exp(-inf + inf i)
= 0, log(nan + inf i) = inf + nan i), ignore the sign of a zero on sqrt's
cut (sqrt(-2 - 0i) = -1.414i) and XLA:CPU's abs(x + nan i) is finite; the
rules of lowering/complex_special_values.cpp set C99's values. logsumexp,
logaddexp, logcumsumexp and the norms of complex values use them too.
"""
from __future__ import annotations

import pytest
import torch

from no_fallback import native

INF, NAN = float("inf"), float("nan")
PARTS = [INF, -INF, NAN, 0.0, -0.0, 1.5, -2.0]


def _grid() -> torch.Tensor:
    return torch.tensor([complex(a, b) for a in PARTS for b in PARTS], dtype=torch.complex64)


def _same(got: torch.Tensor, ref: torch.Tensor) -> None:
    got, ref = got.cpu(), ref
    if not ref.is_complex():
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5, equal_nan=True)
        return
    for part in ("real", "imag"):
        torch.testing.assert_close(getattr(got, part), getattr(ref, part), rtol=1e-5, atol=1e-5,
                                   equal_nan=True)


@pytest.mark.parametrize("name", ["abs", "sgn", "exp", "log", "log2", "log10", "sqrt"])
def test_unary_special_values_match_cpu(name: str) -> None:
    z = _grid()
    fn = getattr(torch, name)
    with native():
        got = fn(z.to("tpu"))
    ref = fn(z)
    _same(got, ref)
    if name == "sqrt":  # the sign of the imaginary part follows im(z), -0 included
        finite = ref.imag.abs() > 0
        assert torch.equal(torch.signbit(got.cpu().imag[finite]), torch.signbit(ref.imag[finite]))


def test_reductions_of_non_finite_values_match_cpu() -> None:
    z = _grid()[: 5 * 7].reshape(5, 7)
    cases = {
        "logsumexp": lambda t: torch.logsumexp(t, 1),
        "logaddexp": lambda t: torch.logaddexp(t, t.flip(1)),
        "logcumsumexp": lambda t: torch.logcumsumexp(t, 1),
        "norm": lambda t: torch.linalg.vector_norm(t, dim=1),
        "norm1": lambda t: torch.norm(t, p=1, dim=0),
    }
    for name, fn in cases.items():
        with native():
            got = fn(z.to("tpu"))
        _same(got, fn(z))
