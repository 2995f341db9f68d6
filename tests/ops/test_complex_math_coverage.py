"""complex64 rules that are right for complex values as written, now native.

atan / atanh / sinh / cosh (CHLO's complex forms), exp2, addcmul,
trace, take, channel_shuffle, reflection / replication padding (stft's
centering), eye, silu, index_fill, and the truth-value ops (logical_*, any, all,
count_nonzero: a complex value is true when either part is nonzero). Each is
compared with CPU with zero CPU fallbacks.
"""
from __future__ import annotations

import pytest
import torch

from no_fallback import native


def _values() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    z = torch.complex(torch.randn(40, generator=g) * 3, torch.randn(40, generator=g) * 3)
    # the real and imaginary axes (branch cuts of asin/acos/atanh/acosh lie on them)
    edges = torch.tensor([0, 1, -1, 1j, -1j, 0.5, -0.5, 2, -2, 2j, -2j, 0.5 + 1e-3j,
                          3 - 0.25j, -4 + 5j, 10 + 10j, -20 - 1j], dtype=torch.complex64)
    # signed zeros pick the side of a branch cut
    signed = torch.complex(torch.tensor([-0.0, -0.0, 2.0, -2.0, 0.0, -0.0]),
                           torch.tensor([2.0, -2.0, -0.0, -0.0, -3.0, 0.5]))
    return torch.cat([z.to(torch.complex64), edges, signed])


UNARY = ["atan", "sinh", "cosh", "atanh", "exp2"]


@pytest.mark.parametrize("name", ["asin", "acos", "asinh", "acosh"])
def test_inverse_functions_with_signed_zero_cuts_stay_equal_to_cpu(name: str) -> None:
    # CHLO's complex forms of these ignore the sign of a zero on the branch cut; the rules of
    # lowering/complex_branch_cuts.cpp set the signs (natively: test_complex_branch_cuts.py).
    z = _values()
    fn = getattr(torch, name)
    torch.testing.assert_close(fn(z.to("tpu")).cpu(), fn(z), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", UNARY)
def test_unary_math_matches_cpu(name: str) -> None:
    z = _values()
    fn = getattr(torch, name)
    with native():
        got = fn(z.to("tpu"))
    assert got.dtype == torch.complex64
    torch.testing.assert_close(got.cpu(), fn(z), rtol=2e-5, atol=2e-5)


def test_addcmul_trace_take_channel_shuffle_match_cpu() -> None:
    z = _values()[:48]
    m, t1, t2 = z[:36].view(6, 6), z[1:37].view(6, 6), z[2:38].view(6, 6)
    idx = torch.tensor([0, 5, -1, 17, 35])
    x4 = z.view(2, 4, 3, 2)
    tm, tt1, tt2, tz, tx4 = (v.to("tpu") for v in (m, t1, t2, z, x4))
    with native():
        got = [torch.addcmul(tm, tt1, tt2, value=2 - 1j), torch.trace(tm),
               torch.take(tz, idx.to("tpu")), torch.nn.functional.channel_shuffle(tx4, 2)]
    ref = [torch.addcmul(m, t1, t2, value=2 - 1j), torch.trace(m), torch.take(z, idx),
           torch.nn.functional.channel_shuffle(x4, 2)]
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype
        torch.testing.assert_close(g.cpu(), r, rtol=1e-5, atol=1e-5)


def test_truth_values_use_both_parts() -> None:
    a = torch.tensor([0, 1j, 1, 0, 2 + 3j, 1e-30j], dtype=torch.complex64)
    b = torch.tensor([0, 0, 1j, 1, 0, 0], dtype=torch.complex64)
    rows = torch.stack([a, b])
    ta, tb, tr = a.to("tpu"), b.to("tpu"), rows.to("tpu")
    with native():
        got = [torch.logical_and(ta, tb), torch.logical_or(ta, tb), torch.logical_xor(ta, tb),
               torch.logical_not(ta), torch.any(tb), torch.all(ta), torch.all(tr, dim=1),
               torch.any(tr, dim=0), torch.count_nonzero(tr), torch.count_nonzero(tr, dim=1)]
    ref = [torch.logical_and(a, b), torch.logical_or(a, b), torch.logical_xor(a, b),
           torch.logical_not(a), torch.any(b), torch.all(a), torch.all(rows, dim=1),
           torch.any(rows, dim=0), torch.count_nonzero(rows), torch.count_nonzero(rows, dim=1)]
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype
        assert torch.equal(g.cpu(), r), (g, r)


def test_pads_eye_silu_index_fill_match_cpu() -> None:
    z = _values()[:48].reshape(2, 4, 6)
    big = torch.tensor([50, -50 + 1j, 80 - 2j, -1e-3j], dtype=torch.complex64)
    pad = torch.nn.functional.pad
    tz, tbig = z.to("tpu"), big.to("tpu")
    idx = torch.tensor([0, 3])
    with native():
        got = [pad(tz, (2, 3), mode="reflect"), pad(tz, (1, 2), mode="replicate"),
               pad(tz.unsqueeze(0), (1, 1, 2, 0), mode="reflect"),
               pad(tz.unsqueeze(0), (1, 0, 2, 1, 1, 1), mode="replicate"),
               pad(tz.unsqueeze(0), (1, 0, 2, 1, 1, 0), mode="reflect"),
               torch.eye(3, 4, dtype=torch.complex64, device="tpu"),
               torch.nn.functional.silu(tz), torch.nn.functional.silu(tbig),
               tz.index_fill(2, idx.to("tpu"), 2 - 3j)]
    ref = [pad(z, (2, 3), mode="reflect"), pad(z, (1, 2), mode="replicate"),
           pad(z.unsqueeze(0), (1, 1, 2, 0), mode="reflect"),
           pad(z.unsqueeze(0), (1, 0, 2, 1, 1, 1), mode="replicate"),
           pad(z.unsqueeze(0), (1, 0, 2, 1, 1, 0), mode="reflect"),
           torch.eye(3, 4, dtype=torch.complex64), torch.nn.functional.silu(z),
           torch.nn.functional.silu(big), z.index_fill(2, idx, 2 - 3j)]
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        torch.testing.assert_close(g.cpu(), r, rtol=1e-5, atol=1e-5)
