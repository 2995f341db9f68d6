"""linalg.lstsq natively with every LAPACK driver's outputs (CPU's shapes), vs CPU."""
from __future__ import annotations

import pytest
import torch

import torch_tpu


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


# tall (residuals), square batched, wide with a broadcast batch, vector B
SHAPES = [((5, 3), (5, 2)), ((2, 3, 3), (2, 3, 4)), ((2, 2, 4), (1, 2, 3)), ((2, 5, 3), (2, 5))]
# every driver in float32 on all shapes; float64 and complex64 on the QR and
# SVD paths, two shapes each (each shape compiles an SVD and a QR: ~1 s)
CASES = [(torch.float32, d, SHAPES) for d in (None, "gels", "gelsy", "gelss", "gelsd")] + [
    (torch.float64, "gelsd", SHAPES[:2]), (torch.complex64, None, SHAPES[2:]),
    (torch.complex64, "gels", SHAPES[:2]), (torch.complex64, "gelss", SHAPES[::3])]


@pytest.mark.parametrize("dtype,driver,shapes", CASES)
def test_lstsq_matches_cpu_for_every_driver(dtype: torch.dtype, driver: str | None, shapes) -> None:
    torch.manual_seed(0)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype != torch.float64 else dict(rtol=1e-10, atol=1e-12)
    for sa, sb in shapes:
        a, b = torch.randn(sa, dtype=dtype), torch.randn(sb, dtype=dtype)
        before = _fallbacks()
        got = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver)
        assert _fallbacks() == before
        # driver None is gels on tpu, as on CUDA (CPU's default is gelsy)
        want = torch.linalg.lstsq(a, b, driver=driver or "gels")
        for name in ("solution", "residuals", "rank", "singular_values"):
            g, w = getattr(got, name), getattr(want, name)
            assert g.shape == w.shape and g.dtype == w.dtype, (name, sa, sb, g.shape, w.shape)
            torch.testing.assert_close(g.cpu(), w, **tol, msg=lambda m: f"{name} {sa} {sb}: {m}")


def test_rank_deficient_minimum_norm_solution_and_rcond() -> None:
    torch.manual_seed(1)
    a = torch.randn(6, 2, dtype=torch.float64) @ torch.randn(2, 4, dtype=torch.float64)  # rank 2
    b = torch.randn(6, 3, dtype=torch.float64)
    for driver in ("gelsy", "gelss", "gelsd"):
        got = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver)
        want = torch.linalg.lstsq(a, b, driver=driver)
        # (rank-deficient: the SVD's, from eigh, good to ~1e-8 in float64)
        torch.testing.assert_close(got.solution.cpu(), want.solution, rtol=1e-7, atol=1e-8)
        assert got.rank.item() == want.rank.item() == 2
    # an rcond above the second singular value drops it
    s = torch.linalg.svdvals(a)
    rcond = (s[1] / s[0]).item() * 1.01
    got = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), rcond=rcond, driver="gelsd")
    want = torch.linalg.lstsq(a, b, rcond=rcond, driver="gelsd")
    assert got.rank.item() == want.rank.item() == 1
    torch.testing.assert_close(got.solution.cpu(), want.solution, rtol=1e-7, atol=1e-8)


def test_lstsq_gradients() -> None:
    torch.manual_seed(2)
    a, b = torch.randn(2, 5, 3), torch.randn(2, 5, 2)
    at, bt = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    w = torch.randn(2, 3, 2)
    (torch.linalg.lstsq(at, bt).solution * w.to("tpu")).sum().backward()
    (torch.linalg.lstsq(ac, bc).solution * w).sum().backward()
    torch.testing.assert_close(at.grad.cpu(), ac.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bt.grad.cpu(), bc.grad, rtol=1e-4, atol=1e-5)
