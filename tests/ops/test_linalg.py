"""torch.linalg on tpu against CPU: natively at any size, forward and backward.

The rules (csrc/lowering/linalg_lu.cpp, linalg_decompositions.cpp) lower to
XLA ops and expanders: stablehlo.cholesky, stablehlo.triangular_solve, the
"Qr" / "ProductOfElementaryHouseholderReflectors" / "Eigh" custom calls, and
stablehlo.while loops for LU. Decompositions whose factors are unique only up
to signs (QR, eigh, SVD) are compared through what is unique: |Q|, |R|,
reconstructions, orthogonality, and gradients of sign-invariant losses.
"""
from __future__ import annotations

import pytest
import torch

from no_fallback import native

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _tpu(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.detach().clone().to("tpu") for x in xs]


def _spd(*batch: int, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*batch, n, n, generator=g)
    return a @ a.mT / n + torch.eye(n)


def _close(got: object, ref: object, **tol: float) -> None:
    gs = got if isinstance(got, (tuple, list)) else (got,)
    rs = ref if isinstance(ref, (tuple, list)) else (ref,)
    for g, r in zip(gs, rs):
        torch.testing.assert_close(g.cpu(), r, **(tol or TOL))


# ------------------------------------------------------------------ LU family


def test_lu_family_forward() -> None:
    n = 80  # past the old unrolled limit of 64
    torch.manual_seed(n)
    a, b = torch.randn(2, n, n), torch.randn(2, n, 3)
    ta, tb = _tpu(a, b)
    with native():
        got = {
            "solve": torch.linalg.solve(ta, tb),
            "inv": torch.linalg.inv(ta),
            "slogdet": torch.linalg.slogdet(ta),
            "lu_factor": torch.linalg.lu_factor(ta),
        }
    _close(got["solve"], torch.linalg.solve(a, b), rtol=1e-3, atol=1e-3)
    _close(got["inv"], torch.linalg.inv(a), rtol=1e-3, atol=1e-3)
    _close(got["slogdet"], torch.linalg.slogdet(a))
    _close(got["lu_factor"], torch.linalg.lu_factor(a), rtol=1e-3, atol=1e-3)


def test_lu_rectangular_unpack_det_and_singular() -> None:
    torch.manual_seed(1)
    for shape in ((5, 3), (3, 5)):
        a = torch.randn(2, *shape)
        with native():
            got = torch.linalg.lu(*_tpu(a))
        _close(got, torch.linalg.lu(a))
    a = torch.randn(4, 4)
    lu, piv = torch.linalg.lu_factor(a)
    with native():
        unpacked = torch.lu_unpack(*_tpu(lu, piv))
        det = torch.linalg.det(*_tpu(a))
        solved = torch.linalg.lu_solve(*_tpu(lu, piv, a), adjoint=True, left=False)
    _close(unpacked, torch.lu_unpack(lu, piv))
    _close(det, torch.linalg.det(a))
    _close(solved, torch.linalg.lu_solve(lu, piv, a, adjoint=True, left=False))
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    with native():
        info = torch.linalg.lu_factor_ex(*_tpu(singular)).info
        d = torch.linalg.det(*_tpu(singular))
    assert info.item() == torch.linalg.lu_factor_ex(singular).info.item() == 2
    assert d.item() == 0.0
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(*_tpu(singular))


