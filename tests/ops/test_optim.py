"""_foreach_* ops, torch.optim (foreach and fused), clip_grad_norm_ and
torch._grouped_mm on tpu against the same calls on CPU.

Optimizer checks feed both devices the same gradients, so they compare the
optimizer step alone (not forward/backward rounding).
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch_tpu

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

F32_TOL = {"rtol": 1e-5, "atol": 1e-6}
BF16_TOL = {"rtol": 1.6e-2, "atol": 1e-2}
# The dispatcher does not pass Scalar[] arguments to rules yet: those calls
# (and only those) run through the CPU fallback.
SCALAR_LIST_OPS = ("ScalarList",)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)


def _fallbacks() -> dict[str, int]:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def _new_fallbacks(before: dict[str, int]) -> set[str]:
    return {k for k, v in _fallbacks().items() if v != before.get(k, 0)}


def _tpu(xs: Any) -> Any:
    if isinstance(xs, torch.Tensor):
        return xs.to("tpu")
    if isinstance(xs, (list, tuple)):
        return type(xs)(_tpu(x) for x in xs)
    return xs


def _cpu(xs: Any) -> Any:
    if isinstance(xs, torch.Tensor):
        return xs.cpu()
    if isinstance(xs, (list, tuple)):
        return [_cpu(x) for x in xs]
    return xs


def tensors(dtype: torch.dtype = torch.float32, positive: bool = False) -> list[torch.Tensor]:
    """A list of mixed shapes, with a 0-d, an empty tensor and a NaN."""
    shapes = [(3, 4), (5,), (), (0, 3), (2, 1, 3)]
    out = [torch.randn(s) for s in shapes]
    out[0][1, 2] = float("nan")
    if positive:
        out = [x.abs() + 0.5 for x in out]
    return [x.to(dtype) for x in out]


# ---------------------------------------------------------------- foreach ops

# name -> (number of tensor lists, fn(*lists)); each fn is also run in place
# when it names a torch._foreach_* function with an in-place variant.
FOREACH: dict[str, tuple[int, Callable[..., Any], bool]] = {
    # binary, List / Scalar / Tensor overloads
    "add.List": (2, lambda a, b: torch._foreach_add(a, b, alpha=-0.5), False),
    "add.Scalar": (1, lambda a: torch._foreach_add(a, 1.5), False),
    "add.Tensor": (1, lambda a: torch._foreach_add(a, torch.tensor(2.0, device=a[0].device),
                                                   alpha=3), False),
    "add.Tensor_cpu0d": (1, lambda a: torch._foreach_add(a, torch.tensor(2.0), alpha=0.5), False),
    "sub.List": (2, lambda a, b: torch._foreach_sub(a, b, alpha=2), False),
    "sub.Scalar": (1, lambda a: torch._foreach_sub(a, 0.25), False),
    "mul.List": (2, torch._foreach_mul, False),
    "mul.Scalar": (1, lambda a: torch._foreach_mul(a, -3), False),
    "mul.Tensor": (1, lambda a: torch._foreach_mul(a, torch.tensor(0.5, device=a[0].device)), False),
    "div.List": (2, torch._foreach_div, True),
    "div.Scalar": (1, lambda a: torch._foreach_div(a, 4.0), False),
    "div.Tensor": (1, lambda a: torch._foreach_div(a, torch.tensor(3.0, device=a[0].device)), False),
    "maximum.List": (2, torch._foreach_maximum, False),
    "maximum.Scalar": (1, lambda a: torch._foreach_maximum(a, 0.1), False),
    "minimum.List": (2, torch._foreach_minimum, False),
    "minimum.Scalar": (1, lambda a: torch._foreach_minimum(a, 0.1), False),
    "clamp_min.List": (2, torch._foreach_clamp_min, False),
    "clamp_min.Scalar": (1, lambda a: torch._foreach_clamp_min(a, -0.2), False),
    "clamp_max.Scalar": (1, lambda a: torch._foreach_clamp_max(a, 0.3), False),
    "pow.List": (2, lambda a, b: torch._foreach_pow(a, b), True),
    "pow.Scalar": (1, lambda a: torch._foreach_pow(a, 2.0), False),
    "pow.ScalarAndTensor": (1, lambda a: torch._foreach_pow(0.9, a), False),
    # three operands
    "lerp.List": (3, lambda a, b, w: torch._foreach_lerp(a, b, w), False),
    "lerp.Scalar": (2, lambda a, b: torch._foreach_lerp(a, b, 0.3), False),
    "lerp.Scalar_high": (2, lambda a, b: torch._foreach_lerp(a, b, 0.8), False),
    "addcmul.Scalar": (3, lambda a, b, c: torch._foreach_addcmul(a, b, c, 0.5), False),
    "addcmul.default": (3, lambda a, b, c: torch._foreach_addcmul(a, b, c), False),
    "addcdiv.Scalar": (3, lambda a, b, c: torch._foreach_addcdiv(a, b, c, -0.5), True),
    # unary
    "sqrt": (1, torch._foreach_sqrt, True),
    "neg": (1, torch._foreach_neg, False),
    "abs": (1, torch._foreach_abs, False),
    "exp": (1, torch._foreach_exp, False),
    "reciprocal": (1, torch._foreach_reciprocal, True),
    "sign": (1, torch._foreach_sign, False),
    "log": (1, torch._foreach_log, True),
    "sigmoid": (1, torch._foreach_sigmoid, False),
    "tanh": (1, torch._foreach_tanh, False),
    # reductions
    "norm": (1, torch._foreach_norm, False),
    "norm.1": (1, lambda a: torch._foreach_norm(a, 1), False),
    "norm.inf": (1, lambda a: torch._foreach_norm([x for x in a if x.numel()], float("inf")),
                 False),
    "norm.3": (1, lambda a: torch._foreach_norm(a, 3.0), True),
}
# Functional forms with an in-place twin (name -> in-place fn).
INPLACE = {
    "add.List": lambda a, b: torch._foreach_add_(a, b, alpha=-0.5),
    "add.Scalar": lambda a: torch._foreach_add_(a, 1.5),
    "add.Tensor": lambda a: torch._foreach_add_(a, torch.tensor(2.0, device=a[0].device), alpha=3),
    "sub.List": lambda a, b: torch._foreach_sub_(a, b, alpha=2),
    "mul.Scalar": lambda a: torch._foreach_mul_(a, -3),
    "mul.Tensor": lambda a: torch._foreach_mul_(a, torch.tensor(0.5, device=a[0].device)),
    "div.List": lambda a, b: torch._foreach_div_(a, b),
    "maximum.List": lambda a, b: torch._foreach_maximum_(a, b),
    "clamp_min.Scalar": lambda a: torch._foreach_clamp_min_(a, -0.2),
    "clamp_max.Scalar": lambda a: torch._foreach_clamp_max_(a, 0.3),
    "lerp.Scalar": lambda a, b: torch._foreach_lerp_(a, b, 0.3),
    "lerp.List": lambda a, b, w: torch._foreach_lerp_(a, b, w),
    "addcmul.Scalar": lambda a, b, c: torch._foreach_addcmul_(a, b, c, 0.5),
    "addcdiv.Scalar": lambda a, b, c: torch._foreach_addcdiv_(a, b, c, -0.5),
    "sqrt": lambda a: torch._foreach_sqrt_(a),
    "neg": lambda a: torch._foreach_neg_(a),
    "reciprocal": lambda a: torch._foreach_reciprocal_(a),
}


def _check_foreach(fn: Callable[..., Any], lists: list[list[torch.Tensor]], tol: dict,
                   inplace: bool = False, allowed_fallbacks: tuple[str, ...] = ()) -> None:
    cpu_lists = [[x.clone() for x in l] for l in lists]
    tpu_lists = _tpu(lists)
    expected = fn(*cpu_lists)
    before = _fallbacks()
    actual = fn(*tpu_lists)
    if inplace:
        expected, actual = cpu_lists[0], tpu_lists[0]
    got = _cpu(actual)
    fell_back = _new_fallbacks(before)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, equal_nan=True, **tol)
    unexpected = {f for f in fell_back if not any(a in f for a in allowed_fallbacks)}
    assert not unexpected, f"ran through the CPU fallback: {sorted(unexpected)}"


# bfloat16 for a representative subset (keeps the file fast).
BF16_SUBSET = ("add.List", "add.Tensor", "mul.Scalar", "div.List", "maximum.List", "pow.Scalar",
               "lerp.Scalar", "lerp.List", "addcmul.Scalar", "addcdiv.Scalar", "sqrt", "norm")
FOREACH_CASES = [(n, torch.float32) for n in sorted(FOREACH)] + [
    (n, torch.bfloat16) for n in BF16_SUBSET]


@pytest.mark.parametrize("name,dtype", FOREACH_CASES, ids=lambda v: str(v))
def test_foreach_functional(name: str, dtype: torch.dtype) -> None:
    n, fn, positive = FOREACH[name]
    lists = [tensors(dtype, positive=positive or i == 2 and "lerp" in name) for i in range(n)]
    if "lerp.List" in name:
        lists[2] = [torch.rand(x.shape).to(dtype) for x in lists[0]]
    _check_foreach(fn, lists, BF16_TOL if dtype == torch.bfloat16 else F32_TOL)


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_foreach_inplace(name: str) -> None:
    n, _, positive = FOREACH[name]
    lists = [tensors(positive=positive) for _ in range(n)]
    if "lerp.List" in name:
        lists[2] = [torch.rand(x.shape) for x in lists[0]]
    _check_foreach(INPLACE[name], lists, F32_TOL, inplace=True)


def test_foreach_type_promotion() -> None:
    ints = [torch.randint(-5, 5, (4,)), torch.randint(-5, 5, (2, 3))]
    floats = [torch.randn(4), torch.randn(2, 3)]
    _check_foreach(lambda a: torch._foreach_add(a, 1.5), [ints], F32_TOL)
    _check_foreach(lambda a: torch._foreach_mul(a, 3), [ints], F32_TOL)
    _check_foreach(lambda a, b: torch._foreach_add(a, b), [ints, floats], F32_TOL)
    _check_foreach(torch._foreach_sqrt, [[x.abs() for x in ints]], F32_TOL)
    mixed = [torch.randn(3).bfloat16(), torch.randn(3)]
    _check_foreach(lambda a: torch._foreach_mul(a, 0.1), [mixed], BF16_TOL)
    _check_foreach(lambda a: torch._foreach_norm(a, 2, dtype=torch.float32), [mixed], BF16_TOL)


def test_foreach_max_zero_copy() -> None:
    xs = [torch.randn(3, 4), torch.randn(7), torch.tensor(2.0)]
    _check_foreach(torch._foreach_max, [xs], F32_TOL)
    _check_foreach(lambda a: torch._foreach_zero_(a), [tensors()], F32_TOL, inplace=True)
    src = [torch.randn(3, 4), torch.randn(5).bfloat16(), torch.tensor(1.0), torch.randn(0, 3),
           torch.randn(2, 1, 3)]
    _check_foreach(lambda a, b: torch._foreach_copy_(a, b), [tensors(), src], F32_TOL,
                   inplace=True)


def test_foreach_inplace_on_views() -> None:
    base = torch.randn(4, 6)
    cpu_views = [base[:, :3], base[1:3, 3:]]
    tbase = base.to("tpu")
    tpu_views = [tbase[:, :3], tbase[1:3, 3:]]
    before = _fallbacks()
    torch._foreach_mul_(cpu_views, 2.0)
    torch._foreach_mul_(tpu_views, 2.0)
    torch._foreach_add_(cpu_views, [torch.ones(4, 3), torch.ones(2, 3)])
    torch._foreach_add_(tpu_views, [torch.ones(4, 3, device="tpu"), torch.ones(2, 3, device="tpu")])
    torch.testing.assert_close(tbase.cpu(), base)
    assert not _new_fallbacks(before)


def test_foreach_errors() -> None:
    a = [torch.randn(3, device="tpu"), torch.randn(2, device="tpu")]
    with pytest.raises(RuntimeError):
        torch._foreach_add(a, [torch.randn(3, device="tpu")])
    with pytest.raises(RuntimeError):
        torch._foreach_add_([torch.randint(0, 3, (3,), device="tpu")], 1.5)
    with pytest.raises(RuntimeError):
        torch._foreach_addcdiv([torch.ones(2, dtype=torch.long, device="tpu")],
                               [torch.ones(2, dtype=torch.long, device="tpu")],
                               [torch.ones(2, dtype=torch.long, device="tpu")])


@pytest.mark.parametrize("name", ["add", "mul", "div", "maximum", "pow", "lerp", "addcdiv"])
def test_foreach_scalar_list_forms(name: str) -> None:
    """Correct through the fallback until Scalar[] reaches the rules."""
    a, b, c = tensors(positive=True), tensors(positive=True), tensors(positive=True)
    s = [0.5, 2, -1.5, 3.0, 0.25]
    fns = {
        "add": (lambda x: torch._foreach_add(x, s), [a]),
        "mul": (lambda x: torch._foreach_mul_(x, s), [a]),
        "div": (lambda x: torch._foreach_div(x, s), [a]),
        "maximum": (lambda x: torch._foreach_maximum(x, s), [a]),
        "pow": (lambda x: torch._foreach_pow(x, s), [a]),
        "lerp": (lambda x, y: torch._foreach_lerp(x, y, [0.1, 0.9, 0.5, 0.2, 0.7]), [a, b]),
        "addcdiv": (lambda x, y, z: torch._foreach_addcdiv_(x, y, z, s), [a, b, c]),
    }
    fn, lists = fns[name]
    _check_foreach(fn, lists, F32_TOL, inplace=name in ("mul", "addcdiv"),
                   allowed_fallbacks=SCALAR_LIST_OPS)


def test_foreach_scalar_list_native() -> None:
    a = tensors()
    _check_foreach(lambda x: torch._foreach_add(x, [1.0, 2, 3.0, 4, 5.0]), [a], F32_TOL)


# ---------------------------------------------------------------- torch.optim

def _params(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.randn(s).to(dtype) for s in [(8, 4), (4,), (3, 2, 2), (1,)]]


def _run_optimizer(cls: type, params: list[torch.Tensor], grads: list[list[torch.Tensor]],
                   device: str, **kwargs: Any) -> tuple[list[torch.Tensor], Any]:
    ps = [torch.nn.Parameter(p.clone().to(device)) for p in params]
    opt = cls(ps, **kwargs)
    for step_grads in grads:
        for p, g in zip(ps, step_grads):
            p.grad = g.clone().to(device)
        opt.step()
    return [p.detach().cpu() for p in ps], opt


OPTIMIZERS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
    "sgd_dampening_maximize": (torch.optim.SGD, dict(lr=0.1, momentum=0.8, dampening=0.3,
                                                    maximize=True)),
    "adam": (torch.optim.Adam, dict(lr=1e-2)),
    "adam_amsgrad_wd": (torch.optim.Adam, dict(lr=1e-2, amsgrad=True, weight_decay=0.1)),
    "adam_maximize": (torch.optim.Adam, dict(lr=1e-2, maximize=True, betas=(0.8, 0.9))),
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "adamw_amsgrad": (torch.optim.AdamW, dict(lr=3e-3, amsgrad=True, eps=1e-6)),
}


def _fused_native(cls: type, kwargs: dict) -> bool:
    """Whether the fused op for these settings runs natively (rule registered)."""
    name = "_fused_sgd_" if cls is torch.optim.SGD else (
        "_fused_adamw_" if cls is torch.optim.AdamW else "_fused_adam_")
    return name in torch_tpu.debug.native_ops()


@pytest.mark.parametrize("mode", ["foreach", "fused"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_matches_cpu(name: str, mode: str) -> None:
    cls, kwargs = OPTIMIZERS[name]
    params = _params()
    grads = [[torch.randn(p.shape) for p in params] for _ in range(5)]
    expected, _ = _run_optimizer(cls, params, grads, "cpu", foreach=False, **kwargs)
    before = _fallbacks()
    got, _ = _run_optimizer(cls, params, grads, "tpu", **{mode: True}, **kwargs)
    fell_back = _new_fallbacks(before)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    if mode == "foreach":
        # Adam's non-capturable foreach path divides by Python-float lists.
        unexpected = {f for f in fell_back if "ScalarList" not in f}
        assert not unexpected, f"ran through the CPU fallback: {sorted(unexpected)}"
    elif _fused_native(cls, kwargs):
        assert not fell_back, f"ran through the CPU fallback: {sorted(fell_back)}"


@pytest.mark.parametrize("name", ["adamw", "adam_amsgrad_wd", "sgd_momentum"])
def test_optimizer_bf16_params(name: str) -> None:
    cls, kwargs = OPTIMIZERS[name]
    params = _params(torch.bfloat16)
    grads = [[torch.randn(p.shape).bfloat16() for p in params] for _ in range(3)]
    expected, _ = _run_optimizer(cls, params, grads, "cpu", foreach=False, **kwargs)
    for mode in ("foreach", "fused"):
        if mode == "fused" and not _fused_native(cls, kwargs):
            # The CPU fallback would run PyTorch's CPU fused SGD kernel, which
            # for 16-bit params leaves most elements un-updated (PyTorch bug).
            continue
        got, _ = _run_optimizer(cls, params, grads, "tpu", **{mode: True}, **kwargs)
        for g, e in zip(got, expected):
            assert g.dtype == torch.bfloat16
            torch.testing.assert_close(g, e, **BF16_TOL)


def test_optimizer_state_matches_cpu() -> None:
    params = _params()
    grads = [[torch.randn(p.shape) for p in params] for _ in range(3)]
    kwargs = dict(lr=1e-2, amsgrad=True)
    _, cpu_opt = _run_optimizer(torch.optim.Adam, params, grads, "cpu", foreach=False, **kwargs)
    _, tpu_opt = _run_optimizer(torch.optim.Adam, params, grads, "tpu", fused=True, **kwargs)
    for sc, st in zip(cpu_opt.state.values(), tpu_opt.state.values()):
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            torch.testing.assert_close(st[key].cpu(), sc[key], rtol=1e-6, atol=1e-7)
        assert float(st["step"].cpu()) == float(sc["step"])


@pytest.mark.parametrize("op", ["_fused_adam_", "_fused_adamw_"])
def test_fused_adam_grad_scale_found_inf(op: str) -> None:
    """The CPU kernel as reference: grads are unscaled in place; found_inf=1 skips."""
    fn = getattr(torch, op)
    n = 3
    lists = [[torch.randn(4, 3) for _ in range(n)] for _ in range(2)]  # params, grads
    state = [[torch.rand(4, 3) * 0.1 for _ in range(n)] for _ in range(3)]
    steps = [torch.tensor(float(i + 1)) for i in range(n)]
    kw = dict(lr=1e-2, beta1=0.9, beta2=0.999, weight_decay=0.05, eps=1e-8, amsgrad=True,
              maximize=True)
    for found in (0.0, 1.0):
        cpu = [[x.clone() for x in l] for l in lists + state]
        tpu = _tpu(cpu)
        fn(*cpu, steps, grad_scale=torch.tensor(4.0), found_inf=torch.tensor(found), **kw)
        before = _fallbacks()
        fn(*tpu, _tpu(steps), grad_scale=torch.tensor(4.0, device="tpu"),
           found_inf=torch.tensor(found, device="tpu"), **kw)
        assert not _new_fallbacks(before)
        for lc, lt in zip(cpu, tpu):
            for c, t in zip(lc, lt):
                torch.testing.assert_close(t.cpu(), c, rtol=1e-5, atol=1e-6)
        if found:
            for l0, lt in zip(lists + state, tpu):
                for c, t in zip(l0, lt):
                    assert torch.equal(t.cpu(), c)


def test_fused_sgd_and_tensor_lr_run() -> None:
    """SGD fused and tensor lr: correct (natively once PyTorch-side meta is handled)."""
    params = _params()
    grads = [[torch.randn(p.shape) for p in params] for _ in range(3)]
    for cls, kw in [(torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
                    (torch.optim.AdamW, dict(lr=torch.tensor(1e-2), weight_decay=0.1))]:
        expected, _ = _run_optimizer(cls, params, grads, "cpu", foreach=False, **kw)
        got, _ = _run_optimizer(cls, params, grads, "tpu", fused=True, **kw)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


def test_lr_scheduler_does_not_recompile_foreach() -> None:
    ps = [torch.nn.Parameter(torch.randn(4, 4, device="tpu")) for _ in range(2)]
    opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    compiles = []
    for _ in range(4):
        for p in ps:
            p.grad = torch.ones_like(p)
        before = torch_tpu.debug.stats()["compiles"]
        opt.step()
        sched.step()
        torch.tpu.synchronize()
        compiles.append(torch_tpu.debug.stats()["compiles"] - before)
    assert compiles[2:] == [0, 0], compiles


@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD])
def test_lr_scheduler_does_not_recompile_fused(cls) -> None:
    # The fused kernels take a float lr; it is a runtime parameter, so a
    # schedule that changes it every step runs the same executable, and the
    # result still follows the changing lr (compared with CPU).
    torch.manual_seed(0)
    init = [torch.randn(4, 4) for _ in range(2)]
    grads = [[torch.randn(4, 4) for _ in range(2)] for _ in range(4)]
    results = {}
    for device in ("cpu", "tpu"):
        ps = [torch.nn.Parameter(t.clone().to(device)) for t in init]
        kw = {"momentum": 0.9} if cls is torch.optim.SGD else {}
        opt = cls(ps, lr=0.1, fused=True, **kw)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
        compiles = []
        torch_tpu.debug.reset_stats()
        for step in range(4):
            for p, g in zip(ps, grads[step]):
                p.grad = g.to(device)
            before = torch_tpu.debug.stats()["compiles"]
            opt.step()
            sched.step()
            if device == "tpu":
                torch.tpu.synchronize()
            compiles.append(torch_tpu.debug.stats()["compiles"] - before)
        if device == "tpu":
            # SGD's first step (is_first_step=True) is its own program.
            assert compiles[2:] == [0, 0], compiles
            assert not torch_tpu.debug.stats()["fallbacks"]
        results[device] = [p.detach().cpu() for p in ps]
    for a, b in zip(results["cpu"], results["tpu"]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- clip_grad_norm_

@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_foreach(norm_type: float) -> None:
    grads = [torch.randn(s) * 3 for s in [(5, 4), (7,), (2, 3, 2)]]

    def run(device: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        ps = [torch.nn.Parameter(torch.zeros(g.shape, device=device)) for g in grads]
        for p, g in zip(ps, grads):
            p.grad = g.clone().to(device)
        total = torch.nn.utils.clip_grad_norm_(ps, max_norm=1.0, norm_type=norm_type,
                                               foreach=device == "tpu")
        return total.cpu(), [p.grad.cpu() for p in ps]

    exp_total, exp_grads = run("cpu")
    before = _fallbacks()
    total, got = run("tpu")
    fell_back = {f for f in _new_fallbacks(before) if "foreach" in f}
    torch.testing.assert_close(total, exp_total, **F32_TOL)
    for g, e in zip(got, exp_grads):
        torch.testing.assert_close(g, e, **F32_TOL)
    assert not fell_back, f"foreach ops ran through the CPU fallback: {sorted(fell_back)}"


def test_clip_grad_value_foreach() -> None:
    grads = [torch.randn(5, 4), torch.randn(3)]
    ps = [torch.nn.Parameter(torch.zeros(g.shape, device="tpu")) for g in grads]
    for p, g in zip(ps, grads):
        p.grad = g.to("tpu")
    before = _fallbacks()
    torch.nn.utils.clip_grad_value_(ps, 0.5, foreach=True)
    for p, g in zip(ps, grads):
        torch.testing.assert_close(p.grad.cpu(), g.clamp(-0.5, 0.5))
    assert not _new_fallbacks(before)


# ---------------------------------------------------------------- _grouped_mm

def _grouped_mm_reference(a: torch.Tensor, b: torch.Tensor,
                          offs: torch.Tensor | None) -> torch.Tensor:
    """A loop over groups in float32 (groups past the last offset: zero)."""
    a32, b32 = a.float(), b.float()
    if offs is None:
        return torch.bmm(a32, b32).to(a.dtype)
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    if a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[-1])
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[s:e] = a32[s:e] @ b32[g]
    elif a.dim() == 3 and b.dim() == 2:
        out = torch.zeros(a.shape[1], b.shape[-1])
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[:, s:e] = a32[g] @ b32[:, s:e]
    else:
        out = torch.stack([a32[:, s:e] @ b32[s:e] for s, e in zip(starts, ends)])
    return out.to(a.dtype)


GROUPED_CASES = {
    # 2d x 3d, MoE layout: rows grouped by expert, an empty group, rows past the end
    "2dx3d": ((24, 16), (4, 16, 8), [5, 5, 17, 20]),
    "2dx3d_one_group": ((8, 16), (1, 16, 8), [8]),
    "3dx3d": ((3, 8, 16), (3, 16, 24), None),
    "2dx2d": ((8, 32), (32, 16), [8, 8, 24, 32]),
    "3dx2d": ((4, 8, 16), (16, 32), [8, 8, 24, 32]),
}


@pytest.mark.parametrize("case", sorted(GROUPED_CASES))
def test_grouped_mm(case: str) -> None:
    sa, sb, offs = GROUPED_CASES[case]
    a = torch.randn(sa).bfloat16()
    b = torch.randn(sb).bfloat16()
    o = torch.tensor(offs, dtype=torch.int32) if offs is not None else None
    expected = _grouped_mm_reference(a, b, o)
    before = _fallbacks()
    got = torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs=_tpu(o)).cpu()
    assert not _new_fallbacks(before)
    assert got.dtype == torch.bfloat16 and got.shape == expected.shape
    torch.testing.assert_close(got, expected, **BF16_TOL)
    if o is None or o[-1] == (a.shape[0] if a.dim() == 2 and b.dim() == 3 else
                              b.shape[-1] if a.dim() == 3 else a.shape[1]):
        # every row covered: PyTorch's CPU kernel agrees too
        torch.testing.assert_close(got, torch._grouped_mm(a, b, offs=o), **BF16_TOL)


def test_grouped_mm_transposed_weights_and_backward() -> None:
    """As Transformers' MoE calls it: input [S, in], weight [E, out, in].transpose(-2, -1)."""
    x = torch.randn(16, 32).bfloat16()
    w = torch.randn(4, 24, 32).bfloat16()
    offs = torch.tensor([3, 9, 9, 16], dtype=torch.int32)

    def run(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xd = x.clone().to(device).requires_grad_()
        wd = w.clone().to(device).requires_grad_()
        y = torch._grouped_mm(xd, wd.transpose(-2, -1), offs=offs.to(device))
        (y.float() ** 2).sum().backward()
        return y.detach().cpu(), xd.grad.cpu(), wd.grad.cpu()

    expected = run("cpu")
    before = _fallbacks()
    got = run("tpu")
    assert not _new_fallbacks(before)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g.float(), e.float(), rtol=1.6e-2, atol=0.25)


