"""Indexing, sorting and data-dependent ops on tpu against CPU.

Covers advanced indexing (x[idx], x[i, j], x[:, idx], x[mask], x[mask] = v,
index_put_ with accumulate), masked_scatter, embedding backward, sort /
argsort / topk / kthvalue / median (NaN, ties, stable), nonzero,
nonzero_static, masked_select, unique and repeat_interleave. Every check
asserts that the tpu run used no CPU fallback.
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
}
DTYPES = [torch.float32, torch.bfloat16]


def _to(device: str) -> Callable[[Any], Any]:
    return lambda x: x.to(device) if isinstance(x, torch.Tensor) else x


def _fallbacks() -> dict[str, int]:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def check(fn: Callable[..., Any], *args: Any, tol: dict | None = None) -> Any:
    """fn(*args) on CPU and on tpu: same result (dtype included), no fallback."""
    expected = fn(*args)
    targs = pytree.tree_map(_to("tpu"), args)
    before = _fallbacks()
    actual = fn(*targs)
    actual_cpu = pytree.tree_map(_to("cpu"), actual)
    fell_back = {k for k, v in _fallbacks().items() if v != before.get(k, 0)}
    if isinstance(expected, tuple):
        expected, actual_cpu = tuple(expected), tuple(actual_cpu)
    torch.testing.assert_close(actual_cpu, expected, equal_nan=True, **(tol or {}))
    assert not fell_back, f"ran through the CPU fallback: {sorted(fell_back)}"
    return actual


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# ---------------------------------------------------------------- index


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_forms(dtype: torch.dtype) -> None:
    x = torch.randn(5, 6, 7).to(dtype)
    i = torch.tensor([0, -1, 3, 3])
    j = torch.tensor([[1, 2], [-5, 4]])
    check(lambda x, i: x[i], x, i)
    check(lambda x, i: x[:, i], x, i)
    check(lambda x, i: x[..., i], x, i)
    check(lambda x, i, j: x[i[:2], j[0]], x, i, j)           # two index tensors
    check(lambda x, j: x[j, :, j], x, j)                      # non-adjacent: batch first
    check(lambda x, i, j: x[:, j, i[:2]], x, i, j)            # broadcasting index tensors
    check(lambda x, i: x[1:, i[:2], 2], x, i)                 # int + slice mixed
    check(lambda x, i: x[i.to(torch.int32)], x, i)            # int32 indices
    check(lambda x: x[torch.tensor([], dtype=torch.long)], x)  # empty index


def test_index_cpu_index_tensor() -> None:
    x = torch.randn(6, 3)
    i = torch.tensor([5, 0])
    before = _fallbacks()
    r = x.to("tpu")[i]
    assert torch.equal(r.cpu(), x[i])
    assert _fallbacks() == before


def test_cpu_index_tensors_in_index_put_and_backward() -> None:
    # As on CUDA: index_put_ / x[idx] = v and the backward of x[:, idx] take
    # CPU index tensors with a tpu tensor (they move to its device).
    x = torch.randn(3, 5, 4)
    rows, cols = torch.arange(3), torch.tensor([1, 1, -1])
    v = torch.randn(3, 4)
    before = _fallbacks()
    want = x.clone().index_put_((rows, cols), v, accumulate=True)
    got = x.to("tpu").index_put_((rows, cols), v.to("tpu"), accumulate=True)
    torch.testing.assert_close(got.cpu(), want)
    d = x.to("tpu")
    d[:, torch.tensor([0, 2])] = 7.0
    want = x.clone()
    want[:, torch.tensor([0, 2])] = 7.0
    assert torch.equal(d.cpu(), want)
    leaf, dleaf = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    idx = torch.tensor([0, 2, -1, 2])
    leaf[:, idx].square().sum().backward()
    dleaf[:, idx].square().sum().backward()
    torch.testing.assert_close(dleaf.grad.cpu(), leaf.grad)
    assert _fallbacks() == before


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
def test_bool_mask_index(dtype: torch.dtype) -> None:
    x = torch.randn(4, 5).mul(10).to(dtype)
    m = torch.randn(4, 5) > 0
    check(lambda x, m: x[m], x, m)
    check(lambda x, m: x[m[:, 0]], x, m)
    check(lambda x, m: x[:, m[0]], x, m)
    check(lambda x, m: x[torch.zeros_like(m)], x, m)          # nothing selected
    check(lambda x, m: x[m[0] & False], x.t().contiguous(), m)


def test_bool_mask_cpu_mask() -> None:
    x = torch.randn(4, 5)
    m = x > 0
    before = _fallbacks()
    assert torch.equal(x.to("tpu")[m].cpu(), x[m])
    assert _fallbacks() == before


def test_index_out_of_range_raises() -> None:
    x = torch.randn(4, 3, device="tpu")
    with pytest.raises(IndexError):
        x[torch.tensor([4], device="tpu")].cpu()
    with pytest.raises(IndexError):
        x[torch.tensor([-5], device="tpu")].cpu()
    y = torch.zeros(4, device="tpu")
    with pytest.raises(IndexError):
        y.index_put_((torch.tensor([7], device="tpu"),), torch.tensor(1.0, device="tpu"))
        y.cpu()


@pytest.mark.parametrize("dtype", DTYPES)
def test_setitem(dtype: torch.dtype) -> None:
    x = torch.randn(5, 4).to(dtype)
    m = torch.randn(5, 4) > 0
    i = torch.tensor([0, -1, 2])

    def set_mask_scalar(x, m):
        y = x.clone()
        y[m] = 3.0
        return y

    def set_mask_values(x, m):
        y = x.clone()
        y[m] = torch.arange(int(m.sum()), dtype=x.dtype, device=x.device)
        return y

    def set_rows(x, m):
        y = x.clone()
        y[m[:, 0]] = torch.ones(4, dtype=x.dtype, device=x.device)
        return y

    def set_idx(x, i):
        y = x.clone()
        y[i] = torch.full((3, 4), 2.0, dtype=x.dtype, device=x.device)
        y[i[:2]] = -1.0
        return y

    check(set_mask_scalar, x, m)
    check(set_mask_values, x, m)
    check(set_rows, x, m)
    check(set_idx, x, i)


def test_setitem_after_slice() -> None:
    x = torch.randn(5, 4)
    i = torch.tensor([0, 2])

    def fn(x, i):
        y = x.clone()
        y[:, i] = -1.0
        return y

    check(fn, x, i)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
def test_index_put_accumulate(dtype: torch.dtype) -> None:
    x = torch.randn(6, 3).mul(4).to(dtype)
    i = torch.tensor([0, 2, 0, -1, 2, 0])
    v = torch.randn(6, 3).mul(4).to(dtype)
    check(lambda x, i, v: x.clone().index_put_((i,), v, accumulate=True), x, i, v,
          tol=TOL.get(dtype))
    check(lambda x, i, v: torch.index_put(x, (i,), v[0], accumulate=True), x, i, v,
          tol=TOL.get(dtype))
    j = torch.tensor([1, 1, 0, 2, 1, 1])
    check(lambda x, i, j, v: x.clone().index_put_((i, j), v[:, 0], accumulate=True), x, i, j, v,
          tol=TOL.get(dtype))
    m = torch.tensor([True, False, True, True, False, False])
    check(lambda x, m, v: x.clone().index_put_((m,), v[:3], accumulate=True), x, m, v,
          tol=TOL.get(dtype))
    # Unique indices without accumulate.
    check(lambda x, i, v: x.clone().index_put_((i[[0, 1, 3]],), v[:3]), x, i, v)


def test_index_backward() -> None:
    x = torch.randn(5, 4)
    i = torch.tensor([0, 3, 0, 1])

    def fn(x, i):
        x = x.detach().requires_grad_()
        (x[i] * torch.arange(4.0, device=x.device)).sum().backward()
        return x.grad

    check(fn, x, i)


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_scatter(dtype: torch.dtype) -> None:
    x = torch.randn(4, 5).to(dtype)
    m = torch.randn(4, 5) > 0
    src = torch.randn(30).to(dtype)
    check(lambda x, m, s: x.masked_scatter(m, s), x, m, src)
    check(lambda x, m, s: x.masked_scatter(m[0], s), x, m, src)  # broadcast mask


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("freq", [False, True])
def test_embedding_backward(dtype: torch.dtype, padding_idx: int | None, freq: bool) -> None:
    w = torch.randn(7, 5).to(dtype)
    idx = torch.tensor([[0, 2, 2, 6], [1, 0, 2, 3]])

    def fn(w, idx):
        w = w.detach().requires_grad_()
        out = torch.nn.functional.embedding(idx, w, padding_idx=padding_idx,
                                            scale_grad_by_freq=freq)
        (out * torch.linspace(-1, 1, 5, device=w.device, dtype=w.dtype)).sum().backward()
        return w.grad

    check(fn, w, idx, tol=TOL[dtype])


# ---------------------------------------------------------------- sort


@pytest.mark.parametrize("dtype", DTYPES + [torch.int32, torch.bool])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(dtype: torch.dtype, descending: bool) -> None:
    x = torch.randint(-3, 4, (6, 9)).to(dtype)  # many ties
    check(lambda x: torch.sort(x, dim=1, descending=descending, stable=True), x)
    check(lambda x: torch.sort(x, dim=0, descending=descending, stable=True), x)
    check(lambda x: torch.sort(x, descending=descending), x)
    check(lambda x: torch.argsort(x, dim=1, descending=descending, stable=True), x)


def test_sort_nan_and_edge_cases() -> None:
    x = torch.tensor([3.0, float("nan"), -1.0, float("inf"), float("nan"), -float("inf"), 0.0])
    check(lambda x: torch.sort(x, stable=True), x)
    check(lambda x: torch.sort(x, descending=True, stable=True), x)
    check(lambda x: torch.sort(x, stable=True), torch.tensor(2.5))   # 0-d
    check(lambda x: torch.sort(x, dim=0), torch.empty(0, 3))          # empty
    check(lambda x: torch.argsort(x), torch.randn(3, 0))


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
@pytest.mark.parametrize("largest", [True, False])
def test_topk(dtype: torch.dtype, largest: bool) -> None:
    x = torch.randperm(60).view(5, 12).sub(30).to(dtype)  # no ties
    check(lambda x: torch.topk(x, 4, dim=1, largest=largest), x)
    check(lambda x: torch.topk(x, 2, dim=0, largest=largest), x)
    check(lambda x: torch.topk(x, 0, largest=largest), x)
    # unsorted: same set of values
    vals = torch.topk(x.to("tpu"), 3, largest=largest, sorted=False).values.cpu()
    ref = torch.topk(x, 3, largest=largest).values
    assert torch.equal(vals.sort(dim=-1).values, ref.sort(dim=-1).values)


def test_topk_nan_and_ties() -> None:
    x = torch.tensor([1.0, float("nan"), 5.0, 5.0, -2.0, float("nan")])
    check(lambda x: torch.topk(x, 3).values, x)
    check(lambda x: torch.topk(x, 3, largest=False), x)
    ties = torch.tensor([2.0, 1.0, 2.0, 2.0, 0.0])
    check(lambda x: torch.topk(x, 2).values, ties)


def test_topk_backward() -> None:
    x = torch.randn(4, 8)

    def fn(x):
        x = x.detach().requires_grad_()
        torch.topk(x, 3).values.pow(2).sum().backward()
        return x.grad

    check(fn, x)


def test_kthvalue_median() -> None:
    x = torch.randn(5, 7)
    check(lambda x: torch.kthvalue(x, 3, dim=1), x)
    check(lambda x: torch.kthvalue(x, 1, dim=0, keepdim=True), x)
    check(lambda x: torch.median(x, dim=1), x)
    check(lambda x: torch.median(x), x)
    y = x.clone()
    y[1, 4] = float("nan")
    check(lambda x: torch.median(x, dim=1), y)
    check(lambda x: torch.median(x), y)
    check(lambda x: torch.median(x, dim=0), torch.randint(0, 9, (6, 3)))


# ---------------------------------------------------------------- data dependent


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_nonzero(dtype: torch.dtype) -> None:
    x = (torch.randn(4, 6) > 0.3).to(dtype)
    check(torch.nonzero, x)
    check(lambda x: torch.nonzero(x, as_tuple=True), x)
    check(torch.nonzero, torch.zeros(3, 2, dtype=dtype))
    check(torch.nonzero, torch.ones(3, dtype=dtype))
    check(torch.nonzero, torch.zeros(0, 4, dtype=dtype))
    check(torch.argwhere, x)


def test_nonzero_static() -> None:
    x = torch.tensor([[0, 1, 0], [2, 0, 3]])
    check(lambda x: torch.nonzero_static(x, size=5), x)
    check(lambda x: torch.nonzero_static(x, size=2, fill_value=-7), x)
    check(lambda x: torch.nonzero_static(x, size=0), x)
    check(lambda x: torch.nonzero_static(x, size=3), torch.zeros(0, 2))


@pytest.mark.parametrize("dtype", DTYPES + [torch.int32])
def test_masked_select(dtype: torch.dtype) -> None:
    x = torch.randn(4, 5).mul(5).to(dtype)
    m = torch.randn(4, 5) > 0
    check(torch.masked_select, x, m)
    check(torch.masked_select, x, m[0])      # broadcast mask
    check(torch.masked_select, x[0], m)      # broadcast self
    check(torch.masked_select, x, torch.zeros_like(m))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("counts", [False, True])
def test_unique(dtype: torch.dtype, inverse: bool, counts: bool) -> None:
    x = torch.randint(-3, 4, (5, 6)).to(dtype)
    check(lambda x: torch.unique(x, return_inverse=inverse, return_counts=counts), x)
    check(lambda x: torch.unique(x, return_inverse=inverse, return_counts=counts),
          torch.empty(0, dtype=dtype))
    check(lambda x: torch.unique(x, return_inverse=inverse, return_counts=counts),
          torch.ones(1, dtype=dtype))


def test_unique_unsorted_and_nan() -> None:
    x = torch.randint(0, 5, (20,))
    vals = torch.unique(x.to("tpu"), sorted=False).cpu()
    assert torch.equal(vals.sort().values, torch.unique(x))
    y = torch.tensor([1.0, float("nan"), 1.0, 2.0])
    vals = torch.unique(y.to("tpu")).cpu()
    assert vals[:2].tolist() == [1.0, 2.0] and torch.isnan(vals[2:]).all()


def test_repeat_interleave() -> None:
    x = torch.randn(3, 4)
    r = torch.tensor([2, 0, 3])
    check(lambda x: torch.repeat_interleave(x, 2, dim=0), x)
    check(lambda x: x.repeat_interleave(3, dim=1), x)
    check(lambda x, r: torch.repeat_interleave(x, r, dim=0), x, r)
    check(torch.repeat_interleave, r)
    check(lambda r: torch.repeat_interleave(r, output_size=5), r)


def test_take_along_dim_and_one_hot() -> None:
    x = torch.randn(4, 6)
    idx = torch.argsort(x, dim=1)
    check(lambda x, i: torch.take_along_dim(x, i, dim=1), x, idx)
    check(lambda i: torch.nn.functional.one_hot(i, 6), idx)
