"""Normalization, activation and dropout ops on tpu against PyTorch CPU.

Every check runs the same autograd program on CPU tensors and on their tpu
copies, compares the outputs and the gradients of every input (float32 and
bfloat16), and asserts that nothing ran through the CPU fallback.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_tpu

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOL = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}
DTYPES = [torch.float32, torch.bfloat16]

@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)


def _fallbacks() -> dict[str, int]:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def _tensors(r: Any) -> list[torch.Tensor]:
    if isinstance(r, torch.Tensor):
        return [r]
    if isinstance(r, (tuple, list)):
        return [t for x in r for t in _tensors(x)]
    return []


def check(fn: Callable[..., Any], *inputs: torch.Tensor, grad: bool = True,
          tol: dict | None = None, native: bool = True) -> None:
    """fn(*inputs) and its input gradients: the same on tpu as on CPU."""
    dtype = next((t.dtype for t in inputs if t.is_floating_point()), torch.float32)
    tol = tol or TOL[dtype]

    def prepare(device: str) -> list[torch.Tensor]:
        out = []
        for t in inputs:
            t = t.detach().to(device)
            if grad and t.is_floating_point():
                t.requires_grad_(True)
            out.append(t)
        return out

    cpu_in, tpu_in = prepare("cpu"), prepare("tpu")
    expected = _tensors(fn(*cpu_in))
    before = _fallbacks()
    actual = _tensors(fn(*tpu_in))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e, equal_nan=True, **tol)
    if grad:
        outs = [(a, e) for a, e in zip(actual, expected) if e.requires_grad]
        gs = [torch.randn(e.shape).to(e.dtype) for _, e in outs]
        torch.autograd.backward([e for _, e in outs], gs)
        torch.autograd.backward([a for a, _ in outs], [g.to("tpu") for g in gs])
        for a, e in zip(tpu_in, cpu_in):
            if e.requires_grad:
                assert (a.grad is None) == (e.grad is None)
                if e.grad is not None:
                    torch.testing.assert_close(a.grad.cpu(), e.grad, equal_nan=True, **tol)
    fell_back = {k for k, v in _fallbacks().items() if v != before.get(k, 0)}
    if native:
        assert not fell_back, f"ran through the CPU fallback: {sorted(fell_back)}"


def randn(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0,
          nan: bool = False) -> torch.Tensor:
    t = torch.randn(shape) * scale
    if nan and t.numel() > 1:
        t.view(-1)[1] = float("nan")
    return t.to(dtype)


# ---------------------------------------------------------------- activations

ACTIVATIONS: dict[str, Callable[..., Any]] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "mish": F.mish,
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=3.0),
    "elu": F.elu,
    "elu_alpha": lambda x: F.elu(x, alpha=0.7),
    "celu": lambda x: F.celu(x, alpha=1.3),
    "selu": F.selu,
    "leaky_relu": F.leaky_relu,
    "leaky_relu_slope": lambda x: F.leaky_relu(x, 0.2),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "hardtanh": F.hardtanh,
    "hardtanh_range": lambda x: F.hardtanh(x, -0.5, 2.0),
    "relu6": F.relu6,
    "logsigmoid": F.logsigmoid,
    "logit": lambda x: torch.logit(torch.sigmoid(x)),
    "logit_eps": lambda x: torch.logit(torch.sigmoid(x), eps=0.1),
    "glu": lambda x: F.glu(x, -1),
    "glu_dim0": lambda x: F.glu(x, 0),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation(name: str, dtype: torch.dtype) -> None:
    fn = ACTIVATIONS[name]
    x = randn(4, 6, dtype=dtype, scale=3.0)
    x.view(-1)[:5] = torch.tensor([-3.0, 3.0, 0.0, 20.0, -20.0], dtype=dtype)
    check(fn, x)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_nan_and_empty(name: str) -> None:
    fn = ACTIVATIONS[name]
    check(fn, randn(2, 4, nan=True), grad=False)
    check(fn, torch.empty(0, 4))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prelu(dtype: torch.dtype) -> None:
    x = randn(2, 3, 4, 4, dtype=dtype)
    check(lambda x, w: F.prelu(x, w), x, torch.tensor([0.25], dtype=dtype))
    check(lambda x, w: F.prelu(x, w), x, randn(3, dtype=dtype))
    m = nn.PReLU(3)
    check_module(m.to(dtype), x)


def test_logit_out_of_range() -> None:
    x = torch.tensor([-0.5, 0.0, 0.3, 1.0, 1.5])
    check(torch.logit, x, tol={"rtol": 1e-5, "atol": 1e-5})
    check(lambda x: torch.logit(x, eps=0.2), x)
    check(lambda x: torch.logit(x, eps=-1.0), x)


def test_activation_backward_ops_direct() -> None:
    g, x = randn(3, 5), randn(3, 5, scale=3)
    ops = torch.ops.aten
    check(lambda g, x: ops.gelu_backward(g, x), g, x, grad=False)
    check(lambda g, x: ops.gelu_backward(g, x, approximate="tanh"), g, x, grad=False)
    check(lambda g, x: ops.silu_backward(g, x), g, x, grad=False)
    check(lambda g, x: ops.mish_backward(g, x), g, x, grad=False)
    check(lambda g, x: ops.softplus_backward(g, x, 1.5, 2.0), g, x, grad=False)
    check(lambda g, x: ops.elu_backward(g, 1.0, 1.0, 1.0, False, x), g, x, grad=False)
    check(lambda g, x: ops.elu_backward(g, 0.5, 2.0, 1.5, True, F.elu(x, 0.5)), g, x, grad=False)
    check(lambda g, x: ops.leaky_relu_backward(g, x, 0.1, False), g, x, grad=False)
    check(lambda g, x: ops.hardswish_backward(g, x), g, x, grad=False)
    check(lambda g, x: ops.hardsigmoid_backward(g, x), g, x, grad=False)
    check(lambda g, x: ops.hardtanh_backward(g, x, -1.0, 1.0), g, x, grad=False)
    check(lambda x: ops.log_sigmoid_forward(x), x, grad=False)
    check(lambda g, x: ops.log_sigmoid_backward(g, x, ops.log_sigmoid_forward(x)[1]), g, x,
          grad=False)
    check(lambda g, x: ops.glu_backward(g[:, :2], x[:, :4], 1), g, x, grad=False)
    check(lambda g, x: ops._prelu_kernel_backward(g, x, torch.full_like(x, 0.3)), g, x, grad=False)


def test_inplace_and_out_variants() -> None:
    x = randn(3, 5)
    check(lambda x: F.hardtanh(x.clone(), inplace=True), x, grad=False)
    check(lambda x: F.elu(x.clone(), inplace=True), x, grad=False)
    check(lambda x: F.leaky_relu(x.clone(), inplace=True), x, grad=False)
    check(lambda x: F.hardswish(x.clone(), inplace=True), x, grad=False)
    check(lambda x: F.hardsigmoid(x.clone(), inplace=True), x, grad=False)
    check(lambda x: torch.ops.aten.gelu.out(x, out=torch.empty_like(x)), x, grad=False)


# ---------------------------------------------------------------- norms


def check_module(m: nn.Module, *inputs: torch.Tensor, steps: int = 1,
                 tol: dict | None = None, input_grad: bool = True) -> None:
    """A module (train or eval, as given) on CPU and tpu: outputs, input and
    parameter gradients, and buffers (running statistics) after `steps`."""
    dtype = inputs[0].dtype
    tol = tol or TOL[dtype]
    mc, mt = m, copy.deepcopy(m).to("tpu")
    before = _fallbacks()
    for _ in range(steps):
        xc = [x.detach().clone().requires_grad_(input_grad) for x in inputs]
        xt = [x.detach().to("tpu").requires_grad_(input_grad) for x in inputs]
        yc, yt = mc(*xc), mt(*xt)
        torch.testing.assert_close(yt.cpu(), yc, **tol)
        g = torch.randn(yc.shape).to(yc.dtype)
        yc.backward(g)
        yt.backward(g.to("tpu"))
        for a, e in zip(xt, xc):
            if input_grad:
                torch.testing.assert_close(a.grad.cpu(), e.grad, **tol)
    for (name, pt), (_, pc) in zip(mt.named_parameters(), mc.named_parameters()):
        assert (pt.grad is None) == (pc.grad is None), name
        if pc.grad is not None:
            torch.testing.assert_close(pt.grad.cpu(), pc.grad, **tol, msg=name)
    for (name, bt), (_, bc) in zip(mt.named_buffers(), mc.named_buffers()):
        torch.testing.assert_close(bt.cpu(), bc, **tol, msg=name)
    fell_back = {k for k, v in _fallbacks().items() if v != before.get(k, 0)}
    assert not fell_back, f"ran through the CPU fallback: {sorted(fell_back)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_norm(dtype: torch.dtype) -> None:
    x = randn(3, 4, 6, dtype=dtype, scale=2.0) + 1
    w, b = randn(6, dtype=dtype), randn(6, dtype=dtype)
    check(lambda x, w, b: F.layer_norm(x, (6,), w, b), x, w, b)
    check(lambda x, w, b: F.layer_norm(x, (4, 6), w, b, eps=1e-3), x, randn(4, 6, dtype=dtype),
          randn(4, 6, dtype=dtype))
    # mean / rstd: meta says float32 for bf16 input, the CPU kernel bf16; compare as float32.
    check(lambda x: [t.float() for t in torch.ops.aten.native_layer_norm(x, [6], None, None, 1e-5)],
          x, grad=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_norm_module(dtype: torch.dtype) -> None:
    m = nn.LayerNorm(8).to(dtype)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    check_module(m, randn(2, 5, 8, dtype=dtype))


def test_layer_norm_mixed_and_empty() -> None:
    # bf16 input with f32 parameters (autocast style).
    x = randn(4, 8, dtype=torch.bfloat16)
    check(lambda x: torch.ops.aten.native_layer_norm(x, [8], torch.ones(8, device=x.device),
                                                     torch.zeros(8, device=x.device), 1e-5),
          x, grad=False)
    check(lambda x, w, b: F.layer_norm(x, (8,), w, b), torch.empty(0, 8), randn(8), randn(8))


def test_layer_norm_without_weight_backward() -> None:
    check(lambda x: F.layer_norm(x, (6,)), randn(3, 6))


def test_layer_norm_without_bias_backward() -> None:
    check(lambda x, w: F.layer_norm(x, (6,), w), randn(3, 6), randn(6))


def test_layer_norm_input_without_grad() -> None:
    check_module(nn.LayerNorm(6), randn(3, 6), input_grad=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_group_norm(dtype: torch.dtype) -> None:
    x = randn(2, 6, 3, 4, dtype=dtype, scale=2.0) + 0.5
    w, b = randn(6, dtype=dtype), randn(6, dtype=dtype)
    check(lambda x, w, b: F.group_norm(x, 3, w, b), x, w, b)
    check(lambda x, w, b: F.group_norm(x, 1, w, b, eps=1e-2), x, w, b)
    check(lambda x, w, b: F.group_norm(x, 6, w, b), randn(2, 6, 5, dtype=dtype), w, b)
    check(lambda x: torch.ops.aten.native_group_norm(x, None, None, 2, 6, 12, 2, 1e-5), x,
          grad=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_group_norm_module(dtype: torch.dtype) -> None:
    m = nn.GroupNorm(2, 4).to(dtype)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    check_module(m, randn(3, 4, 5, 5, dtype=dtype))


def test_group_norm_without_affine_backward() -> None:
    check(lambda x: F.group_norm(x, 2), randn(2, 4, 3))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_functional(dtype: torch.dtype, training: bool) -> None:
    x = randn(4, 3, 5, 5, dtype=dtype, scale=2.0) + 1
    w, b = randn(3, dtype=dtype), randn(3, dtype=dtype)
    rm, rv = torch.randn(3).to(dtype), torch.rand(3).to(dtype) + 0.5
    # Running stats are not differentiable inputs; pass them through closures.
    check(lambda x, w, b: F.batch_norm(x, rm.to(x.device), rv.to(x.device), w, b,
                                       training=training), x, w, b)
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), randn(6, 3, dtype=dtype),
          w, b)


def test_batch_norm_ops_direct() -> None:
    x = randn(4, 3, 2, 2)
    w, b, rm, rv = randn(3), randn(3), randn(3), torch.rand(3) + 0.5
    ops = torch.ops.aten
    # (only the output: meta and CPU disagree on the shape of the saved stats)
    check(lambda x, w, b, rm, rv: ops._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1,
                                                                            1e-5)[0],
          x, w, b, rm, rv, grad=False)
    check(lambda x, w, b: ops._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5),
          x, w, b, grad=False)
    check(lambda x, rm, rv: ops.native_batch_norm(x, None, None, rm, rv, False, 0.1, 1e-5)[0],
          x, rm, rv, grad=False)
    out, sm, si = ops.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
    g = torch.randn_like(x)
    check(lambda g, x, w, sm, si: ops.native_batch_norm_backward(g, x, w, None, None, sm, si,
                                                                 True, 1e-5, [True, True, True]),
          g, x, w, sm, si, grad=False)
    check(lambda g, x, w, rm, rv: ops.native_batch_norm_backward(g, x, w, rm, rv, None, None,
                                                                 False, 1e-5, [True, True, True]),
          g, x, w, rm, rv, grad=False)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_mutating_ops(training: bool) -> None:
    x, w, b = randn(4, 3, 2, 2) * 2 + 1, randn(3), randn(3)
    rm, rv = randn(3), torch.rand(3) + 0.5
    rmt, rvt = rm.to("tpu"), rv.to("tpu")
    before = _fallbacks()
    ops = torch.ops.aten
    expected = ops._native_batch_norm_legit(x, w, b, rm, rv, training, 0.1, 1e-5)
    actual = ops._native_batch_norm_legit(x.to("tpu"), w.to("tpu"), b.to("tpu"), rmt, rvt,
                                          training, 0.1, 1e-5)
    # (eval: meta and CPU disagree on the shape of the saved stats)
    for a, e in list(zip(actual, expected))[:3 if training else 1]:
        torch.testing.assert_close(a.cpu(), e, **TOL[torch.float32])
    torch.testing.assert_close(rmt.cpu(), rm)
    torch.testing.assert_close(rvt.cpu(), rv)
    if training:
        expected = ops._batch_norm_with_update(x, w, b, rm, rv, 0.2, 1e-3)
        actual = ops._batch_norm_with_update(x.to("tpu"), w.to("tpu"), b.to("tpu"), rmt, rvt,
                                             0.2, 1e-3)
        for a, e in list(zip(actual, expected))[:3]:
            torch.testing.assert_close(a.cpu(), e, **TOL[torch.float32])
        torch.testing.assert_close(rmt.cpu(), rm)
        torch.testing.assert_close(rvt.cpu(), rv)
    assert _fallbacks() == before


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batch_norm_module_eval(dtype: torch.dtype) -> None:
    m = nn.BatchNorm2d(3)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
        m.running_mean.normal_()
        m.running_var.uniform_(0.5, 2.0)
    m = m.to(dtype).eval()
    check_module(m, randn(2, 3, 4, 4, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batch_norm_module_train_no_running_stats(dtype: torch.dtype) -> None:
    m = nn.BatchNorm1d(4, track_running_stats=False).to(dtype)
    check_module(m, randn(5, 4, 3, dtype=dtype) * 2 + 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batch_norm_module_train_running_stats(dtype: torch.dtype) -> None:
    m = nn.BatchNorm2d(3).to(dtype)
    check_module(m, randn(4, 3, 3, 3, dtype=dtype) * 2 + 1, steps=2)


def test_batch_norm_module_train_outputs() -> None:
    # Outputs and gradients in training mode (running stats aside).
    m = nn.BatchNorm2d(3)
    mt = copy.deepcopy(m).to("tpu")
    x = randn(4, 3, 3, 3) * 2 + 1
    xc, xt = x.clone().requires_grad_(True), x.to("tpu").requires_grad_(True)
    before = _fallbacks()
    yc, yt = m(xc), mt(xt)
    yc.square().sum().backward()
    yt.square().sum().backward()
    torch.testing.assert_close(yt.cpu(), yc, **TOL[torch.float32])
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, **TOL[torch.float32])
    torch.testing.assert_close(mt.weight.grad.cpu(), m.weight.grad, **TOL[torch.float32])
    torch.testing.assert_close(mt.bias.grad.cpu(), m.bias.grad, **TOL[torch.float32])
    assert _fallbacks() == before


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm(dtype: torch.dtype) -> None:
    x = randn(3, 4, 8, dtype=dtype, scale=2.0)
    w = randn(8, dtype=dtype)
    check(lambda x, w: F.rms_norm(x, (8,), w), x, w)
    check(lambda x, w: F.rms_norm(x, (4, 8), w, eps=1e-3), x, randn(4, 8, dtype=dtype))
    check(lambda x: F.rms_norm(x, (8,)), x, grad=False)
    m = nn.RMSNorm(8).to(dtype)
    with torch.no_grad():
        m.weight.normal_()
    check_module(m, x)


def test_rms_norm_without_weight_backward() -> None:
    check(lambda x: F.rms_norm(x, (8,)), randn(3, 8))


# ---------------------------------------------------------------- dropout


def test_dropout_statistics() -> None:
    x = torch.ones(100, 400, device="tpu")
    before = _fallbacks()
    for p in (0.2, 0.7):
        y, mask = torch.ops.aten.native_dropout(x, p, True)
        assert mask.dtype == torch.bool
        keep = mask.float().mean().item()
        assert abs(keep - (1 - p)) < 0.01, (p, keep)
        yc, mc = y.cpu(), mask.cpu()
        torch.testing.assert_close(yc[mc], torch.full_like(yc[mc], 1 / (1 - p)))
        assert (yc[~mc] == 0).all()
        y2 = F.dropout(x, p, training=True).cpu()
        assert abs((y2 != 0).float().mean().item() - (1 - p)) < 0.01
        assert abs(y2.mean().item() - 1.0) < 0.03
    assert _fallbacks() == before


def test_dropout_reproducible() -> None:
    x = torch.randn(64, 64, device="tpu")
    torch.manual_seed(7)
    a = F.dropout(x, 0.3).cpu()
    b = F.dropout(x, 0.3).cpu()
    torch.manual_seed(7)
    a2 = F.dropout(x, 0.3).cpu()
    b2 = F.dropout(x, 0.3).cpu()
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a != 0, b != 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dropout_backward(dtype: torch.dtype) -> None:
    x = torch.randn(32, 16).to(dtype).to("tpu").requires_grad_(True)
    before = _fallbacks()
    y = F.dropout(x, 0.25, training=True)
    g = torch.randn(32, 16).to(dtype).to("tpu")
    y.backward(g)
    keep = (y != 0).cpu()
    expected = torch.where(keep, g.cpu().float() / 0.75, 0.0).to(dtype)
    torch.testing.assert_close(x.grad.cpu(), expected, **TOL[dtype])
    torch.testing.assert_close(y.cpu(), torch.where(keep, x.detach().cpu().float() / 0.75, 0.0)
                               .to(dtype), **TOL[dtype])
    assert _fallbacks() == before
    check(lambda g, m: torch.ops.aten.native_dropout_backward(g, m, 1.5),
          torch.randn(4, 5).to(dtype), torch.rand(4, 5) > 0.5, grad=False)


def test_dropout_edge_cases() -> None:
    x = randn(6, 7, nan=True)
    ops = torch.ops.aten
    check(lambda x: ops.native_dropout(x, 0.0, True), x, grad=False)
    check(lambda x: ops.native_dropout(x, 1.0, True), x, grad=False)
    check(lambda x: ops.native_dropout(x, 0.5, False), x, grad=False)
    check(lambda x: F.dropout(x, 0.5, training=False), x)
    check(lambda x: F.dropout(x, 0.0, training=True), x)
    check(lambda x: F.dropout(x, 1.0, training=True), x)
    check(lambda x: nn.Dropout(0.4).eval()(x), x)
    y = F.dropout(torch.empty(0, 3, device="tpu"), 0.5, training=True)
    assert y.shape == (0, 3)
