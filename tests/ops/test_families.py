"""Hand-written checks per op family, tpu against CPU.

Each check runs the same function on CPU tensors and on their tpu copies,
compares with torch.testing.assert_close (dtype included; NaN == NaN) and,
unless told otherwise, asserts that the tpu call ran without a CPU fallback.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
import torch_tpu
import torch.nn.functional as F
from torch.utils import _pytree as pytree

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

BF16_TOL = {"rtol": 1.6e-2, "atol": 1e-2}
F32_TOL = {"rtol": 1e-5, "atol": 1e-5}


def _to(device: str) -> Callable[[Any], Any]:
    return lambda x: x.to(device) if isinstance(x, torch.Tensor) else x


def _plain(r: Any) -> Any:
    return tuple(r) if isinstance(r, tuple) and type(r) is not tuple else r


def _fallbacks() -> dict[str, int]:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def check(fn: Callable[..., Any], *args: Any, native: bool = True, tol: dict | None = None,
          **kwargs: Any) -> Any:
    """fn(*args, **kwargs) on CPU and on tpu: same result, no fallback."""
    expected = _plain(fn(*args, **kwargs))
    targs = pytree.tree_map(_to("tpu"), args)
    tkwargs = pytree.tree_map(_to("tpu"), kwargs)
    before = _fallbacks()
    actual = _plain(fn(*targs, **tkwargs))
    fell_back = {k for k, v in _fallbacks().items() if v != before.get(k, 0)}
    actual_cpu = pytree.tree_map(_to("cpu"), actual)
    torch.testing.assert_close(actual_cpu, expected, equal_nan=True, **(tol or {}))
    if native:
        assert not fell_back, f"ran through the CPU fallback: {sorted(fell_back)}"
    return actual


def check_raises(fn: Callable[..., Any], *args: Any) -> None:
    """fn raises on CPU, and raises on tpu too (no silent answer)."""
    with pytest.raises((RuntimeError, IndexError, ValueError, TypeError)):
        fn(*args)
    targs = pytree.tree_map(_to("tpu"), args)
    with pytest.raises((RuntimeError, IndexError, ValueError, TypeError)):
        r = fn(*targs)
        pytree.tree_map(_to("cpu"), _plain(r))


def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape).to(dtype)


def ints(*shape: int, dtype: torch.dtype = torch.int64, lo: int = -9, hi: int = 10) -> torch.Tensor:
    return torch.randint(lo, hi, shape, dtype=dtype)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)


# ---------------------------------------------------------------- promotion

PROMOTION_CASES = {
    "int+float_scalar": (lambda: (ints(5),), lambda a: a + 1.5),
    "int*float_scalar": (lambda: (ints(5),), lambda a: a * 0.25),
    "int32+int64": (lambda: (ints(4, dtype=torch.int32), ints(4)), torch.add),
    "bool+int": (lambda: (torch.tensor([True, False, True]), ints(3)), torch.add),
    "bool+bool": (lambda: (torch.tensor([True, False, True]), torch.tensor([True, True, False])),
                  torch.add),
    "bool*float": (lambda: (torch.tensor([True, False]), rand(2)), torch.mul),
    "uint8+int8": (lambda: (ints(6, dtype=torch.uint8, lo=0, hi=200), ints(6, dtype=torch.int8)),
                   torch.add),
    "uint8+int_scalar": (lambda: (ints(6, dtype=torch.uint8, lo=0, hi=200),), lambda a: a + 300),
    "float16+bfloat16": (lambda: (rand(4, dtype=torch.float16), rand(4, dtype=torch.bfloat16)),
                         torch.add),
    "bf16+f32": (lambda: (rand(4, dtype=torch.bfloat16), rand(4)), torch.mul),
    "f16+f64_0d": (lambda: (rand(4, dtype=torch.float16), torch.tensor(2.5, dtype=torch.float64)),
                   torch.add),
    "int+f32_0d": (lambda: (ints(4), torch.tensor(0.5)), torch.mul),
    "int32+int64_0d": (lambda: (ints(4, dtype=torch.int32), torch.tensor(7)), torch.add),
    "0d+0d": (lambda: (torch.tensor(3), torch.tensor(2.5, dtype=torch.bfloat16)), torch.add),
    "int/int": (lambda: (ints(5), ints(5, lo=1, hi=5)), torch.div),
    "int_floordiv": (lambda: (ints(5), ints(5, lo=1, hi=5)), torch.floor_divide),
    "int_lt_float_scalar": (lambda: (ints(5),), lambda a: a < 0.5),
    "int_eq_float": (lambda: (ints(5), rand(5).round()), torch.eq),
    "float_pow_int": (lambda: (rand(4).abs(), ints(4, lo=0, hi=4)), torch.pow),
    "int_pow_scalar": (lambda: (ints(4, lo=0, hi=5),), lambda a: a ** 2),
    "int_where_float": (lambda: (torch.tensor([True, False, True]), ints(3), rand(3)), torch.where),
}


@pytest.mark.parametrize("case", sorted(PROMOTION_CASES))
def test_type_promotion(case: str) -> None:
    make, fn = PROMOTION_CASES[case]
    tol = BF16_TOL if case in ("float16+bfloat16", "bf16+f32", "0d+0d") else None
    check(fn, *make(), tol=tol)


def test_sub_with_bool_raises() -> None:
    check_raises(torch.sub, ints(5), torch.tensor([True] * 5))


def test_cpu_scalar_tensor_with_tpu_tensor() -> None:
    x = rand(3, 4)
    s = torch.tensor(2.0)  # 0-d CPU tensor: PyTorch allows it with any device
    expected = x * s
    got = (x.to("tpu") * s).cpu()
    torch.testing.assert_close(got, expected)


# ---------------------------------------------------------------- broadcasting

@pytest.mark.parametrize("shapes", [((3, 1, 4), (2, 1)), ((5,), (2, 5)), ((1,), (3, 3)),
                                    ((2, 3), ()), ((4, 1), (1, 4)), ((0, 3), (1, 3))])
@pytest.mark.parametrize("fn", [torch.add, torch.mul, torch.maximum, torch.atan2, torch.gt,
                                torch.remainder], ids=lambda f: f.__name__)
def test_broadcasting(shapes: tuple, fn: Callable) -> None:
    check(fn, rand(*shapes[0]), rand(*shapes[1]))


def test_noncontiguous_inputs() -> None:
    a, b = rand(4, 6), rand(6, 4)
    check(lambda x, y: x.t() + y, a, b)
    check(lambda x, y: x[:, ::2] * y[::2, :].t(), a, b)
    check(lambda x: x.expand(3, 4, 6).sum(0), a)


# ---------------------------------------------------------------- tensor-scalar forms

SCALAR_FORMS = {
    "add_alpha": lambda x: torch.add(x, 2, alpha=3),
    "add_tensor_alpha": lambda x: torch.add(x, x * 2, alpha=-0.5),
    "sub_scalar": lambda x: x - 1.25,
    "rsub": lambda x: 1 - x,
    "rsub_alpha": lambda x: torch.rsub(x, x * 2 + 1, alpha=3),
    "sub_alpha_scalar": lambda x: torch.sub(x, 2, alpha=0.5),
    "mul_scalar": lambda x: x * -3,
    "div_scalar": lambda x: x / 4,
    "rdiv": lambda x: 2 / (x.abs() + 1),
    "div_trunc": lambda x: torch.div(x * 10, 3, rounding_mode="trunc"),
    "div_floor": lambda x: torch.div(x * 10, 3, rounding_mode="floor"),
    "pow_scalar": lambda x: x ** 2,
    "pow_half": lambda x: x.abs() ** 0.5,
    "rpow": lambda x: 2 ** x,
    "remainder": lambda x: torch.remainder(x * 10, 3),
    "remainder_neg": lambda x: torch.remainder(x * 10, -3),
    "fmod": lambda x: torch.fmod(x * 10, 3),
    "eq": lambda x: (x * 0).eq(0),
    "ge": lambda x: x >= 0.1,
    "maximum_0d": lambda x: torch.maximum(x, torch.tensor(0.0)),
    "clamp_scalar": lambda x: torch.clamp(x, min=-0.5, max=0.5),
    "clamp_min": lambda x: x.clamp(min=0),
    "clamp_max": lambda x: x.clamp(max=0.25),
    "where_scalar_other": lambda x: torch.where(x > 0, x, 0.0),
    "where_scalar_self": lambda x: torch.where(x > 0, 1.0, x),
    "masked_fill": lambda x: x.masked_fill(x < 0, -7.0),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", sorted(SCALAR_FORMS))
def test_tensor_scalar_forms(form: str, dtype: torch.dtype) -> None:
    check(SCALAR_FORMS[form], rand(3, 5, dtype=dtype),
          tol=BF16_TOL if dtype == torch.bfloat16 else F32_TOL)


def test_int_tensor_scalar_forms() -> None:
    x = ints(10)
    check(lambda a: a + 3, x)
    check(lambda a: a * -2, x)
    check(lambda a: a // 3, x)
    check(lambda a: a % -4, x)
    check(lambda a: torch.fmod(a, 4), x)
    check(lambda a: a & 6, x)
    check(lambda a: a | 1, x)
    check(lambda a: a ^ 5, x)
    check(lambda a: ~a, x)
    check(lambda a: a.clamp(-2, 3), x)
    check(lambda a: torch.where(a > 0, a, -1), x)


# ---------------------------------------------------------------- in-place and out=

def test_inplace_variants() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x.add_(y, alpha=2)
        x.mul_(3)
        x.sub_(1.5)
        x.div_(y.abs() + 1)
        x.clamp_(-2, 2)
        x.exp_()
        x[1:].neg_()
        x[:, 0].fill_(5)
        return x
    check(f, rand(4, 3), rand(4, 3))


def test_inplace_on_view_writes_base() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        v = x.t()[1:3]
        v.mul_(10)
        x[::2, 1].add_(100)
        return x
    check(f, rand(4, 5))


def test_inplace_promotion_error() -> None:
    # int tensor += float: the result type cannot be cast back.
    check_raises(lambda x: x.add_(1.5), ints(3))


def test_out_wrong_size_is_resized() -> None:
    a, b = rand(3, 4), rand(3, 4)
    c = torch.empty(7)
    torch.add(a, b, out=c)
    ct = torch.empty(7, device="tpu")
    torch.add(a.to("tpu"), b.to("tpu"), out=ct)
    assert ct.shape == c.shape == (3, 4)
    torch.testing.assert_close(ct.cpu(), c)


def test_out_right_size_and_dtype_cast() -> None:
    a, b = ints(5), ints(5)
    out = torch.empty(5, dtype=torch.float32)
    torch.mul(a, b, out=out)
    out_t = torch.empty(5, dtype=torch.float32, device="tpu")
    torch.mul(a.to("tpu"), b.to("tpu"), out=out_t)
    torch.testing.assert_close(out_t.cpu(), out)


def test_out_float_into_int_raises() -> None:
    def f(a: torch.Tensor) -> torch.Tensor:
        out = torch.empty(3, dtype=torch.int64, device=a.device)
        return torch.add(a, a, out=out)
    check_raises(f, rand(3))


def test_out_reductions() -> None:
    x = rand(4, 5)
    s = torch.empty(2)
    torch.sum(x, 1, out=s)
    st = torch.empty(2, device="tpu")
    torch.sum(x.to("tpu"), 1, out=st)
    torch.testing.assert_close(st.cpu(), s)
    v, i = torch.empty(0), torch.empty(0, dtype=torch.long)
    torch.max(x, 0, out=(v, i))
    vt, it = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.long, device="tpu")
    torch.max(x.to("tpu"), 0, out=(vt, it))
    torch.testing.assert_close((vt.cpu(), it.cpu()), (v, i))


def test_out_matmul() -> None:
    a, b = rand(3, 4), rand(4, 2)
    o = torch.empty(1)
    torch.mm(a, b, out=o)
    ot = torch.empty(1, device="tpu")
    torch.mm(a.to("tpu"), b.to("tpu"), out=ot)
    torch.testing.assert_close(ot.cpu(), o, **F32_TOL)


# ---------------------------------------------------------------- where, clamp, casts

@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool,
                                   torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_casts_from_float(dtype: torch.dtype) -> None:
    x = rand(20) * 50
    if dtype == torch.uint8:
        x = x.abs()
    if dtype == torch.int8:
        x = x.clamp(-100, 100)
    check(lambda t: t.to(dtype), x)


@pytest.mark.parametrize("src", [torch.int32, torch.int64, torch.bool, torch.uint8,
                                 torch.bfloat16, torch.float16], ids=str)
def test_casts_to_float(src: torch.dtype) -> None:
    x = (rand(20) * 20).to(src) if src != torch.bool else rand(20) > 0
    check(lambda t: t.float(), x)
    check(lambda t: t.half(), x)
    check(lambda t: t.bfloat16(), x)


def test_where_and_clamp() -> None:
    x, y = rand(3, 4), rand(1, 4)
    check(torch.where, x > 0, x, y)
    check(torch.where, rand(3, 1) > 0, ints(3, 4), rand(4))
    check(lambda a, lo, hi: torch.clamp(a, lo, hi), x, -rand(4).abs(), rand(3, 1).abs())
    check(lambda a, lo: torch.clamp(a, min=lo), x, rand(4))
    check(lambda a: a.clamp(min=0.5, max=-0.5), x)  # min > max: everything is max
    check(lambda a: a.clamp(-1, 1), torch.tensor([float("nan"), 2.0, -3.0]))


# ---------------------------------------------------------------- reductions

@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1, (0, 2), None])
def test_reductions_dims(dim: Any, keepdim: bool) -> None:
    x = rand(3, 4, 5)
    if dim is None:
        check(torch.sum, x, tol=F32_TOL)
        check(torch.mean, x, tol=F32_TOL)
        check(torch.amax, x)
        return
    check(torch.sum, x, dim, keepdim=keepdim, tol=F32_TOL)
    check(torch.mean, x, dim, keepdim=keepdim, tol=F32_TOL)
    check(torch.amax, x, dim, keepdim=keepdim)
    check(torch.amin, x, dim, keepdim=keepdim)
    check(torch.any, x > 1, dim, keepdim=keepdim)
    check(torch.all, x > -1, dim, keepdim=keepdim)
    check(torch.logsumexp, x, dim, keepdim=keepdim, tol=F32_TOL)
    if isinstance(dim, int):
        check(torch.prod, x, dim, keepdim=keepdim, tol=F32_TOL)
        check(torch.max, x, dim, keepdim=keepdim)
        check(torch.min, x, dim, keepdim=keepdim)
        check(torch.argmax, x, dim, keepdim=keepdim)
        check(torch.argmin, x, dim, keepdim=keepdim)
        check(torch.cumsum, x, dim, tol=F32_TOL)
        check(torch.cumprod, x, dim, tol=F32_TOL)


def test_reductions_dtype_arg() -> None:
    x = rand(4, 6, dtype=torch.bfloat16)
    check(lambda t: t.sum(1, dtype=torch.float32), x, tol=F32_TOL)
    check(lambda t: t.mean(0, dtype=torch.float32), x, tol=F32_TOL)
    check(lambda t: t.sum(dtype=torch.float32), x, tol=F32_TOL)
    i = ints(4, 6)
    check(lambda t: t.sum(1, dtype=torch.float32), i)
    check(lambda t: t.cumsum(1, dtype=torch.float32), i)
    check(lambda t: t.prod(1, dtype=torch.float32), ints(4, 6, lo=-3, hi=4))
    check(lambda t: t.sum(), ints(4, 6, dtype=torch.int32))  # int32 sums to int64
    check(lambda t: t.sum(0), rand(5, 3) > 0)  # bool sums to int64
    check(lambda t: t.prod(), rand(5) > -2)
    check(lambda t: t.cumsum(0), rand(5) > 0)


def test_reductions_bf16() -> None:
    x = rand(8, 16, dtype=torch.bfloat16)
    for fn in (lambda t: t.sum(1), lambda t: t.mean(0), lambda t: t.prod(1),
               lambda t: t.logsumexp(1), lambda t: t.var(1), lambda t: t.std(0)):
        check(fn, x, tol=BF16_TOL)
    check(lambda t: t.amax(1), x)
    check(lambda t: t.max(0), x)


def test_max_min_indices_ties_go_first() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, -1.0]])
    check(torch.max, x, 1)
    check(torch.min, x, 1)
    check(torch.argmax, x, 1)
    check(torch.argmin, x, 1)
    check(torch.argmax, x)
    check(torch.max, ints(3, 7, lo=0, hi=3), 1)
    check(torch.max, torch.tensor([[True, False, True], [False, False, False]]), 1)


@pytest.mark.parametrize("correction", [0, 1, 2, 0.5])
def test_var_std_correction(correction: float) -> None:
    x = rand(4, 7)
    check(lambda t: torch.var(t, 1, correction=correction), x, tol=F32_TOL)
    check(lambda t: torch.std(t, 0, correction=correction, keepdim=True), x, tol=F32_TOL)
    check(lambda t: torch.var_mean(t, 1, correction=correction), x, tol=F32_TOL)
    check(lambda t: torch.std_mean(t, correction=correction), x, tol=F32_TOL)


def test_var_std_unbiased_and_small() -> None:
    x = rand(3, 5)
    check(lambda t: t.var(1, unbiased=False), x, tol=F32_TOL)
    check(lambda t: t.std(), x, tol=F32_TOL)
    # N <= correction: inf / nan as on CPU
    check(lambda t: t.var(1), rand(3, 1))
    check(lambda t: t.std(0, correction=3), rand(2, 3))


def test_mean_of_int_raises() -> None:
    check_raises(lambda t: t.mean(), ints(4))


# ---------------------------------------------------------------- linalg

LINALG = {
    "mm": (lambda d: (rand(5, 7, dtype=d), rand(7, 3, dtype=d)), torch.mm),
    "bmm": (lambda d: (rand(2, 5, 7, dtype=d), rand(2, 7, 3, dtype=d)), torch.bmm),
    "addmm": (lambda d: (rand(5, 3, dtype=d), rand(5, 7, dtype=d), rand(7, 3, dtype=d)),
              torch.addmm),
    "addmm_broadcast_bias": (lambda d: (rand(3, dtype=d), rand(5, 7, dtype=d),
                                        rand(7, 3, dtype=d)),
                             lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2)),
    "baddbmm": (lambda d: (rand(2, 5, 3, dtype=d), rand(2, 5, 7, dtype=d),
                           rand(2, 7, 3, dtype=d)),
                lambda b, x, y: torch.baddbmm(b, x, y, beta=-1, alpha=0.5)),
    "matmul_2d": (lambda d: (rand(5, 7, dtype=d), rand(7, 3, dtype=d)), torch.matmul),
    "matmul_1d_2d": (lambda d: (rand(7, dtype=d), rand(7, 3, dtype=d)), torch.matmul),
    "matmul_2d_1d": (lambda d: (rand(5, 7, dtype=d), rand(7, dtype=d)), torch.matmul),
    "matmul_1d_1d": (lambda d: (rand(7, dtype=d), rand(7, dtype=d)), torch.matmul),
    "matmul_3d_2d": (lambda d: (rand(2, 5, 7, dtype=d), rand(7, 3, dtype=d)), torch.matmul),
    "matmul_batch_bcast": (lambda d: (rand(2, 1, 5, 7, dtype=d), rand(3, 7, 4, dtype=d)),
                           torch.matmul),
    "linear_bias": (lambda d: (rand(4, 6, dtype=d), rand(3, 6, dtype=d), rand(3, dtype=d)),
                    F.linear),
    "linear_nobias": (lambda d: (rand(2, 4, 6, dtype=d), rand(3, 6, dtype=d)), F.linear),
    "transposed_mm": (lambda d: (rand(7, 5, dtype=d), rand(3, 7, dtype=d)),
                      lambda a, b: a.t() @ b.t()),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", sorted(LINALG))
def test_linalg(case: str, dtype: torch.dtype) -> None:
    make, fn = LINALG[case]
    check(fn, *make(dtype), tol=F32_TOL if dtype == torch.float32 else BF16_TOL)


def test_addmm_beta_zero_ignores_nan() -> None:
    bias = torch.full((2, 3), float("nan"))
    check(lambda b, x, y: torch.addmm(b, x, y, beta=0), bias, rand(2, 4), rand(4, 3),
          tol=F32_TOL)


def test_int_matmul() -> None:
    check(torch.mm, ints(3, 4), ints(4, 5))


# ---------------------------------------------------------------- joining, copies

def test_cat_stack() -> None:
    a, b = rand(2, 3), rand(4, 3)
    check(lambda x, y: torch.cat([x, y]), a, b)
    check(lambda x, y: torch.cat([x.t(), y.t()], dim=-1), a, b)
    check(lambda x, y: torch.cat([x, y.to(torch.bfloat16)]), a, b)  # promotes
    check(lambda x, y: torch.cat([x, y.long()]), a, b)
    check(lambda x, y: torch.cat([x, torch.empty(0, device=x.device), y]), a, b)  # legacy empty
    check(lambda x, y: torch.stack([x, y[:2]], dim=1), a, b)
    check(lambda x, y: torch.stack([x, y[:2], x], dim=-1), a, b)
    check(lambda x: torch.stack([x]), torch.tensor(3.0))


def test_clone_contiguous() -> None:
    x = rand(4, 5, 6)
    check(lambda t: t.clone(), x)
    check(lambda t: t.transpose(0, 2).clone(), x)
    check(lambda t: t.transpose(0, 2).contiguous(), x)
    check(lambda t: t[:, 1::2, ::3].contiguous(), x)
    out = x.to("tpu").transpose(0, 1).contiguous()
    assert out.is_contiguous()
    check(lambda t: t.clone(memory_format=torch.channels_last), rand(2, 3, 4, 5))


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax(dim: int, dtype: torch.dtype) -> None:
    x = rand(4, 5, 6, dtype=dtype) * 4
    tol = F32_TOL if dtype == torch.float32 else BF16_TOL
    check(lambda t: torch.softmax(t, dim), x, tol=tol)
    check(lambda t: torch.log_softmax(t, dim), x, tol=tol)
    check(lambda t: F.softmax(t, dim, dtype=torch.float32), x, tol=F32_TOL)
    check(lambda t: F.log_softmax(t, dim, dtype=torch.float32), x, tol=F32_TOL)


def test_softmax_masked_rows() -> None:
    x = rand(3, 4)
    x[0, 1] = float("-inf")
    x[1] = float("-inf")  # a fully masked row: nan on CPU
    check(lambda t: torch.softmax(t, 1), x)
    check(lambda t: torch.log_softmax(t, 1), x)
    check(lambda t: torch.softmax(t, 0), torch.tensor(2.0))


# ---------------------------------------------------------------- indexing

def test_embedding_index_select() -> None:
    w = rand(10, 4)
    idx = torch.tensor([[1, 3, 9], [0, 0, 2]])
    check(F.embedding, idx, w)
    check(lambda i, t: F.embedding(i, t, padding_idx=0), idx, w)
    check(F.embedding, torch.tensor(7), w)
    check(F.embedding, idx, rand(10, 4, dtype=torch.bfloat16))
    check(lambda t, i: t.index_select(1, i), rand(3, 5), torch.tensor([4, 0, 0, 2]))
    check(lambda t, i: t.index_select(0, i), rand(3, 5), torch.tensor([2, 1], dtype=torch.int32))
    check(lambda t, i: t.index_select(0, i), torch.tensor(3.0), torch.tensor([0]))


def test_gather_scatter() -> None:
    x = rand(3, 5)
    idx = torch.tensor([[0, 4], [1, 1], [3, 2]])
    check(lambda t, i: t.gather(1, i), x, idx)
    check(lambda t, i, s: t.scatter(1, i, s), x, torch.tensor([[0, 4], [1, 2], [3, 2]]),
          rand(3, 2))
    check(lambda t, i, s: t.scatter_add(0, i, s), x, torch.tensor([[0, 1, 2, 0, 1], [0, 0, 0, 2, 2]]),
          rand(2, 5), tol=F32_TOL)
    check(lambda t, i: t.scatter(1, i, 2.5), x, idx)


# ---------------------------------------------------------------- fill, zero

def test_fill_zero() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[1].fill_(2.5)
        x[:, 3].zero_()
        x[::2, ::2].fill_(torch.tensor(-1.0, device=x.device))
        return x
    check(f, rand(4, 5))
    check(lambda x: x.clone().fill_(7), ints(3, 3))
    check(lambda x: x.clone().fill_(True), rand(3) > 0)
    check(lambda x: x.clone().zero_(), rand(2, 3, dtype=torch.bfloat16))
    check(lambda x: torch.zeros_like(x) + torch.ones_like(x) * 3, rand(2, 3))
    check(lambda x: torch.full_like(x, 4.5), rand(2, 3))


# ---------------------------------------------------------------- NaN / inf

NAN, INF = float("nan"), float("inf")


def test_nan_propagation() -> None:
    x = torch.tensor([[1.0, NAN, 3.0], [-1.0, 2.0, 0.5], [INF, -INF, 1.0]])
    check(torch.max, x)
    check(torch.min, x)
    check(torch.amax, x, 1)
    check(torch.amin, x, 0)
    check(torch.max, x, 1)
    check(torch.min, x, 0)
    check(torch.argmax, x, 1)
    check(torch.argmin, x)
    check(torch.sum, x, 1)
    check(torch.sum, torch.tensor([INF, -INF]))  # inf - inf = nan
    check(torch.mean, x, 0)
    check(torch.prod, x, 1)
    check(torch.softmax, x, 1)
    check(torch.log_softmax, x, 1)
    check(torch.logsumexp, x, 1)
    check(torch.maximum, x, x.flip(0))
    check(torch.minimum, x, x.flip(1))
    check(torch.cumsum, x, 1)
    check(lambda t: t.clamp(0, 1), x)
    check(lambda t: t.var(1), x)


def test_inf_edge_cases() -> None:
    x = torch.tensor([INF, -INF, 0.0, -0.0, 1.0, NAN])
    for fn in (torch.exp, torch.log, torch.sqrt, torch.rsqrt, torch.tanh, torch.sigmoid,
               torch.reciprocal, torch.sign, torch.abs, torch.floor, torch.isnan,
               torch.isinf, torch.isfinite):
        check(fn, x)
    check(lambda t: torch.logsumexp(t, 0), torch.tensor([-INF, -INF]))
    check(lambda t: torch.logsumexp(t, 0), torch.tensor([INF, 1.0]))
    check(torch.div, torch.tensor([1.0, -1.0, 0.0]), torch.tensor([0.0, 0.0, 0.0]))


# ---------------------------------------------------------------- empty tensors

def test_empty_elementwise() -> None:
    e = torch.empty(0, 3)
    check(torch.add, e, e)
    check(torch.add, e, rand(3))
    check(torch.exp, e)
    check(torch.where, e > 0, e, 1.0)
    check(lambda t: t.clamp(0, 1), e)
    check(lambda t: t.to(torch.int32), e)


def test_empty_reductions() -> None:
    e = torch.empty(0, 3)
    check(torch.sum, e, 0)
    check(torch.sum, e, 1)
    check(torch.sum, e)
    check(torch.prod, e, 0)
    check(torch.mean, e, 0)  # nan
    check(torch.amax, e, 1)
    check(torch.any, e, 0)
    check(torch.all, e, 0)
    check(torch.logsumexp, e, 0)
    check(torch.cumsum, e, 0)
    check(lambda t: t.var(0), e)
    check_raises(lambda t: t.amax(0), e)
    check_raises(lambda t: t.max(0), e)
    check_raises(lambda t: t.argmax(), e)


def test_empty_linalg() -> None:
    check(torch.mm, torch.empty(0, 3), rand(3, 4))
    check(torch.mm, rand(2, 0), rand(0, 3))  # zeros
    check(torch.bmm, rand(2, 3, 0), rand(2, 0, 4))
    check(torch.addmm, rand(2, 3), rand(2, 0), rand(0, 3))
    check(F.linear, torch.empty(0, 4), rand(3, 4), rand(3))


def test_empty_joining_and_indexing() -> None:
    e = torch.empty(0, 3)
    check(lambda a, b: torch.cat([a, b]), e, rand(2, 3))
    check(lambda a: torch.cat([a, a]), e)
    check(lambda a: torch.stack([a, a]), e)
    check(lambda a: a.clone(), e)
    check(torch.softmax, e, 1)
    check(torch.log_softmax, e, 0)
    check(F.embedding, torch.empty(0, dtype=torch.long), rand(5, 3))
    check(lambda t, i: t.index_select(0, i), rand(4, 3), torch.empty(0, dtype=torch.long))
    check(lambda t: t.clone().fill_(1.0), e)
    check(lambda t: t.clone().zero_(), e)
    check(lambda t: t.flip(0), e)
    check(lambda t: t.repeat(2, 2), e)
    check(lambda t: F.pad(t, (1, 1)), e)
