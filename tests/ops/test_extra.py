"""index_copy, isin, round.decimals, scatter_reduce.two and multinomial on
tpu against CPU (multinomial: statistics, reproducibility, distinctness).
Every check asserts that the tpu run used no CPU fallback.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch_tpu
from torch.utils import _pytree as pytree

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
    torch.int64: {"rtol": 0, "atol": 0},
    torch.int32: {"rtol": 0, "atol": 0},
}


def _to(device: str) -> Callable[[Any], Any]:
    return lambda x: x.to(device) if isinstance(x, torch.Tensor) else x


def _fallbacks() -> dict[str, int]:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def check(fn: Callable[..., Any], *args: Any, tol: dict | None = None) -> Any:
    """fn(*args) on CPU and on tpu: same result (dtype included), no fallback."""
    expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    targs = pytree.tree_map(_to("tpu"), args)
    before = _fallbacks()
    actual = fn(*targs)
    actual_cpu = pytree.tree_map(_to("cpu"), actual)
    fell_back = {k for k, v in _fallbacks().items() if v != before.get(k, 0)}
    torch.testing.assert_close(actual_cpu, expected, equal_nan=True, **(tol or {}))
    assert not fell_back, f"ran through the CPU fallback: {sorted(fell_back)}"
    return actual


def make(shape, dtype, lo=-5, hi=5):
    if dtype.is_floating_point:
        return torch.randn(shape).mul(3).to(dtype)
    return torch.randint(lo, hi, shape, dtype=dtype)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------- index_copy

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_copy(dtype, dim):
    x = make((4, 5, 6), dtype)
    size = x.shape[dim]
    idx = torch.randperm(size)[:3]
    src_shape = list(x.shape)
    src_shape[dim] = 3
    src = make(src_shape, dtype)
    check(lambda x, i, s: torch.index_copy(x, dim, i, s), x, idx, src, tol=TOL[dtype])


def test_index_copy_inplace_static_cache():
    # transformers' StaticCache: k_cache.index_copy_(2, cache_position, k)
    cache = torch.zeros(2, 8, 10, 4)
    pos = torch.tensor([3, 4, 5])
    k = torch.randn(2, 8, 3, 4)

    def fn(c, p, s):
        c.index_copy_(2, p, s)
        return c

    check(fn, cache, pos, k)
    # dim 1 of a 4-D tensor, as in the brief
    x = torch.randn(2, 6, 3, 4)
    check(lambda x, i, s: x.index_copy_(1, i, s), x, torch.tensor([5, 0]), torch.randn(2, 2, 3, 4))


def test_index_copy_edge_cases():
    check(lambda x, i, s: x.index_copy(0, i, s), torch.randn(4, 3), torch.tensor([], dtype=torch.long),
          torch.randn(0, 3))
    check(lambda x, i, s: x.index_copy(0, i, s), torch.randn(0, 3), torch.tensor([], dtype=torch.long),
          torch.randn(0, 3))
    check(lambda x, i, s: x.index_copy(0, i, s), torch.tensor(1.0), torch.tensor(0), torch.tensor(5.0))
    check(lambda x, i, s: x.index_copy(0, i, s), torch.tensor([1.0, float("nan"), 3.0]),
          torch.tensor([2]), torch.tensor([float("nan")]))
    # out=
    check(lambda x, i, s, o: torch.index_copy(x, 1, i, s, out=o), torch.randn(3, 4),
          torch.tensor([0, 2]), torch.randn(3, 2), torch.empty(3, 4))


def test_index_copy_out_of_range_raises():
    x = torch.zeros(3, 4, device="tpu")
    with pytest.raises(IndexError):
        x.index_copy_(0, torch.tensor([5], device="tpu"), torch.ones(1, 4, device="tpu"))
        torch_tpu.synchronize() if hasattr(torch_tpu, "synchronize") else x.cpu()


def test_index_copy_backward():
    x = torch.randn(4, 5, requires_grad=True)
    s = torch.randn(2, 5, requires_grad=True)
    idx = torch.tensor([3, 1])
    g = torch.randn(4, 5)
    torch.index_copy(x, 0, idx, s).backward(g)
    xt = x.detach().to("tpu").requires_grad_()
    st = s.detach().to("tpu").requires_grad_()
    torch.index_copy(xt, 0, idx.to("tpu"), st).backward(g.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), x.grad)
    torch.testing.assert_close(st.grad.cpu(), s.grad)


# ---------------------------------------------------------------- isin

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32])
@pytest.mark.parametrize("invert", [False, True])
def test_isin(dtype, invert):
    e = make((5, 7), dtype, 0, 10).round() if dtype.is_floating_point else make((5, 7), dtype, 0, 10)
    t = torch.tensor([0, 1, 3, 3, 7], dtype=dtype)
    check(lambda e, t: torch.isin(e, t, invert=invert), e, t)
    check(lambda e, t: torch.isin(e, t, assume_unique=True, invert=invert), e, torch.tensor([2, 4], dtype=dtype))


def test_isin_scalar_and_edge_cases():
    e = torch.tensor([1.0, 2.0, float("nan"), 4.0])
    check(lambda e: torch.isin(e, 2.0), e)
    check(lambda e: torch.isin(e, 2, invert=True), e)
    check(lambda t: torch.isin(3, t), torch.tensor([1, 3, 5]))
    check(lambda t: torch.isin(4, t, invert=True), torch.tensor([1, 3, 5]))
    check(lambda e, t: torch.isin(e, t), e, torch.tensor([float("nan"), 4.0]))
    check(lambda e, t: torch.isin(e, t), torch.randn(0, 3), torch.randn(4))
    check(lambda e, t: torch.isin(e, t), torch.randn(3), torch.randn(0))
    check(lambda e, t: torch.isin(e, t, invert=True), torch.randn(3), torch.randn(0))
    # mixed dtypes promote
    check(lambda e, t: torch.isin(e, t), torch.tensor([1, 2, 3]), torch.tensor([2.0, 2.5]))


# ---------------------------------------------------------------- round.decimals

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("decimals", [-2, -1, 0, 1, 2, 3])
def test_round_decimals(dtype, decimals):
    x = (torch.randn(64) * 1000).to(dtype)
    x[:4] = torch.tensor([0.125, 2.5, -0.5, float("nan")], dtype=dtype)
    check(lambda x: torch.round(x, decimals=decimals), x, tol={"rtol": 0, "atol": 0})
    check(lambda x: torch.round(x[:0], decimals=decimals), x, tol={"rtol": 0, "atol": 0})


def test_round_decimals_half_even():
    x = torch.tensor([0.25, 0.35, 1.5, 2.5, -2.5, 0.05, 150.0, 250.0, float("inf")])
    check(lambda x: torch.round(x, decimals=1), x, tol={"rtol": 0, "atol": 0})
    check(lambda x: torch.round(x, decimals=-2), x, tol={"rtol": 0, "atol": 0})
    check(lambda x: x.round_(decimals=1), x, tol={"rtol": 0, "atol": 0})


# ---------------------------------------------------------------- scatter_reduce

REDUCES = ["sum", "prod", "mean", "amax", "amin"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(dtype, reduce, include_self):
    x = make((5, 6), dtype, -5, 6)
    src = make((7, 6), dtype, -3, 4) if reduce != "prod" else make((7, 6), dtype, 1, 3)
    if reduce == "prod" and dtype.is_floating_point:
        src = torch.rand(7, 6).add(0.5).to(dtype)
    idx = torch.randint(0, 5, (7, 6))
    tol = TOL[dtype]
    if dtype == torch.bfloat16:
        tol = {"rtol": 3e-2, "atol": 3e-2}
    check(lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=include_self), x, idx, src, tol=tol)
    # dim 1, smaller index than src
    idx1 = torch.randint(0, 6, (5, 3))
    check(lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self),
          x, idx1, src[:5], tol=tol)


def test_scatter_reduce_inplace_nan_empty():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    src = torch.tensor([float("nan"), 5.0, -1.0])
    idx = torch.tensor([0, 1, 1])
    for r in REDUCES:
        check(lambda x, i, s: x.scatter_reduce_(0, i, s, r), x, idx, src)
    check(lambda x, i, s: x.scatter_reduce(0, i, s, "sum"), x, torch.tensor([], dtype=torch.long),
          torch.tensor([]))
    # include_self=False: untouched positions keep self
    check(lambda x, i, s: x.scatter_reduce(0, i, s, "mean", include_self=False),
          x, torch.tensor([0, 0, 2, 2]), torch.tensor([1.0, 2.0, 3.0, 5.0]))
    check(lambda x, i, s: x.scatter_reduce(0, i, s, "amin", include_self=False),
          torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([0, 2]), torch.tensor([7.0, float("nan")]))


def test_scatter_reduce_backward():
    x = torch.randn(5, 4, requires_grad=True)
    s = torch.randn(6, 4, requires_grad=True)
    idx = torch.randint(0, 5, (6, 4))
    g = torch.randn(5, 4)
    x.scatter_reduce(0, idx, s, "sum").backward(g)
    xt = x.detach().to("tpu").requires_grad_()
    st = s.detach().to("tpu").requires_grad_()
    xt.scatter_reduce(0, idx.to("tpu"), st, "sum").backward(g.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), x.grad)
    torch.testing.assert_close(st.grad.cpu(), s.grad)


# ---------------------------------------------------------------- multinomial

def _native_multinomial(fn):
    before = _fallbacks()
    out = fn()
    out_cpu = out.cpu()
    fell_back = {k for k, v in _fallbacks().items() if v != before.get(k, 0)}
    assert not fell_back, f"ran through the CPU fallback: {sorted(fell_back)}"
    return out_cpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multinomial_replacement_frequencies(dtype):
    p = torch.tensor([0.1, 0.0, 0.2, 0.3, 0.4, 0.0]).to(dtype)
    pt = (p * 7).to("tpu")  # unnormalized weights
    n = 20000
    s = _native_multinomial(lambda: torch.multinomial(pt, n, replacement=True))
    assert s.dtype == torch.int64 and s.shape == (n,)
    freq = torch.bincount(s, minlength=6).float() / n
    assert freq[1] == 0 and freq[5] == 0
    torch.testing.assert_close(freq, p.float(), atol=0.015, rtol=0)


def test_multinomial_batched_and_reproducible():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.1, 0.9]], device="tpu")
    torch.manual_seed(123)
    a = _native_multinomial(lambda: torch.multinomial(p, 5000, replacement=True))
    torch.manual_seed(123)
    b = _native_multinomial(lambda: torch.multinomial(p, 5000, replacement=True))
    c = _native_multinomial(lambda: torch.multinomial(p, 5000, replacement=True))
    assert torch.equal(a, b)
    assert not torch.equal(b, c)
    assert a.shape == (2, 5000)
    assert (a[0] != 2).all() and (a[1] != 0).all()
    f1 = (a[1] == 2).float().mean().item()
    assert abs(f1 - 0.9) < 0.03
    g = torch.Generator(device="tpu").manual_seed(7) if _has_tpu_generator() else None
    if g is not None:
        x = _native_multinomial(lambda: torch.multinomial(p, 10, True, generator=g))
        g.manual_seed(7)
        y = _native_multinomial(lambda: torch.multinomial(p, 10, True, generator=g))
        assert torch.equal(x, y)


def _has_tpu_generator() -> bool:
    try:
        torch.Generator(device="tpu")
        return True
    except Exception:
        return False


def test_multinomial_without_replacement():
    p = torch.tensor([[1.0, 2.0, 3.0, 0.0, 4.0], [5.0, 1.0, 1.0, 1.0, 1.0]], device="tpu")
    for _ in range(5):
        s = _native_multinomial(lambda: torch.multinomial(p, 4))
        assert s.shape == (2, 4)
        for row in s:
            assert len(set(row.tolist())) == 4
        assert (s[0] != 3).all()
    # all non-zero categories: a permutation of them
    s = _native_multinomial(lambda: torch.multinomial(p[0], 4))
    assert sorted(s.tolist()) == [0, 1, 2, 4]
    # first-draw frequencies follow p
    q = torch.tensor([0.1, 0.2, 0.7], device="tpu")
    firsts = _native_multinomial(lambda: torch.multinomial(q.expand(4000, 3).contiguous(), 1))
    freq = torch.bincount(firsts.flatten(), minlength=3).float() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.7]), atol=0.03, rtol=0)
    torch.manual_seed(5)
    a = _native_multinomial(lambda: torch.multinomial(p, 3))
    torch.manual_seed(5)
    b = _native_multinomial(lambda: torch.multinomial(p, 3))
    assert torch.equal(a, b)


def test_multinomial_empty():
    p = torch.tensor([0.2, 0.8], device="tpu")
    s = _native_multinomial(lambda: torch.multinomial(p, 0, replacement=True))
    assert s.shape == (0,) and s.dtype == torch.int64


def test_multinomial_invalid():
    p = torch.tensor([1.0, 0.0, 0.0], device="tpu")
    with pytest.raises((IndexError, RuntimeError)):
        torch.multinomial(p, 2).cpu()  # not enough non-zero categories
    with pytest.raises(RuntimeError):
        torch.multinomial(p, 4)  # more samples than categories
    with pytest.raises((IndexError, RuntimeError)):
        torch.multinomial(torch.tensor([1.0, -1.0], device="tpu"), 3, True).cpu()
