"""OpInfo sweep: PyTorch's own sample inputs, run on tpu and on CPU.

For every op_db entry below (ops that have a native lowering rule), each of
the first MAX_SAMPLES sample inputs runs on CPU and on tpu; results are
compared with torch.testing.assert_close and the CPU-fallback counter is
watched during the tpu call. A table (op, dtype, passed/total, native) is
printed at the end of the session (tests/ops/conftest.py).

Tolerances: float32 rtol=1e-5, atol=1e-5 (XLA may reorder sums and uses
its own transcendental approximations); bfloat16 rtol=1.6e-2, atol=1e-2
(about one bf16 ulp after an f32 computation); integers and bools exact.
A few ops get wider tolerances in TOLERANCES, with the reason.

Regressions fail: EXPECTED lists the (op, dtype) pairs whose samples all
pass; for them a wrong result, an exception, or a CPU fallback (when the
pair is listed as native) fails the test. Pairs not listed are run and
reported, and xfail when a sample fails.
"""
from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch_tpu
from torch.utils import _pytree as pytree

common_methods_invocations = pytest.importorskip(
    "torch.testing._internal.common_methods_invocations",
    reason="PyTorch's OpInfo database needs the 'expecttest' package")
op_db = common_methods_invocations.op_db

MAX_SAMPLES = int(os.environ.get("TORCH_TPU_OPINFO_SAMPLES", "16"))

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}

# op_db entries (name, variant_test_name) whose aten ops have native rules.
OPS: list[tuple[str, str]] = [
    *[(n, "") for n in """
        add sub rsub mul true_divide floor_divide remainder fmod pow maximum minimum atan2
        hypot copysign eq ne lt le gt ge logical_and logical_or logical_xor logical_not
        bitwise_and bitwise_or bitwise_xor bitwise_not exp exp2 expm1 log log1p log2 log10
        sqrt rsqrt sin cos tan tanh asin acos atan sinh cosh asinh acosh atanh sigmoid erf
        erfinv lgamma digamma abs neg floor ceil round trunc frac sign sgn reciprocal isnan
        isinf isfinite nn.functional.relu nn.functional.silu where clamp clamp_min clamp_max
        sum mean prod amax amin argmax argmin var std var_mean std_mean any all logsumexp
        softmax log_softmax _softmax_backward_data linalg.vector_norm mm bmm addmm addbmm
        baddbmm addmv mv dot vdot matmul nn.functional.linear cat stack hstack vstack clone
        contiguous nn.functional.embedding index_select fill zero_ cumsum cumprod flip roll
        tril triu gather scatter scatter_add index_add masked_fill repeat arange linspace eye
        """.split()],
    ("div", "no_rounding_mode"), ("div", "trunc_rounding"), ("div", "floor_rounding"),
    ("max", "reduction_with_dim"), ("max", "reduction_no_dim"), ("max", "binary"),
    ("min", "reduction_with_dim"), ("min", "reduction_no_dim"), ("min", "binary"),
    ("var", "unbiased"), ("std", "unbiased"), ("softmax", "with_dtype"),
    ("log_softmax", "with_dtype"), ("nn.functional.pad", "constant"),
    # Partly or wholly through the CPU fallback today (no rule for the overload
    # or the inputs): listed so the table shows them.
    ("round", "decimals_0"), ("round", "decimals_3"), ("round", "decimals_neg_3"),
    ("scatter_reduce", "sum"), ("scatter_reduce", "prod"), ("scatter_reduce", "amax"),
]

# (op id, dtype) -> (rtol, atol) overrides, with the reason.
TOLERANCES: dict[tuple[str, str], tuple[float, float]] = {
    # CPU's addbmm runs one addmm_ per batch and rounds the running sum to
    # bf16 each time; tpu accumulates all batches in f32 and rounds once (closer
    # to the exact result), so the CPU reference itself is off by a few ulps.
    ("addbmm", "bfloat16"): (1.6e-2, 1.0),
}

# (op id, dtype): "native" = every sample passes with no CPU fallback;
# "correct" = every sample passes, some through the CPU fallback (a rule
# raising Unsupported for those inputs).
EXPECTED: dict[tuple[str, str], str] = {
}


