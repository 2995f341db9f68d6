"""mode, randperm, histc (float and integer), float32 _grouped_mm and
embedding_renorm_ (nn.Embedding(max_norm=...)) natively on tpu, vs CPU.

Every tpu call is checked for zero CPU fallbacks.
"""
from __future__ import annotations

import math

import pytest
import torch

import torch_tpu

from no_fallback import native

NAN = float("nan")


# ---------------------------------------------------------------- mode


def _mode_tpu(x: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
    with native():
        v, i = torch.mode(x.to("tpu"), *args, **kwargs)
        return v.cpu(), i.cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("dim,keepdim", [(-1, False), (0, True), (1, False)])
def test_mode_matches_cpu_short_slices(dtype: torch.dtype, dim: int, keepdim: bool) -> None:
    # Slices of <= 16 elements: the CPU kernel is deterministic (insertion sort),
    # values AND indices must match (ties: smallest value, last occurrence).
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-2, 3, (6, 11, 5), generator=g).to(dtype)
    v, i = _mode_tpu(x, dim, keepdim)
    ev, ei = torch.mode(x, dim, keepdim)
    assert v.dtype == ev.dtype and i.dtype == torch.int64
    torch.testing.assert_close(v, ev)
    torch.testing.assert_close(i, ei)


def test_mode_long_slices_values_and_a_valid_index() -> None:
    # Longer slices: the CPU's index depends on its unstable sort; ours is the
    # last occurrence. Values match; indices point at the mode.
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 6, (4, 200), generator=g).float()
    v, i = _mode_tpu(x, 1)
    torch.testing.assert_close(v, torch.mode(x, 1).values)
    torch.testing.assert_close(x.gather(1, i[:, None])[:, 0], v)
    last = torch.tensor([max(k for k in range(200) if x[r, k] == v[r]) for r in range(4)])
    torch.testing.assert_close(i, last)


def test_mode_special_inputs() -> None:
    cases = [
        torch.tensor([3, 1, 3, 1, 2]),             # tie between 1 and 3: the smaller
        torch.tensor([NAN, 2.0, 2.0, NAN, 1.0]),   # NaNs never equal each other
        torch.tensor([1.0, NAN, NAN, 2.0]),        # all counts 1: smallest number
        torch.tensor([NAN, NAN]),                  # only NaNs
        torch.tensor([-0.0, 0.0, 5.0]),            # -0 == 0
        torch.tensor(7.0),                         # 0-d
        torch.tensor([True, False, True]),
    ]
    for x in cases:
        v, i = _mode_tpu(x)
        ev, ei = torch.mode(x)
        torch.testing.assert_close(v, ev, equal_nan=True)
        torch.testing.assert_close(i, ei)


def test_mode_empty_and_errors() -> None:
    v, i = _mode_tpu(torch.empty(0, 5), 1)
    assert v.shape == (0,) and i.shape == (0,)
    v, i = _mode_tpu(torch.empty(3, 0, 4), 2, True)
    assert v.shape == (3, 0, 1)
    with pytest.raises(IndexError, match="non-zero size"):
        torch.mode(torch.empty(5, 0, device="tpu"), 1)


def test_mode_out_variant() -> None:
    x = torch.randint(0, 3, (4, 9)).float()
    values = torch.empty(0, device="tpu")
    indices = torch.empty(0, dtype=torch.long, device="tpu")
    with native():
        torch.mode(x.to("tpu"), 1, out=(values, indices))
    torch.testing.assert_close(values.cpu(), torch.mode(x, 1).values)
    torch.testing.assert_close(indices.cpu(), torch.mode(x, 1).indices)


# ---------------------------------------------------------------- randperm


@pytest.mark.parametrize("n", [0, 1, 2, 17, 1000])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_randperm_is_a_permutation(n: int, dtype: torch.dtype) -> None:
    with native():
        p = torch.randperm(n, device="tpu", dtype=dtype).cpu()
    assert p.dtype == dtype and p.shape == (n,)
    assert torch.equal(p.sort().values, torch.arange(n, dtype=dtype))


