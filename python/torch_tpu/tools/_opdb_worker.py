"""The op_db sweep's worker process (torch_tpu.tools.opdb_sweep runs it).

Reads a JSON list of [entry id, dtype, direction] tasks on stdin and, for
each, prints "@@opdb start KEY" then "@@opdb result {json}" on stdout.
"""
from __future__ import annotations

import json
import sys
import time
import warnings
from typing import Any

import torch
from torch.utils import _pytree as pytree

import torch_tpu  # noqa: F401  (registers the device)

from .opinfo_compare import (as_tree, closer_to_exact, compare, fallbacks, fell_back, grad_leaf,
                             float64_result, in_float64, op_id, random_sample, to_cpu, to_tpu)

_PROTO = "@@opdb "
DRAWS = 6  # draws per device when comparing a random op's distribution
# Ops that return uninitialized memory: compared by shape and dtype only.
UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
                 "empty_permuted"}


class _Skip(Exception):
    pass


def _emit(kind: str, payload: str) -> None:
    sys.stdout.write(f"{_PROTO}{kind} {payload}\n")
    sys.stdout.flush()


def _leaves(sample: Any) -> list[Any]:
    return pytree.tree_leaves((sample.input, sample.args, sample.kwargs))


def _is_sparse(sample: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in _leaves(sample))


def _clone(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _view_to_tpu(x: Any) -> Any:
    """x on tpu; a view keeps its storage, strides and offset (as_strided samples reach
    outside the view: op_db's own tests make them on the device)."""
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.requires_grad:
        return to_tpu(x)
    if x.device.type != "cpu":  # already moved (the backward sweep's grad_leaf("tpu"))
        return x
    numel = x.untyped_storage().nbytes() // max(x.element_size(), 1)
    if x.is_contiguous() and x.storage_offset() == 0 and numel == x.numel():
        return to_tpu(x)
    whole = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), 0, (numel,), (1,))
    return whole.to("tpu").as_strided(x.shape, x.stride(), x.storage_offset())


def _on_tpu(sample: Any) -> Any:
    """The sample moved to tpu (a device= keyword too), or _Skip when nothing of it is on tpu."""
    s = sample.transform(_view_to_tpu)
    if "device" in s.kwargs:
        s.kwargs["device"] = "tpu"
    elif not any(isinstance(t, torch.Tensor) for t in _leaves(s)):
        raise _Skip("no tensor input and no device= keyword: nothing runs on tpu")
    return s


def _input_on_tpu(sample: Any) -> Any:
    s = sample.transform(_clone)
    s.input = to_tpu(s.input)
    return s


def _names_cpu(sample: Any) -> bool:
    """The sample asks for a CPU result (x.to("cpu"), device=torch.device("cpu"))."""
    return any((isinstance(x, str) and x.startswith("cpu")) or
               (isinstance(x, torch.device) and x.type == "cpu") for x in _leaves(sample))


def _call(op: Any, sample: Any, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return as_tree(op(sample.input, *sample.args, **sample.kwargs))


def _compared(op: Any, sample: Any, layouts: list | None = None) -> Any:
    """What op_db's test_compare_cpu compares: the result through the sample's
    output_process_fn_grad (linalg samples use it for results defined up to
    sign or phase, e.g. |eigenvectors| of eigh); seeded like _call. `layouts`
    collects the raw result's layouts (to_sparse's processing densifies it)."""
    torch.manual_seed(0)
    raw = op(sample.input, *sample.args, **sample.kwargs)
    if layouts is not None:
        layouts.extend(t.layout for t in _tensors(as_tree(raw)))
    return as_tree(sample.output_process_fn_grad(raw))


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _same(a: Any, b: Any) -> bool:
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x.nan_to_num(), y.nan_to_num()):
                return False
        elif x != y:
            return False
    return True