def _op_id(op: Any) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _cases() -> list[Any]:
    by_key = {(o.name, o.variant_test_name): o for o in op_db}
    cases = []
    for key in OPS:
        op = by_key[key]
        supported = op.supported_dtypes("cpu")
        for dname, dtype in DTYPES.items():
            if dtype in supported:
                cases.append(pytest.param(op, dname, id=f"{_op_id(op)}-{dname}"))
    return cases


def _to_tpu(x: Any) -> Any:
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def _to_cpu(x: Any) -> Any:
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _fallbacks() -> dict[str, int]:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def _tolerance(op_id: str, dname: str, result_dtype: torch.dtype) -> dict[str, float]:
    """Tolerance by the sample dtype, or by the result dtype for integer
    samples of float-valued ops (sqrt of int64 gives float32)."""
    if (op_id, dname) in TOLERANCES:
        rtol, atol = TOLERANCES[(op_id, dname)]
    elif not (result_dtype.is_floating_point or result_dtype.is_complex):
        rtol, atol = 0.0, 0.0
    elif dname == "bfloat16" or result_dtype in (torch.bfloat16, torch.float16):
        rtol, atol = 1.6e-2, 1e-2
    else:
        rtol, atol = 1e-5, 1e-5
    return {"rtol": rtol, "atol": atol}


def _compare(op_id: str, dname: str, actual: Any, expected: Any) -> None:
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"result structure differs: {a_spec} vs {e_spec}"
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, equal_nan=True, **_tolerance(op_id, dname, e.dtype))
        else:
            assert a == e, f"{a!r} != {e!r}"


def _as_tree(r: Any) -> Any:
    # torch.return_types structseqs -> plain tuples, for assert_close.
    if isinstance(r, tuple) and type(r) is not tuple:
        return tuple(r)
    return r


@pytest.mark.parametrize("op,dname", _cases())
def test_opinfo(op: Any, dname: str, opinfo_results: dict) -> None:
    dtype = DTYPES[dname]
    op_id = _op_id(op)
    row = opinfo_results.setdefault(
        (op_id, dname),
        {"passed": 0, "total": 0, "skipped": 0, "fallback": 0, "fallback_ops": set(), "failed": []})
    torch.manual_seed(0)  # sample inputs are random: keep the sweep deterministic
    # reference_inputs = sample_inputs plus extremal values (nan, inf, -0.0) and
    # larger cases where the OpInfo defines them.
    samples = op.reference_inputs("cpu", dtype, requires_grad=False)
    for i, sample in enumerate(samples):
        if i >= MAX_SAMPLES:
            break
        row["total"] += 1
        # Move to tpu before the CPU run: some ops (fill, zero_) write their input.
        tpu_sample = sample.transform(_to_tpu)
        if "device" in tpu_sample.kwargs:
            tpu_sample.kwargs["device"] = "tpu"
        try:
            expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # CPU rejects the sample (an error-input sample)
            row["skipped"] += 1
            continue
        if any(isinstance(t, torch.Tensor) and t.is_complex()
               for t in pytree.tree_leaves(_as_tree(expected))):
            row["skipped"] += 1  # complex result (a complex Python scalar): no complex on tpu
            continue
        before = _fallbacks()
        try:
            actual = op(tpu_sample.input, *tpu_sample.args, **tpu_sample.kwargs)
            actual = pytree.tree_map(_to_cpu, _as_tree(actual))
        except Exception as e:
            row["failed"].append(f"sample {i} ({sample.summary() if hasattr(sample, 'summary') else sample}): "
                                 f"{type(e).__name__}: {str(e)[:300]}")
            continue
        after = _fallbacks()
        fell_back = {k for k, v in after.items() if v != before.get(k, 0)}
        if fell_back:
            row["fallback"] += 1
            row["fallback_ops"] |= fell_back
        try:
            _compare(op_id, dname, actual, _as_tree(expected))
        except AssertionError as e:
            row["failed"].append(f"sample {i} ({sample}): {str(e)[:600]}")
            continue
        row["passed"] += 1

    checked = row["total"] - row["skipped"]
    expectation = EXPECTED.get((op_id, dname))
    problems = list(row["failed"])
    if expectation == "native" and row["fallback"]:
        problems.append(f"expected native, but fell back to CPU: {sorted(row['fallback_ops'])}")
    if expectation is None:
        if problems:
            pytest.xfail(f"not in EXPECTED; {len(problems)} failing: " + problems[0][:500])
        return
    assert not problems, f"{op_id} {dname}: {checked - row['passed']} of {checked} samples fail:\n" + \
        "\n".join(problems)