def test_randperm_seeded_reproducible_and_random() -> None:
    with native():
        torch.manual_seed(123)
        a = torch.randperm(500, device="tpu").cpu()
        b = torch.randperm(500, device="tpu").cpu()
        torch.manual_seed(123)
        a2 = torch.randperm(500, device="tpu").cpu()
        b2 = torch.randperm(500, device="tpu").cpu()
        g = torch.Generator(device="tpu").manual_seed(7)
        c = torch.randperm(500, device="tpu", generator=g).cpu()
        g.manual_seed(7)
        c2 = torch.randperm(500, device="tpu", generator=g).cpu()
        out = torch.empty(0, dtype=torch.long, device="tpu")
        torch.randperm(40, out=out)
    assert torch.equal(a, a2) and torch.equal(b, b2) and torch.equal(c, c2)
    assert not torch.equal(a, b)                      # the generator advanced
    assert not torch.equal(a, torch.arange(500))      # shuffled
    assert out.shape == (40,) and torch.equal(out.cpu().sort().values, torch.arange(40))
    # Roughly uniform: the first element's mean over many draws (1000 draws of n=10).
    with native():
        firsts = torch.stack([torch.randperm(10, device="tpu")[0] for _ in range(1000)]).float().cpu()
    assert abs(firsts.mean().item() - 4.5) < 0.4
    assert torch.unique(firsts).numel() == 10


def test_randperm_errors() -> None:
    with pytest.raises(RuntimeError):
        torch.randperm(-1, device="tpu")
    with pytest.raises(RuntimeError):
        torch.randperm(300, device="tpu", dtype=torch.int8)


# ---------------------------------------------------------------- histc


def _histc_tpu(x: torch.Tensor, *args: object) -> torch.Tensor:
    with native():
        return torch.histc(x.to("tpu"), *args).cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_histc_float_matches_cpu(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    # 16-bit floats: at most 256 elements, since the CPU kernel accumulates
    # counts in the input dtype (bf16 stops counting exactly above 256).
    n = 1000 if dtype.itemsize >= 4 else 256
    x = (torch.randn(n, generator=g) * 3).to(dtype)
    for args in [(), (10,), (7, -2, 3), (4, 0.5, 0.5), (5, -1.5, 1.5)]:
        got = _histc_tpu(x, *args)
        assert got.dtype == dtype
        torch.testing.assert_close(got, torch.histc(x, *args), rtol=0, atol=0)


def test_histc_float_edges_nan_inf_and_empty() -> None:
    x = torch.tensor([0.0, 1.0, 2.0, 3.0, NAN, math.inf, -math.inf, -0.5, 3.5, 1.5, 3.0])
    for args in [(3, 0, 3), (6, 0, 3), (1, 0, 3), (3, -1, 4)]:
        torch.testing.assert_close(_histc_tpu(x, *args), torch.histc(x, *args), rtol=0, atol=0)
    # A 2-D input, data range (min == max == 0), a constant input (range +-1).
    y = torch.randn(7, 9)
    torch.testing.assert_close(_histc_tpu(y, 8), torch.histc(y, 8), rtol=0, atol=0)
    c = torch.full((5,), 2.0)
    torch.testing.assert_close(_histc_tpu(c, 4), torch.histc(c, 4), rtol=0, atol=0)
    e = torch.empty(0)
    torch.testing.assert_close(_histc_tpu(e, 3), torch.histc(e, 3))
    torch.testing.assert_close(_histc_tpu(e, 3, 1, 2), torch.histc(e, 3, 1, 2))
    # out=
    out = torch.empty(0, device="tpu")
    with native():
        torch.histc(x.to("tpu"), 3, 0, 3, out=out)
    torch.testing.assert_close(out.cpu(), torch.histc(x, 3, 0, 3), rtol=0, atol=0)


def test_histc_range_errors() -> None:
    # Raised like CUDA's device asserts: at the next sync point.
    with pytest.raises((RuntimeError, IndexError), match="not finite"):
        torch.histc(torch.tensor([0.0, math.inf], device="tpu"), 4).cpu()
    with pytest.raises((RuntimeError, IndexError), match="max must be larger than min"):
        torch.histc(torch.tensor([0.0, 1.0], device="tpu"), 4, 2, 1).cpu()
    # a later call with a valid range is unaffected
    torch.testing.assert_close(_histc_tpu(torch.tensor([0.0, 1.0]), 2, 0, 1), torch.tensor([1.0, 1.0]))


def _histc_cuda_reference(x: torch.Tensor, bins: int, lo: float, hi: float) -> torch.Tensor:
    """CUDA's integer histc: int64 bounds (truncated), int64 bin arithmetic."""
    vals = [int(v) for v in x.flatten().tolist()]
    lo_i, hi_i = int(lo), int(hi)
    if lo_i == hi_i and vals:
        lo_i, hi_i = min(vals), max(vals)
    if lo_i == hi_i:
        lo_i, hi_i = lo_i - 1, hi_i + 1
    hist = [0] * bins
    for v in vals:
        if lo_i <= v <= hi_i:
            b = (v - lo_i) * bins // (hi_i - lo_i)
            hist[min(b, bins - 1)] += 1
    return torch.tensor(hist, dtype=x.dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int16])
