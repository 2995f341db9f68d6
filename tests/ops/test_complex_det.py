"""complex64 LU, det / slogdet / logdet on tpu against CPU, natively.

linalg_lu_factor_ex has a complex rule (the real elimination; pivots by
|re| + |im| as LAPACK's cgetrf), and det / slogdet (aten/linalg_det.cpp)
compose it with native diagonal products, sgn, abs and log. Before, these
ops raised "Expected a floating point tensor".
"""
from __future__ import annotations

import torch

from no_fallback import native


def _crandn(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.complex64, generator=g)


def _close(got: object, ref: object, name: str) -> None:
    gs = got if isinstance(got, tuple) else (got,)
    rs = ref if isinstance(ref, tuple) else (ref,)
    for g, r in zip(gs, rs):
        assert g.device.type == "tpu" and g.dtype == r.dtype, (name, g.dtype, r.dtype)
        if r.is_floating_point() or r.is_complex():
            torch.testing.assert_close(g.cpu(), r, rtol=1e-4, atol=1e-4)
        else:
            assert torch.equal(g.cpu(), r), (name, g, r)


def test_complex_det_slogdet_logdet_match_cpu() -> None:
    a = _crandn(2, 4, 4)
    nc = _crandn(3, 3, seed=1).mT  # not contiguous: ATen factors A itself
    t, tnc = a.to("tpu"), nc.to("tpu")
    with native():
        got = {"det": torch.linalg.det(t), "det_nc": torch.linalg.det(tnc),
               "slogdet": torch.linalg.slogdet(t), "logdet": torch.logdet(t)}
    ref = {"det": torch.linalg.det(a), "det_nc": torch.linalg.det(nc),
           "slogdet": torch.linalg.slogdet(a), "logdet": torch.logdet(a)}
    for name in ref:
        _close(got[name], ref[name], name)


def test_complex_lu_factor_matches_cpu_pivots_and_info() -> None:
    square = _crandn(3, 5, 5, seed=2)
    wide, tall = _crandn(3, 5, seed=3), _crandn(5, 3, seed=4)
    singular = square[0].clone()
    singular[:, 2] = 0  # a zero column: info = 3
    # pivots by |re| + |im|: row 1 (2+2j: |re|+|im| = 4, |.| = 2.83) beats row 0 (3: both 3)
    pick = torch.tensor([[3.0 + 0j, 2], [2.0 + 2.0j, 1]], dtype=torch.complex64)
    for name, m in {"square": square, "wide": wide, "tall": tall, "singular": singular,
                    "pick": pick}.items():
        tm = m.to("tpu")
        with native():
            got = torch.linalg.lu_factor_ex(tm)
        _close(tuple(got), tuple(torch.linalg.lu_factor_ex(m)), name)


def test_complex_lu_solve_inv_lu_unpack_match_cpu() -> None:
    a = _crandn(2, 4, 4, seed=5) + 2 * torch.eye(4)
    b, br = _crandn(2, 4, 3, seed=6), _crandn(2, 3, 4, seed=7)
    lu, piv = torch.linalg.lu_factor(a)
    tlu, tpiv, tb, tbr, ta = (x.to("tpu") for x in (lu, piv, b, br, a))
    with native():
        got = {f"solve{left}{adj}": torch.linalg.lu_solve(tlu, tpiv, tb if left else tbr,
                                                          left=left, adjoint=adj)
               for left in (True, False) for adj in (False, True)}
        got.update(inv=torch.linalg.inv(ta), solve=torch.linalg.solve(ta, tb),
                   lu=tuple(torch.linalg.lu(ta)), unpack=tuple(torch.lu_unpack(tlu, tpiv)))
    ref = {f"solve{left}{adj}": torch.linalg.lu_solve(lu, piv, b if left else br,
                                                      left=left, adjoint=adj)
           for left in (True, False) for adj in (False, True)}
    ref.update(inv=torch.linalg.inv(a), solve=torch.linalg.solve(a, b),
               lu=tuple(torch.linalg.lu(a)), unpack=tuple(torch.lu_unpack(lu, piv)))
    for name in ref:
        _close(got[name], ref[name], name)
