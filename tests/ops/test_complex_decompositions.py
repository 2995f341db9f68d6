"""complex64 Cholesky, triangular solves, QR, SVD, eigvalsh and lstsq on tpu
against CPU, natively.

Hermitian A = L L^H (U^H U) on stablehlo.cholesky, the triangle LAPACK's
cpotrf reads (the diagonal's real part), cpotrf's info for matrices that are
not positive definite; linalg.solve_triangular / triangular_solve (transpose
is a plain transpose) / cholesky_solve / cholesky_inverse on
stablehlo.triangular_solve; geqrf / householder_product / qr / ormqr on XLA's
QR expander (LAPACK's cgeqrf convention; ormqr's transpose conjugates);
svd / eigvalsh on XLA's Eigh of Hermitian matrices
(singular vectors compared up to their phases); lstsq by QR (driver gels).
"""
from __future__ import annotations

import torch

from no_fallback import native


def _crandn(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.complex(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g))


def _hpd(*batch: int, n: int = 4, seed: int = 0) -> torch.Tensor:
    a = _crandn(*batch, n, n, seed=seed)
    return a @ a.mH + n * torch.eye(n, dtype=torch.complex64)


def _close(got: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> None:
    assert got.device.type == "tpu" and got.dtype == ref.dtype, (got.dtype, ref.dtype)
    if ref.is_complex() or ref.is_floating_point():
        torch.testing.assert_close(got.cpu(), ref, rtol=tol, atol=tol)
    else:
        assert torch.equal(got.cpu(), ref), (got, ref)


def test_cholesky_lower_upper_and_info() -> None:
    a = _hpd(2, n=5)
    # only the read triangle counts: garbage in the other one and in the imaginary diagonal
    junk = a.clone()
    junk[..., 0, 3] += 7 + 7j
    junk[..., 2, 2] += 5j
    bad = a.clone()
    bad[1, 2, 2] = -50.0  # leading minor 3 of batch 1 not positive definite
    for m in (a, junk):
        tm = m.to("tpu")
        with native():
            lo, up = torch.linalg.cholesky(tm), torch.linalg.cholesky(tm, upper=True)
            old = torch.cholesky(tm)
        _close(lo, torch.linalg.cholesky(m))
        _close(up, torch.linalg.cholesky(m, upper=True))
        _close(old, torch.cholesky(m))
    with native():
        l_bad, info = torch.linalg.cholesky_ex(bad.to("tpu"))
    ref_l, ref_info = torch.linalg.cholesky_ex(bad)
    _close(info, ref_info)
    assert ref_info.tolist() == [0, 3]
    _close(l_bad[0], ref_l[0])


def test_triangular_and_cholesky_solves() -> None:
    a = _hpd(3, n=4, seed=1)
    l = torch.linalg.cholesky(a)
    u = l.mH.contiguous()
    b = _crandn(3, 4, 2, seed=2)
    right = _crandn(3, 2, 4, seed=3)
    cpu = {"a": a, "l": l, "u": u, "b": b, "right": right}
    tpu = {k: v.to("tpu") for k, v in cpu.items()}
    cases = {
        "solve_tri_lower": lambda t: torch.linalg.solve_triangular(t["l"], t["b"], upper=False),
        "solve_tri_upper_right": lambda t: torch.linalg.solve_triangular(
            t["u"], t["right"], upper=True, left=False),
        "solve_tri_unit": lambda t: torch.linalg.solve_triangular(
            t["l"], t["b"], upper=False, unitriangular=True),
        "triangular_solve_T": lambda t: torch.triangular_solve(t["b"], t["u"], upper=True, transpose=True)[0],
        "triangular_solve": lambda t: torch.triangular_solve(t["b"], t["l"], upper=False)[0],
        "cholesky_solve": lambda t: torch.cholesky_solve(t["b"], t["l"]),
        "cholesky_solve_upper": lambda t: torch.cholesky_solve(t["b"], t["u"], upper=True),
        "cholesky_inverse": lambda t: torch.cholesky_inverse(t["l"][0]),
        "cholesky_inverse_upper": lambda t: torch.cholesky_inverse(t["u"][1], upper=True),
    }
    for name, fn in cases.items():
        with native():
            got = fn(tpu)
        _close(got, fn(cpu))


def test_qr_geqrf_householder_ormqr_match_lapack() -> None:
    tall, wide = _crandn(2, 5, 3, seed=4), _crandn(3, 5, seed=5)
    c = _crandn(5, 2, seed=7)
    for name, m in {"tall": tall, "wide": wide}.items():
        tm = m.to("tpu")
        for mode in ("reduced", "complete") if name == "tall" else ("reduced",):
            with native():
                q, r = torch.linalg.qr(tm, mode=mode)
            rq, rr = torch.linalg.qr(m, mode=mode)
            _close(r, rr)
            if mode != "r":
                _close(q, rq)
        with native():
            a, tau = torch.geqrf(tm)
            h = torch.linalg.householder_product(a, tau) if m.shape[-2] >= m.shape[-1] else None
        ra, rtau = torch.geqrf(m)
        _close(a, ra)
        _close(tau, rtau)
        if h is not None:
            _close(h, torch.linalg.householder_product(ra, rtau))
    a, tau = torch.geqrf(tall[0])
    ta, ttau, tc = a.to("tpu"), tau.to("tpu"), c.to("tpu")
    for left, transpose in [(True, True), (False, False)]:
        other, ref_other = (tc, c) if left else (tc.mT.contiguous(), c.mT.contiguous())
        with native():
            got = torch.ormqr(ta, ttau, other, left=left, transpose=transpose)
        _close(got, torch.ormqr(a, tau, ref_other, left=left, transpose=transpose))


def test_svd_eigvalsh_lstsq() -> None:
    m = _crandn(2, 5, 3, seed=8)
    tm = m.to("tpu")
    with native():
        u, s, vh = torch.linalg.svd(tm, full_matrices=False)
    ru, rs, rvh = torch.linalg.svd(m, full_matrices=False)
    _close(s, rs)
    # singular vectors are unique up to a phase per pair: compare moduli and A = U S V^H
    _close(u.abs(), ru.abs())
    _close(vh.abs(), rvh.abs())
    _close((u * s.to(u.dtype).unsqueeze(-2)) @ vh, m)
    _close(u.mH @ u, torch.eye(3, dtype=torch.complex64).expand(2, 3, 3))
    h = _hpd(2, n=5, seed=11)
    with native():
        w = torch.linalg.eigvalsh(h.to("tpu"))
    _close(w, torch.linalg.eigvalsh(h))
    for a, b in [(m, _crandn(2, 5, 2, seed=12))]:
        with native():
            got = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"))
        ref = torch.linalg.lstsq(a, b, driver="gels")
        _close(got.solution, ref.solution)
        _close(got.residuals, ref.residuals)