def test_histc_integer_matches_cuda_semantics(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 50, (300,), generator=g).to(dtype)
    for bins, lo, hi in [(5, 0, 0), (7, 3, 40), (50, 0, 49), (4, 10.7, 20.2), (3, 60, 61)]:
        got = _histc_tpu(x, bins, lo, hi)
        assert got.dtype == dtype
        torch.testing.assert_close(got, _histc_cuda_reference(x, bins, lo, hi), rtol=0, atol=0)
    # Integer data in the float kernel's exact range agrees with the CPU on floats.
    torch.testing.assert_close(_histc_tpu(x, 50, 0, 50).float(), torch.histc(x.float(), 50, 0, 50))
    e = torch.empty(0, dtype=dtype)
    torch.testing.assert_close(_histc_tpu(e, 4), torch.zeros(4, dtype=dtype))


def test_histc_int_like_transformers_moe() -> None:
    # Tokens per expert as Transformers' grouped_mm experts count them.
    experts = torch.randint(0, 8, (64, 2), dtype=torch.int32)
    got = _histc_tpu(experts, 8, 0, 7)
    expected = torch.bincount(experts.flatten().long(), minlength=8).to(torch.int32)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# ---------------------------------------------------------------- float _grouped_mm


GROUPED = {
    "2dx3d": ((24, 16), (4, 16, 8), [5, 5, 17, 24]),
    "3dx2d": ((4, 8, 16), (16, 32), [8, 8, 24, 32]),
    "2dx2d": ((8, 32), (32, 16), [8, 8, 24, 32]),
    "3dx3d": ((3, 8, 16), (3, 16, 24), None),
    "2dx3d_unaligned": ((6, 3), (2, 3, 5), [2, 6]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", sorted(GROUPED))
def test_grouped_mm_float(case: str, dtype: torch.dtype) -> None:
    sa, sb, offs = GROUPED[case]
    a, b = torch.randn(sa).to(dtype), torch.randn(sb).to(dtype)
    o = torch.tensor(offs, dtype=torch.int32) if offs is not None else None
    with native():
        got = torch._grouped_mm(a.to("tpu"), b.to("tpu"), None if o is None else o.to("tpu")).cpu()
    assert got.dtype == dtype
    if case.endswith("unaligned"):  # PyTorch's CPU kernel wants 16-byte strides: a loop instead
        expected = torch.cat([a[0:2] @ b[0], a[2:6] @ b[1]])
    else:
        expected = torch._grouped_mm(a, b, o)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-2)
    torch.testing.assert_close(got, expected, **tol)


def test_grouped_mm_float_backward_and_errors() -> None:
    x = torch.randn(16, 32)
    w = torch.randn(4, 24, 32)
    offs = torch.tensor([3, 9, 9, 16], dtype=torch.int32)

    def run(device: str) -> list[torch.Tensor]:
        xd = x.clone().to(device).requires_grad_()
        wd = w.clone().to(device).requires_grad_()
        y = torch._grouped_mm(xd, wd.transpose(-2, -1), offs=offs.to(device))
        (y ** 2).sum().backward()
        return [y.detach().cpu(), xd.grad.cpu(), wd.grad.cpu()]

    expected = run("cpu")
    with native():
        got = run("tpu")
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-3)
    a, b = torch.randn(8, 4, device="tpu"), torch.randn(2, 4, 3, device="tpu")
    with pytest.raises(RuntimeError, match="Offsets tensor not provided"):
        torch._grouped_mm(a, b)
    with pytest.raises(RuntimeError, match="contraction dimension"):
        torch._grouped_mm(a, torch.randn(2, 5, 3, device="tpu"), torch.tensor([4, 8], dtype=torch.int32, device="tpu"))
    with pytest.raises(RuntimeError, match="int32"):
        torch._grouped_mm(a, b, torch.tensor([4, 8], device="tpu"))
    with pytest.raises(RuntimeError, match="same dtype"):
        torch._grouped_mm(a, b.half(), torch.tensor([4, 8], dtype=torch.int32, device="tpu"))


