"""torch.norm's overloads and renorm (csrc/lowering/norm_overloads.cpp), and the small
compositions (csrc/lowering/small_compositions.cpp): natively, equal to CPU."""
import pytest
import torch
import torch.nn.functional as F

from no_fallback import native


def _check(fn, *args, tol=1e-5):
    tpu_args = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
    with native():
        got = fn(*tpu_args)
        got = tuple(g.cpu() for g in got) if isinstance(got, tuple) else got.cpu()
    torch.testing.assert_close(got, fn(*args), rtol=tol, atol=tol, equal_nan=True)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("p", [2, 1, 3.5, float("inf"), -float("inf"), 0])
def test_norm_overloads_and_distances(p):
    x, y = _x(4, 5), _x(4, 5, seed=1)
    _check(lambda t: torch.norm(t, p), x)
    _check(lambda t: torch.norm(t, p, dim=1, keepdim=True), x)
    _check(lambda t: torch.norm(t, p, dim=(0, 1), dtype=torch.float64), x)
    _check(lambda a, b: torch.dist(a, b, p), x, y)
    if p > 0:
        _check(lambda a, b: F.pairwise_distance(a, b, p), x, y)


def test_triplet_margin_loss():
    a, p, n = _x(6, 8), _x(6, 8, seed=1), _x(6, 8, seed=2)
    _check(lambda *t: F.triplet_margin_loss(*t, margin=0.5), a, p, n)


@pytest.mark.parametrize("p,dim", [(2, 0), (1, 1), (3.0, -1)])
def test_renorm(p, dim):
    x = _x(4, 3, 2) * 3
    _check(lambda t: torch.renorm(t, p, dim, 2.0), x)


def test_small_compositions():
    a, b = _x(4, 3, 5), _x(4, 3, 5, seed=1)
    _check(lambda x, y: torch.linalg.cross(x, y, dim=1), a, b)
    _check(lambda x, y: torch.cross(x, y[:1], dim=1), a, b)
    _check(torch.trace, _x(4, 6))
    _check(torch.trace, torch.arange(12).reshape(3, 4))
    z = a.clone()
    z[z.abs() < 0.5] = 0
    _check(torch.count_nonzero, z)
    _check(lambda t: torch.count_nonzero(t, dim=(0, 2)), z)
    _check(torch.count_nonzero, torch.tensor(3.0))
    a[1, 1, 1] = float("nan")
    _check(torch.aminmax, a)
    _check(lambda t: torch.aminmax(t, dim=1, keepdim=True), a)
    _check(lambda t: torch.take(t, torch.tensor([[0, -1], [7, 59]], device=t.device)), a)
    _check(lambda t: F.channel_shuffle(t, 3), _x(2, 6, 4, 3))
    with native():
        got = torch.logspace(-2, 3, 11, base=2.0, device="tpu").cpu()
    torch.testing.assert_close(got, torch.logspace(-2, 3, 11, base=2.0))


def test_take_out_of_range_raises():
    with pytest.raises(IndexError, match="out of range"):
        torch.take(_x(3).to("tpu"), torch.tensor([3], device="tpu")).cpu()
