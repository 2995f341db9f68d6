"""Comparing an op's tpu result with CPU's, for OpInfo sample inputs.

Shared by the OpInfo tests (tests/ops/test_opinfo*.py) and the op_db sweep
(torch_tpu.tools.opdb_sweep).

Tolerances: float32 / complex64 rtol=1e-5, atol=1e-5 (XLA may reorder sums and
uses its own transcendental approximations); bfloat16 / float16 rtol=1.6e-2,
atol=1e-2 (about one bf16 ulp after an f32 computation); integers and bools
exact. A float result outside the tolerance still counts as equal when tpu is
the more accurate of the two against the float64 result (closer_to_exact).
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

import torch_tpu

Overrides = dict[tuple[str, str], tuple[float, float]]


def op_id(op: Any) -> str:
    """An OpInfo's name, with its variant: "div.floor_rounding"."""
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def as_tree(r: Any) -> Any:
    """torch.return_types structseqs -> plain tuples, for assert_close."""
    if isinstance(r, tuple) and type(r) is not tuple:
        return tuple(r)
    return r


def to_tpu(x: Any) -> Any:
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def to_cpu(x: Any) -> Any:
    return x.cpu() if isinstance(x, torch.Tensor) else x


def grad_leaf(device: str):
    """A sample transform: each tensor as a fresh autograd leaf on `device`
    (cloned on CPU: some samples share tensors between calls)."""
    def f(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        t = x.detach().to(device)
        if device == "cpu":
            t = t.clone()
        return t.requires_grad_(x.requires_grad)
    return f


def fallbacks() -> dict[str, int]:
    """CPU-fallback counts by op name (torch_tpu.debug.stats()['fallbacks'])."""
    return dict(torch_tpu.debug.stats()["fallbacks"])


def fell_back(before: dict[str, int]) -> set[str]:
    """The ops whose fallback count moved since `before`."""
    return {k for k, v in fallbacks().items() if v != before.get(k, 0)}


def random_sample(sample: Any) -> bool:
    """A sample whose result is random by a keyword (dropout_p > 0)."""
    return bool(sample.kwargs.get("dropout_p", 0.0))


def complex_sample(sample: Any) -> bool:
    """A sample with a complex tensor among its inputs."""
    return any(isinstance(t, torch.Tensor) and t.is_complex()
               for t in pytree.tree_leaves((sample.input, sample.args, sample.kwargs)))


def tolerance(op_name: str, dname: str, result_dtype: torch.dtype,
              overrides: Overrides | None = None) -> dict[str, float]:
    """Tolerance by the sample dtype, or by the result dtype for integer
    samples of float-valued ops (sqrt of int64 gives float32)."""
    if overrides and (op_name, dname) in overrides:
        rtol, atol = overrides[(op_name, dname)]
    elif not (result_dtype.is_floating_point or result_dtype.is_complex):
        rtol, atol = 0.0, 0.0
    elif dname in ("bfloat16", "float16") or result_dtype in (torch.bfloat16, torch.float16):
        rtol, atol = 1.6e-2, 1e-2
    else:
        rtol, atol = 1e-5, 1e-5
    return {"rtol": rtol, "atol": atol}


def compare(op_name: str, dname: str, actual: Any, expected: Any,
            overrides: Overrides | None = None) -> None:
    """Raises AssertionError when tpu's result (moved to CPU) differs from CPU's."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"result structure differs: {a_spec} vs {e_spec}"
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, equal_nan=True,
                                       **tolerance(op_name, dname, e.dtype, overrides))
        else:
            assert a == e, f"{a!r} != {e!r}"


def in_float64(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().double()
    if isinstance(x, torch.Tensor) and x.is_complex():
        return x.detach().to(torch.complex128)
    return x


def closer_to_exact(actual: Any, expected: Any, exact: Any, strict_integers: bool = False) -> bool:
    """True when tpu's result, where it differs from CPU's by more than the
    tolerance, is the more accurate of the two: against the float64 result
    its total error is no larger than CPU's and its worst error at most CPU's
    worst plus one atol. A low-precision CPU kernel that rounds partial sums
    (bf16 convolutions, a matmul blocked by the host's BLAS) is itself off by
    ulps that depend on the host's CPU; XLA rounds once. Where CPU gives NaN
    and the float64 result does not, tpu must be within the dtype's tolerance
    of the float64 result. Integer and bool
    results are ignored here (the OpInfo tests' convention) unless
    strict_integers: then they must be equal."""
    a_leaves, e_leaves = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    x_leaves = pytree.tree_leaves(exact)
    if not len(a_leaves) == len(e_leaves) == len(x_leaves):
        return False
    for a, e, x in zip(a_leaves, e_leaves, x_leaves):
        if not isinstance(e, torch.Tensor):
            continue
        if not (e.is_floating_point() or e.is_complex()):
            if strict_integers and not (isinstance(a, torch.Tensor) and torch.equal(a, e)):
                return False
            continue
        if not isinstance(x, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype:
            return False
        # CPU NaNs where the float64 result has a number are CPU's errors (its
        # bfloat16 matrix_exp): there tpu must match the float64 result
        # within the dtype's tolerance.
        cpu_wrong = e.isnan() & ~x.isnan()
        if not torch.equal(a.isnan(), x.isnan()) or not torch.equal(e.isnan() & ~cpu_wrong, x.isnan()):
            return False
        hi = torch.complex128 if e.is_complex() else torch.float64
        a64, x64 = a.to(hi), x.to(hi)
        tol = tolerance("", "bfloat16" if e.dtype == torch.bfloat16 else "float32", e.dtype)
        if cpu_wrong.any() and not torch.allclose(a64[cpu_wrong], x64[cpu_wrong], **tol):
            return False
        if not torch.equal(a64[~x.isfinite()].nan_to_num(), x64[~x.isfinite()].nan_to_num()):
            return False
        finite = x.isfinite() & ~cpu_wrong
        err_a = (a64 - x64)[finite].abs()
        err_e = (e.to(hi) - x64)[finite].abs()
        atol = tol["atol"]
        if err_a.numel() and (err_a.sum() > err_e.sum() or err_a.max() > err_e.max() + atol):
            return False
    return True


def float64_result(op: Any, sample: Any) -> Any:
    """The op on the sample's float tensors cast to float64 (CPU), or None."""
    s = sample.transform(in_float64)
    try:
        return pytree.tree_map(in_float64, as_tree(op(s.input, *s.args, **s.kwargs)))
    except Exception:
        return None