def test_grouped_mm_offsets_change_without_recompile() -> None:
    a = torch.randn(16, 16).bfloat16().to("tpu")
    b = torch.randn(2, 16, 8).bfloat16().to("tpu")
    torch._grouped_mm(a, b, offs=torch.tensor([4, 16], dtype=torch.int32, device="tpu")).cpu()
    before = torch_tpu.debug.stats()["compiles"]
    for split in (0, 7, 16):
        offs = torch.tensor([split, 16], dtype=torch.int32)
        got = torch._grouped_mm(a, b, offs=offs.to("tpu")).cpu()
        expected = _grouped_mm_reference(a.cpu(), b.cpu(), offs)
        torch.testing.assert_close(got, expected, **BF16_TOL)
    assert torch_tpu.debug.stats()["compiles"] == before


def test_grouped_mm_float32() -> None:
    # PyTorch's Meta kernel takes bfloat16 only: the dispatcher computes the
    # float32/float16 output spec itself (csrc/aten/eager.cpp).
    a, b = torch.randn(8, 16), torch.randn(2, 16, 8)
    offs = torch.tensor([3, 8], dtype=torch.int32)
    before = _fallbacks()
    got = torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs=offs.to("tpu")).cpu()
    assert not _new_fallbacks(before)
    torch.testing.assert_close(got, _grouped_mm_reference(a, b, offs), **F32_TOL)