def _metadata(actual: Any, expected: Any) -> None:
    """Structure, shapes and dtypes equal (for uninitialized and random results)."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"result structure differs: {a_spec} vs {e_spec}"
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            assert a.shape == e.shape and a.dtype == e.dtype, \
                f"shape/dtype {tuple(a.shape)} {a.dtype} vs CPU {tuple(e.shape)} {e.dtype}"


def _distribution(a: torch.Tensor, e: torch.Tensor) -> None:
    """tpu draws `a` against CPU draws `e` (values pooled over draws and elements): a
    two-sample Kolmogorov-Smirnov test at alpha = 0.001 (any distribution: heavy tails,
    discrete values; for discrete ones the test is conservative)."""
    a, e = a.detach().flatten(), e.detach().flatten()
    if a.is_complex():
        a, e = torch.view_as_real(a).flatten(), torch.view_as_real(e).flatten()
    a, e = a.double(), e.double()
    a, e = a[~a.isnan()].sort().values, e[~e.isnan()].sort().values
    n, m = a.numel(), e.numel()
    if min(n, m) < 24:
        return
    points = torch.cat([a, e])
    cdf_a = torch.searchsorted(a, points, right=True).double() / n
    cdf_e = torch.searchsorted(e, points, right=True).double() / m
    d = (cdf_a - cdf_e).abs().max().item()
    critical = 1.95 * ((n + m) / (n * m)) ** 0.5
    assert d <= critical, (f"distribution differs from CPU's (KS D={d:.3f} > {critical:.3f}; "
                           f"medians {a[n // 2].item():.4g} vs {e[m // 2].item():.4g})")


class _unseeded:  # noqa: N801  (a context manager used like a function)
    """op_db wraps random ops in wrapper_set_seed (torch.manual_seed(42) before each call, so
    that CPU's result is reproducible); inside this block that wrapper only calls the op, so
    that the seeds the sweep sets are the ones the op draws with."""

    def __init__(self, op: Any) -> None:
        code = getattr(op.op, "__code__", None)
        self.globals = op.op.__globals__ if code and "wrapper_set_seed" in code.co_names else None

    def __enter__(self) -> None:
        if self.globals is not None:
            self.saved = self.globals["wrapper_set_seed"]
            self.globals["wrapper_set_seed"] = lambda f, *a, **k: f(*a, **k)

    def __exit__(self, *exc: object) -> None:
        if self.globals is not None:
            self.globals["wrapper_set_seed"] = self.saved


def _random_entry(op: Any, sample: Any) -> bool:
    """CPU's result changes with the seed (or without one): a random op."""
    try:
        with _unseeded(op):
            first = _call(op, sample.transform(_clone), 0)
            again, other = _call(op, sample.transform(_clone), 0), _call(op, sample.transform(_clone), 1)
    except Exception:
        return False
    return not _same(again, first) or not _same(other, first)


# Feature dropout draws once per channel: the values of one channel are kept
# or dropped together, so pooling every element would count one draw many
# times (the KS test's critical value assumes independent values). Their
# distribution is compared on one element per channel: op -> the number of
# trailing (spatial) dims dropped together, None: all dims after the first two.
_PER_CHANNEL = {"nn.functional.dropout2d": 2, "nn.functional.dropout3d": 3,
                "nn.functional.feature_alpha_dropout": None}


def _one_per_channel(op: Any):
    if op.name not in _PER_CHANNEL:
        return lambda t: t
    spatial = _PER_CHANNEL[op.name]

    def first(t: torch.Tensor) -> torch.Tensor:
        n = spatial if spatial is not None else max(t.dim() - 2, 0)
        n = min(n, max(t.dim() - 1, 0))
        return t[(...,) + (0,) * n] if n and t.numel() else t
    return first


MORE_SEEDS = 42  # seeds tried when the first DRAWS happen to agree


def _varies_with_seed(op: Any, pristine: Any, tpu: list) -> bool:
    """Some seed gives another tpu result. An op whose result depends on its
    draws only at rare values (fractional_max_pool2d at an integer pooling
    ratio: only the rounding of the offsets can move a window) may agree over
    the first DRAWS seeds, as CPU's does with other seeds: more are tried."""
    if any(not _same(t, tpu[0]) for t in tpu[1:]):
        return True
    return any(not _same(pytree.tree_map(to_cpu, _call(op, _on_tpu(pristine), s)), tpu[0])
               for s in range(DRAWS, DRAWS + MORE_SEEDS))


def _compare_random(op: Any, pristine: Any) -> None:
    """Random op: shapes/dtypes, seeding semantics and distribution over DRAWS seeds."""
    cpu = [_call(op, pristine.transform(_clone), s) for s in range(DRAWS)]
    tpu = [pytree.tree_map(to_cpu, _call(op, _on_tpu(pristine), s)) for s in range(DRAWS)]
    for a, e in zip(tpu, cpu):
        _metadata(a, e)
    seeded_cpu = _same(_call(op, pristine.transform(_clone), 0), cpu[0])
    if seeded_cpu:
        again = pytree.tree_map(to_cpu, _call(op, _on_tpu(pristine), 0))
        assert _same(again, tpu[0]), "the same torch.manual_seed gave a different tpu result"
        if any(not _same(c, cpu[0]) for c in cpu[1:]):
            assert _varies_with_seed(op, pristine, tpu), \
                f"{DRAWS + MORE_SEEDS} different seeds gave the same tpu result"
    one = _one_per_channel(op)
    for k in range(len(_tensors(cpu[0]))):
        e = torch.cat([one(_tensors(r)[k]).flatten() for r in cpu])
        a = torch.cat([one(_tensors(r)[k]).flatten() for r in tpu])
        if e.dtype == torch.bool:
            e, a = e.long(), a.long()
        _distribution(a, e)


def _forward_sample(op: Any, sample: Any, dname: str, used: set[str]) -> tuple[str, str]:
    """(status, why) of one forward sample; `used` collects the fallback ops."""
    if _is_sparse(sample):
        return "sparse", "sparse layout"
    if random_sample(sample):
        return "skip", "random by keyword (dropout_p)"
    pristine = sample.transform(_clone)
    tpu_sample = _on_tpu(sample)  # before the CPU run: some ops write their input
    layouts: list = []
    try:
        expected = _compared(op, sample, layouts)
    except Exception:
        return "skip", "CPU rejects the sample"
    if any(layout != torch.strided for layout in layouts):
        return "sparse", "sparse result layout"
    before = fallbacks()
    try:
        try:
            result = _compared(op, tpu_sample)
        except Exception as e:
            if "cpu" not in str(e):
                raise
            # An argument that must stay on CPU (tensor_split's indices tensor): op_db's own
            # tests make it on CPU whatever the device; here only the input moves.
            result = _compared(op, _input_on_tpu(pristine))
        on_cpu = [t for t in _tensors(result) if t.device.type != "tpu"]
        actual = pytree.tree_map(to_cpu, result)
    except Exception as e:
        used |= fell_back(before)
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    used |= fell_back(before)
    if on_cpu and not _names_cpu(sample):
        return "fail", f"result tensor on {on_cpu[0].device}, not tpu"
    try:
        if op.name in UNINITIALIZED:
            _metadata(actual, expected)
            return "pass", ""
        compare(op_id(op), dname, actual, expected)
        return "pass", ""
    except AssertionError as err:
        first = str(err).strip().splitlines()[0][:160]
    if _random_entry(op, pristine):
        try:
            with _unseeded(op):
                _compare_random(op, pristine)
            return "pass", "random"
        except AssertionError as err:
            return "fail", "random: " + str(err).splitlines()[0][:150]
        except Exception as err:
            return "error", f"random: {type(err).__name__}: {str(err)[:150]}"
    if _ties_only(op, pristine, actual, expected):
        return "pass", "ties ordered differently (an unstable sort: either order is right)"
    exact = float64_result(op, pristine) if dname != "int64" else None
    if exact is not None and closer_to_exact(actual, expected, exact, strict_integers=True):
        return "pass", "closer to float64 than CPU"
    return "fail", first


# Ops whose indices may order equal values either way unless stable=True
# (PyTorch documents the order of ties as unspecified): name -> position of
# the `dim` argument after the input.
_TIE_ORDER_DIM = {"sort": 0, "argsort": 0, "topk": 1}


def _ties_only(op: Any, sample: Any, actual: Any, expected: Any) -> bool:
    """True when tpu's indices differ from CPU's only among equal values:
    the values agree, and the input gathered at tpu's indices equals it
    gathered at CPU's (so each index picks a value CPU put at that place)."""
    if op.name not in _TIE_ORDER_DIM or sample.kwargs.get("stable"):
        return False
    x = sample.input
    pos = _TIE_ORDER_DIM[op.name]
    dim = sample.kwargs.get("dim", sample.args[pos] if len(sample.args) > pos else -1)
    a_idx = actual[1] if isinstance(actual, (tuple, list)) else actual
    e_idx = expected[1] if isinstance(expected, (tuple, list)) else expected
    if isinstance(expected, (tuple, list)) and not torch.equal(actual[0], expected[0]):
        return False
    if x.dim() == 0 or a_idx.shape != e_idx.shape or a_idx.dtype != e_idx.dtype:
        return False
    return torch.equal(x.gather(dim, a_idx), x.gather(dim, e_idx)) and _distinct(a_idx, dim)


def _distinct(idx: torch.Tensor, dim: int) -> bool:
    """No index repeats along dim (a permutation, or topk's k distinct positions)."""
    s = idx.sort(dim).values
    return bool((s.diff(dim=dim) != 0).all()) if s.shape[dim] > 1 else True


# ----------------------------------------------------------------------------- backward

def _grad_run(op: Any, sample: Any, cotangents: list | None, device: str) -> tuple[Any, Any]:
    out = sample.output_process_fn_grad(_call(op, sample))
    outs = [t for t in pytree.tree_leaves(as_tree(out))
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
    inputs = [t for t in _leaves(sample) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not inputs:
        return None, None
    if cotangents is None:
        gen = torch.Generator().manual_seed(1)
        cotangents = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
    grads = torch.autograd.grad(outs, inputs, [c.to(device) for c in cotangents], allow_unused=True)
    return cotangents, [None if g is None else g.cpu() for g in grads]


def _backward_sample(op: Any, sample: Any, dname: str, used: set[str]) -> tuple[str, str]:
    if _is_sparse(sample):
        return "sparse", "sparse layout"
    if random_sample(sample):
        return "skip", "random by keyword (dropout_p)"
    if _names_cpu(sample):
        return "skip", "the sample asks for a CPU result"
    cpu_sample = sample.transform(grad_leaf("cpu"))
    tpu_sample = _on_tpu(sample.transform(grad_leaf("tpu")))
    try:
        if any(t.layout != torch.strided for t in _tensors(_call(op, sample.transform(_clone)))):
            return "sparse", "sparse result layout"
        cotangents, expected = _grad_run(op, cpu_sample, None, "cpu")
    except Exception:
        return "skip", "CPU rejects the sample"
    if expected is None:
        return "skip", "no differentiable input or output"
    before = fallbacks()
    try:
        try:
            _, actual = _grad_run(op, tpu_sample, cotangents, "tpu")
        except Exception as e:
            if "cpu" not in str(e):
                raise
            # An argument that must stay on CPU (see _forward_sample): only the input moves.
            only_input = sample.transform(grad_leaf("cpu"))
            only_input.input = grad_leaf("tpu")(sample.input)
            _, actual = _grad_run(op, only_input, cotangents, "tpu")
    except Exception as e:
        used |= fell_back(before)
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    used |= fell_back(before)
    if actual is None:
        return "fail", "tpu output is not differentiable, CPU's is"
    actual = [torch.zeros_like(e) if a is None and e is not None else a for a, e in zip(actual, expected)]
    expected = [torch.zeros_like(a) if e is None and a is not None else e for a, e in zip(actual, expected)]
    try:
        compare(op_id(op), dname, actual, expected)
        return "pass", ""
    except AssertionError as err:
        first = str(err).strip().splitlines()[0][:160]
    if _random_entry(op, sample.transform(grad_leaf("cpu"))):
        return "skip", "random op: gradients depend on the draw"
    exact = _float64_grads(op, sample, cotangents)
    if exact is not None and len(exact) == len(expected):
        exact = [torch.zeros_like(e, dtype=torch.float64) if x is None and e is not None else x
                 for x, e in zip(exact, expected)]
    if exact is not None and closer_to_exact(actual, expected, exact):
        return "pass", "grad closer to float64 than CPU"
    return "fail", "grad: " + first


def _float64_grads(op: Any, sample: Any, cotangents: list) -> list | None:
    """The gradients of the same cotangents through the op in float64 (CPU), or None."""
    def leaf64(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        return in_float64(x).clone().requires_grad_(x.requires_grad and x.is_floating_point())
    try:
        _, grads = _grad_run(op, sample.transform(leaf64), [c.double() for c in cotangents], "cpu")
    except Exception:
        return None
    return grads


# ----------------------------------------------------------------------------- tasks

def _samples(op: Any, dtype: torch.dtype, direction: str, limit: int) -> list[Any]:
    torch.manual_seed(0)  # sample inputs are random: keep the sweep deterministic
    out = []
    for s in op.sample_inputs("cpu", dtype, requires_grad=direction == "backward"):
        out.append(s)
        if len(out) >= limit:
            break
    return out


def run_task(op: Any, dname: str, direction: str, limit: int) -> dict[str, Any]:
    dtype = getattr(torch, dname)
    try:
        samples = _samples(op, dtype, direction, limit)
    except Exception as e:
        return {"status": "skip", "why": f"sample_inputs raised {type(e).__name__}", "native": False,
                "checked": 0, "passed": 0, "fallback_ops": []}
    run = _forward_sample if direction == "forward" else _backward_sample
    used: set[str] = set()
    seen: dict[str, list[str]] = {}
    for sample in samples:
        try:
            status, why = run(op, sample, dname, used)
        except _Skip as e:
            status, why = "skip", str(e)
        except Exception as e:  # the harness on this sample (e.g. a sample that cannot move)
            status, why = "error", f"{type(e).__name__}: {str(e)[:160]}"
        seen.setdefault(status, []).append(why)
    checked = sum(len(v) for k, v in seen.items() if k in ("pass", "fail", "error"))
    passed = len(seen.get("pass", []))
    for status in ("error", "fail"):
        if status in seen:
            break
    else:
        status = "pass" if passed else ("sparse" if "sparse" in seen else "skip")
    why = (seen.get(status) or seen.get("skip") or [""])[0]
    if status == "pass":
        why = "random" if "random" in seen["pass"] else ""
    return {"status": status, "why": why, "native": not used and checked > 0, "checked": checked,
            "passed": passed, "fallback_ops": sorted(used)}


def worker_main(limit: int) -> int:
    tasks = json.loads(sys.stdin.read())
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from torch.testing._internal.common_methods_invocations import op_db
    by_id = {op_id(o): o for o in op_db}
    for name, dname, direction in tasks:
        key = f"{name}:{dname}:{direction}"
        _emit("start", key)
        t0 = time.monotonic()
        r = run_task(by_id[name], dname, direction, limit)
        r.update(key=key, op=name, dtype=dname, dir=direction, seconds=round(time.monotonic() - t0, 2))
        _emit("result", json.dumps(r))
    return 0