# ---------------------------------------------------------------- embedding max_norm


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_max_norm_matches_cpu(norm_type: float, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    w = (torch.randn(12, 6) * 2).to(dtype)
    idx = torch.tensor([[1, 2, 1, 7], [0, 7, 7, 11]])
    cpu = torch.nn.Embedding(12, 6, max_norm=1.5, norm_type=norm_type, _weight=w.clone())
    tpu = torch.nn.Embedding(12, 6, max_norm=1.5, norm_type=norm_type, _weight=w.clone()).to("tpu")
    expected = cpu(idx)
    with native():
        got = tpu(idx.to("tpu"))
        got.sum().backward()
        got_w = tpu.weight.detach().cpu()
    expected.sum().backward()
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got.detach().cpu(), expected.detach(), **tol)
    torch.testing.assert_close(got_w, cpu.weight.detach(), **tol)
    torch.testing.assert_close(tpu.weight.grad.cpu(), cpu.weight.grad, **tol)
    # Rows not looked up are untouched; looked-up rows now have norm <= max_norm.
    untouched = [3, 4, 5, 6, 8, 9, 10]
    assert torch.equal(got_w[untouched], w[untouched])
    assert (got_w[[0, 1, 2, 7, 11]].float().norm(p=norm_type, dim=1) <= 1.5 + 1e-2).all()


def test_embedding_renorm_direct_edge_cases() -> None:
    w = torch.randn(5, 3) * 4
    for idx in [torch.tensor([], dtype=torch.long), torch.tensor([4, -1], dtype=torch.int32),
                torch.tensor([0, 0, 0])]:
        a, b = w.clone(), w.clone().to("tpu")
        with native():
            torch.embedding_renorm_(b, idx.to("tpu"), 1.0, 2.0)
            got = b.cpu()
        torch.embedding_renorm_(a, idx, 1.0, 2.0)
        torch.testing.assert_close(got, a, rtol=1e-6, atol=1e-6)
    with pytest.raises((IndexError, RuntimeError), match="out of range"):
        torch.embedding_renorm_(w.clone().to("tpu"), torch.tensor([5], device="tpu"), 1.0, 2.0)
        torch_tpu.debug.stats()  # noqa: B018
        torch.tpu.synchronize()


# ---------------------------------------------------------------- weight norm

@pytest.mark.parametrize("case", ["conv_dim0", "conv_last", "linear_dim1", "old_api"])
def test_weight_norm_native(case):
    import warnings

    from torch.nn.utils import weight_norm
    from torch.nn.utils.parametrizations import weight_norm as param_weight_norm

    def build():
        if case == "conv_dim0":
            return param_weight_norm(torch.nn.Conv1d(4, 6, 3, groups=2), dim=0)
        if case == "conv_last":
            return param_weight_norm(torch.nn.Conv1d(4, 6, 3), dim=2)
        if case == "linear_dim1":
            return param_weight_norm(torch.nn.Linear(5, 3), dim=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return weight_norm(torch.nn.Linear(5, 3))

    torch.manual_seed(0)
    cpu = build()
    torch.manual_seed(0)
    tpu = build().to("tpu")
    x = torch.randn(2, 4, 7) if case.startswith("conv") else torch.randn(4, 5)
    torch_tpu.debug.reset_stats()
    y_tpu = tpu(x.to("tpu"))
    y_tpu.pow(2).sum().backward()
    torch.tpu.synchronize()
    assert torch_tpu.debug.stats()["fallbacks"] == {}
    y = cpu(x)
    y.pow(2).sum().backward()
    torch.testing.assert_close(y_tpu.detach().cpu(), y.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)