def test_float64_solve_is_accurate() -> None:
    torch.manual_seed(2)
    a, b = torch.randn(70, 70, dtype=torch.float64), torch.randn(70, 2, dtype=torch.float64)
    with native():
        x = torch.linalg.solve(*_tpu(a, b))
    torch.testing.assert_close(x.cpu(), torch.linalg.solve(a, b), rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ Cholesky, triangular


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_and_triangular_solves(upper: bool) -> None:
    s = _spd(2, n=20)
    b = torch.randn(2, 20, 3)
    ts, tb = _tpu(s, b)
    with native():
        c = torch.linalg.cholesky(ts, upper=upper)
        x = torch.linalg.solve_triangular(c, tb, upper=upper)
        xr = torch.linalg.solve_triangular(c, tb.mT, upper=upper, left=False)
        cs = torch.cholesky_solve(tb, c, upper=upper)
        ci = torch.cholesky_inverse(c[0], upper=upper)
        ts_old = torch.triangular_solve(tb, c, upper=upper, transpose=True)
    cr = torch.linalg.cholesky(s, upper=upper)
    _close(c, cr)
    _close(x, torch.linalg.solve_triangular(cr, b, upper=upper))
    _close(xr, torch.linalg.solve_triangular(cr, b.mT, upper=upper, left=False))
    _close(cs, torch.cholesky_solve(b, cr, upper=upper))
    _close(ci, torch.cholesky_inverse(cr[0], upper=upper))
    _close(ts_old, torch.triangular_solve(b, cr, upper=upper, transpose=True))


def test_cholesky_not_positive_definite() -> None:
    a = torch.diag(torch.tensor([1.0, -1.0, 2.0]))
    with native():
        info = torch.linalg.cholesky_ex(*_tpu(a)).info
    assert info.item() == torch.linalg.cholesky_ex(a).info.item() == 2
    with pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
        torch.linalg.cholesky(*_tpu(a))


# ------------------------------------------------------------------ QR, eigh, SVD


@pytest.mark.parametrize("shape", [(2, 9, 5), (5, 9)])
def test_qr(shape: tuple) -> None:
    torch.manual_seed(3)
    a = torch.randn(*shape)
    for mode in ("reduced", "complete", "r"):
        with native():
            q, r = torch.linalg.qr(*_tpu(a), mode=mode)
        qr_, rr = torch.linalg.qr(a, mode=mode)
        assert q.shape == qr_.shape and r.shape == rr.shape
        _close(r.abs(), rr.abs())
        if mode != "r":
            # LAPACK's and XLA's Householder QR make the same sign choices.
            _close(q, qr_)
    with native():
        h = torch.geqrf(*_tpu(a))
    _close(h, torch.geqrf(a))
    if shape[-2] >= shape[-1]:
        c = torch.randn(*shape[:-2], shape[-2], 3)
        with native():
            q = torch.linalg.householder_product(*h)
            qc = torch.ormqr(*h, c.to("tpu"), transpose=True)
            cq = torch.ormqr(*h, c.mT.to("tpu"), left=False)
        ref_h = torch.geqrf(a)
        _close(q, torch.linalg.householder_product(*ref_h))
        _close(qc, torch.ormqr(*ref_h, c, transpose=True))
        _close(cq, torch.ormqr(*ref_h, c.mT, left=False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eigh(dtype: torch.dtype) -> None:
    s = _spd(2, n=16).to(dtype)
    s_up = s.triu() + 100 * s.tril(-1)  # UPLO="U" reads only the upper triangle
    with native():
        w, v = torch.linalg.eigh(*_tpu(s))
        wu = torch.linalg.eigvalsh(*_tpu(s_up), UPLO="U")
    f64 = dtype == torch.float64
    tol = {"rtol": 1e-12, "atol": 1e-12} if f64 else {"rtol": 1e-5, "atol": 1e-5}
    _close(w, torch.linalg.eigvalsh(s), **tol)
    _close(wu, torch.linalg.eigvalsh(s_up, UPLO="U"), **tol)
    v = v.cpu()
    _close(v.mT @ v, torch.eye(16, dtype=dtype).expand(2, 16, 16), **tol)
    # XLA's Jacobi eigh stops at an off-diagonal residual near 1e-8 in f64
    # (whatever tolerance its config names): eigenvalues converge
    # quadratically (above), eigenvectors only to that residual.
    vec_tol = {"rtol": 1e-7, "atol": 1e-7} if f64 else tol
    _close(v @ torch.diag_embed(w.cpu()) @ v.mT, s, **vec_tol)


@pytest.mark.parametrize("shape", [(2, 8, 5), (5, 8)], ids=["tall_batched", "wide"])
def test_svd(shape: tuple) -> None:
    torch.manual_seed(4)
    a = torch.randn(*shape)
    k = min(shape[-2:])
    for full in (False, True):
        with native():
            u, s, vh = torch.linalg.svd(*_tpu(a), full_matrices=full)
        ur, sr, vhr = torch.linalg.svd(a, full_matrices=full)
        assert u.shape == ur.shape and vh.shape == vhr.shape
        u, s, vh = u.cpu(), s.cpu(), vh.cpu()
        _close(s, sr)
        _close(u[..., :k].abs(), ur[..., :k].abs())  # unique up to signs (distinct sigmas)
        _close(u[..., :k] @ torch.diag_embed(s) @ vh[..., :k, :], a)
        _close(u.mT @ u, torch.eye(u.shape[-1]).expand_as(u.mT @ u))
        _close(vh @ vh.mT, torch.eye(vh.shape[-2]).expand_as(vh @ vh.mT))
    if len(shape) == 2:
        return
    with native():
        sv = torch.linalg.svdvals(*_tpu(a))
        pinv = torch.linalg.pinv(*_tpu(a))
        norms = [torch.linalg.matrix_norm(*_tpu(a), ord=o) for o in (2, "nuc", -2)]
    _close(sv, torch.linalg.svdvals(a))
    _close(pinv, torch.linalg.pinv(a))
    _close(norms, [torch.linalg.matrix_norm(a, ord=o) for o in (2, "nuc", -2)])


def test_svd_rank_deficient_reconstructs() -> None:
    torch.manual_seed(5)
    a = torch.randn(6, 2) @ torch.randn(2, 4)  # rank 2
    with native():
        u, s, vh = torch.linalg.svd(*_tpu(a), full_matrices=False)
    u, s, vh = u.cpu(), s.cpu(), vh.cpu()
    _close(s, torch.linalg.svdvals(a))
    _close(u @ torch.diag(s) @ vh, a)
    _close(u.mT @ u, torch.eye(4))


def test_lstsq() -> None:
    torch.manual_seed(6)
    for a, b in ((torch.randn(2, 9, 4), torch.randn(2, 9, 3)), (torch.randn(4, 9), torch.randn(4))):
        with native():
            got = torch.linalg.lstsq(*_tpu(a, b))
        ref = torch.linalg.lstsq(a, b, driver="gels")
        _close(got.solution, ref.solution)
        _close(got.residuals, ref.residuals)
    # CPU's other LAPACK drivers: natively by the SVD, with rank and singular values.
    with native():
        got = torch.linalg.lstsq(*_tpu(a, b), driver="gelsd")
    ref = torch.linalg.lstsq(a, b, driver="gelsd")
    _close(got.solution, ref.solution)
    _close(got.singular_values, ref.singular_values)
    assert torch.equal(got.rank.cpu(), ref.rank)


# ------------------------------------------------------------------ backward


def _grads(fn, *xs: torch.Tensor, device: str) -> list[torch.Tensor]:
    leaves = [x.detach().clone().to(device).requires_grad_(True) for x in xs]
    out = fn(*leaves)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    loss = sum((o * torch.linspace(0.5, 1.5, o.numel(), device=device).view_as(o)).sum()
               for o in outs)
    loss.backward()
    return [x.grad.cpu() for x in leaves]


BACKWARD_CASES = {
    "solve": (lambda a, b: torch.linalg.solve(a, b), lambda: (torch.randn(6, 6) + 3 * torch.eye(6), torch.randn(6, 2))),
    "inv": (torch.linalg.inv, lambda: (torch.randn(5, 5) + 3 * torch.eye(5),)),
    "det": (torch.linalg.det, lambda: (torch.randn(2, 4, 4),)),
    "slogdet": (lambda a: torch.linalg.slogdet(a).logabsdet, lambda: (torch.randn(4, 4),)),
    "det_noncontiguous": (lambda a: torch.linalg.det(a.mT), lambda: (torch.randn(3, 3),)),
    "cholesky": (torch.linalg.cholesky, lambda: (_spd(n=5),)),
    "solve_triangular": (lambda a, b: torch.linalg.solve_triangular(a.triu() + 3 * torch.eye(5, device=a.device), b, upper=True),
                         lambda: (torch.randn(5, 5), torch.randn(5, 2))),
    "qr": (lambda a: [x.abs() for x in torch.linalg.qr(a)], lambda: (torch.randn(6, 4),)),
    "eigh": (lambda a: [torch.linalg.eigh(a + a.mT)[0], torch.linalg.eigh(a + a.mT)[1].abs()],
             lambda: (torch.randn(5, 5),)),
    "svd": (lambda a: [torch.linalg.svd(a, full_matrices=False)[1],
                       (torch.linalg.svd(a, full_matrices=False)[0] @ torch.linalg.svd(a, full_matrices=False)[2])],
            lambda: (torch.randn(6, 4),)),
    "pinv": (torch.linalg.pinv, lambda: (torch.randn(5, 3),)),
    "lstsq": (lambda a, b: torch.linalg.lstsq(a, b).solution, lambda: (torch.randn(7, 3), torch.randn(7, 2))),
}


@pytest.mark.parametrize("name", sorted(BACKWARD_CASES))
def test_backward_matches_cpu(name: str) -> None:
    torch.manual_seed(7)
    fn, make = BACKWARD_CASES[name]
    xs = make()
    ref = _grads(fn, *xs, device="cpu")
    with native():
        got = _grads(fn, *xs, device="tpu")
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-3)


def test_integer_input_raises_like_cpu() -> None:
    a = torch.eye(3, dtype=torch.int64)
    with pytest.raises(RuntimeError):
        torch.linalg.inv(a)
    with pytest.raises(RuntimeError):
        torch.linalg.inv(a.to("tpu"))
