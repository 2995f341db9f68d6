"""complex64 reductions on tpu against CPU, natively.

var / std / var_mean / std_mean are var(re) + var(im) (ATen's std_var_out
splits the parts the same way), logsumexp shifts by the max real part and
wraps the phase through the complex log as CPU, the norm overloads
(torch.norm, dist, pairwise_distance) reduce the moduli, vdot conjugates its
first argument, renorm scales slices by a real factor; logaddexp and
logcumsumexp use CPU's log-add-exp helper term by term.
"""
from __future__ import annotations

import torch

from no_fallback import native


def _crandn(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.complex(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)) * scale


def _close(got: torch.Tensor, ref: torch.Tensor, tol: float = 2e-5) -> None:
    assert got.device.type == "tpu" and got.dtype == ref.dtype, (got.dtype, ref.dtype)
    torch.testing.assert_close(got.cpu(), ref, rtol=tol, atol=tol)


def test_var_std_and_their_means_split_the_parts() -> None:
    x = _crandn(4, 5, 6)
    t = x.to("tpu")
    cases = [
        lambda v: torch.var(v), lambda v: torch.var(v, dim=1, correction=0),
        lambda v: torch.std(v, dim=(0, 2), keepdim=True), lambda v: torch.std(v, unbiased=False),
        lambda v: torch.var_mean(v, dim=-1), lambda v: torch.std_mean(v, dim=0, correction=2),
    ]
    for fn in cases:
        with native():
            got = fn(t)
        ref = fn(x)
        for g, r in zip(got if isinstance(got, tuple) else (got,),
                        ref if isinstance(ref, tuple) else (ref,)):
            _close(g, r)
    assert torch.var(t).dtype == torch.float32 and torch.var_mean(t)[1].dtype == torch.complex64


def test_logsumexp_wraps_the_phase_and_survives_large_real_parts() -> None:
    x = _crandn(3, 7, scale=4.0)
    x[0, 0] = complex(80.0, 2.0)   # exp would overflow without the shift
    x[1, 2] = complex(-float("inf"), 0.0)
    for dims, keep in [((1,), False), ((0, 1), True), ((0,), False)]:
        with native():
            got = torch.logsumexp(x.to("tpu"), dim=dims, keepdim=keep)
        _close(got, torch.logsumexp(x, dim=dims, keepdim=keep), tol=1e-4)
    z = torch.tensor(complex(0.5, 7.0), dtype=torch.complex64)  # 0-d: log(exp(z)) wraps 7 rad
    with native():
        got = torch.logsumexp(z.to("tpu"), dim=0)
    _close(got, torch.logsumexp(z, dim=0))


def test_norm_overloads_dist_pairwise_vdot_renorm() -> None:
    x, y = _crandn(4, 6, seed=1), _crandn(4, 6, seed=2)
    tx, ty = x.to("tpu"), y.to("tpu")
    cases = {
        "norm": lambda a, b: torch.norm(a), "norm_p1_dim": lambda a, b: torch.norm(a, p=1, dim=1),
        "norm_inf": lambda a, b: torch.norm(a, p=float("inf"), dim=0, keepdim=True),
        "dist": lambda a, b: torch.dist(a, b, p=3),
        "pairwise": lambda a, b: torch.nn.functional.pairwise_distance(a, b),
        "vdot": lambda a, b: torch.vdot(a[0], b[1]),
        "vecdot": lambda a, b: torch.linalg.vecdot(a, b),
        "renorm": lambda a, b: torch.renorm(a, p=2, dim=0, maxnorm=2.0),
    }
    for name, fn in cases.items():
        with native():
            got = fn(tx, ty)
        _close(got, fn(x, y), tol=3e-5)


def test_logaddexp_and_logcumsumexp_follow_cpus_helper() -> None:
    # the phase is not wrapped (log1p(exp(min - max)) + max), infinities and NaNs as CPU
    x, y = _crandn(6, 5, seed=3, scale=3.0), _crandn(6, 5, seed=4, scale=3.0)
    inf, nan = float("inf"), float("nan")
    x[0, :] = torch.tensor([complex(-inf, 1), complex(inf, 2), complex(nan, 0), complex(1, 3.1), 4j])
    y[0, :] = torch.tensor([complex(-inf, 2), complex(inf, -1), complex(1, 1), complex(1, 3.1), 0j])
    with native():
        got = torch.logaddexp(x.to("tpu"), y.to("tpu"))
        scan0 = torch.logcumsumexp(x[1:].to("tpu"), dim=0)
        scan1 = torch.logcumsumexp(y.to("tpu"), dim=-1)
    ref = torch.logaddexp(x, y)
    torch.testing.assert_close(got.cpu(), ref, rtol=2e-5, atol=2e-5, equal_nan=True)
    _close(scan0, torch.logcumsumexp(x[1:], dim=0), tol=1e-4)
    _close(scan1, torch.logcumsumexp(y, dim=-1), tol=1e-4)
