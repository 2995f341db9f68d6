"""Convolutions, pooling, pads and resampling: tpu against CPU, forward and backward.

Every check runs the same autograd program on CPU and on tpu, compares the
output and the gradients of every floating input, and asserts that the tpu run
used no CPU fallback.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_tpu

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOL = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-4},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)


def _fallbacks() -> dict[str, int]:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def check_grad(fn: Callable[..., torch.Tensor], *args: Any, dtype: torch.dtype = torch.float32,
               tol: dict | None = None, grad: bool = True, native: bool = True) -> None:
    """fn(*args) and the gradients of its floating tensor args: tpu == CPU, no fallback."""
    tol = tol or TOL[dtype]

    def prep(device: str) -> list[Any]:
        out = []
        for a in args:
            if isinstance(a, torch.Tensor):
                a = a.to(device=device, dtype=dtype if a.is_floating_point() else a.dtype)
                if grad and a.is_floating_point():
                    a = a.detach().requires_grad_(True)
            out.append(a)
        return out

    cpu_args = prep("cpu")
    expected = fn(*cpu_args)
    go = torch.randn(expected.shape).to(expected.dtype) if expected.is_floating_point() else None
    if grad and go is not None:
        expected.backward(go)
    tpu_args = prep("tpu")
    before = _fallbacks()
    actual = fn(*tpu_args)
    if grad and go is not None:
        actual.backward(go.to("tpu"))
    actual_cpu = actual.detach().cpu()
    fell_back = {k for k, v in _fallbacks().items() if v != before.get(k, 0)}
    torch.testing.assert_close(actual_cpu, expected.detach(), equal_nan=True, **tol)
    if grad and go is not None:
        for c, t in zip(cpu_args, tpu_args):
            if isinstance(c, torch.Tensor) and c.grad is not None:
                torch.testing.assert_close(t.grad.cpu(), c.grad, equal_nan=True, **tol)
    if native:
        assert not fell_back, f"ran through the CPU fallback: {sorted(fell_back)}"


def check_module(make: Callable[[], nn.Module], x: torch.Tensor,
                 dtype: torch.dtype = torch.float32) -> None:
    """A module's output and the gradients of its input and parameters."""
    mod = make().to(dtype)
    tmod = make().to(dtype)
    tmod.load_state_dict(mod.state_dict())
    tmod = tmod.to("tpu")
    xc = x.detach().to(dtype).clone().requires_grad_(True)
    xt = x.detach().to(dtype).to("tpu").requires_grad_(True)
    y = mod(xc)
    go = torch.randn(y.shape).to(dtype)
    y.backward(go)
    before = _fallbacks()
    yt = tmod(xt)
    yt.backward(go.to("tpu"))
    fell_back = {k for k, v in _fallbacks().items() if v != before.get(k, 0)}
    tol = TOL[dtype]
    torch.testing.assert_close(yt.detach().cpu(), y.detach(), **tol)
    if dtype == torch.bfloat16:
        _check_bf16_grads(make, mod, tmod, x, xc, xt, go, tol)
    else:
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, **tol)
        for (name, p), (_, tp) in zip(mod.named_parameters(), tmod.named_parameters()):
            torch.testing.assert_close(tp.grad.cpu(), p.grad, **tol, msg=lambda m: f"{name}: {m}")
    assert not fell_back, f"ran through the CPU fallback: {sorted(fell_back)}"


def _check_bf16_grads(make, mod, tmod, x, xc, xt, go, tol) -> None:
    """bf16 gradients: tpu accumulates in f32, CPU's bf16 kernels (oneDNN, by
    host) may round partial sums to bf16, so neither is the exact answer. The
    reference is the f32 gradient of the same bf16-rounded model and inputs;
    tpu must be no farther from it than CPU's bf16 result, plus the tolerance."""
    ref = make().float()
    ref.load_state_dict({k: v.float() for k, v in mod.state_dict().items()})
    xr = x.detach().to(torch.bfloat16).float().requires_grad_(True)
    ref(xr).backward(go.float())
    pairs = [("input", xt.grad.cpu(), xc.grad, xr.grad)]
    for (name, p), (_, tp), (_, rp) in zip(mod.named_parameters(), tmod.named_parameters(),
                                           ref.named_parameters()):
        pairs.append((name, tp.grad.cpu(), p.grad, rp.grad))
    for name, tpu, cpu, exact in pairs:
        tpu_err = (tpu.float() - exact).abs()
        cpu_err = (cpu.float() - exact).abs()
        bound = cpu_err + tol["atol"] + tol["rtol"] * exact.abs()
        worst = (tpu_err - bound).max().item()
        assert worst <= 0, f"{name}: tpu bf16 gradient {worst:.4g} farther from f32 than CPU's"


DTYPES = [torch.float32, torch.bfloat16]

# ---------------------------------------------------------------- convolution

CONV_CASES = {
    "conv1d": (lambda: nn.Conv1d(3, 5, 4, stride=3, padding=2), (2, 3, 17)),
    "conv2d": (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1), (2, 3, 9, 10)),
    "conv2d_groups_dilation": (lambda: nn.Conv2d(6, 6, 3, stride=(2, 1), dilation=2, groups=3),
                               (2, 6, 9, 10)),
    "conv2d_depthwise": (lambda: nn.Conv2d(4, 8, 3, padding=1, groups=4), (1, 4, 6, 6)),
    "conv2d_same_even_kernel": (lambda: nn.Conv2d(3, 4, (4, 3), padding="same"), (2, 3, 7, 8)),
    "conv2d_same_dilated": (lambda: nn.Conv2d(3, 4, 3, padding="same", dilation=2), (2, 3, 7, 8)),
    "conv2d_1x1": (lambda: nn.Conv2d(3, 4, 1), (2, 3, 5, 5)),
    "conv2d_uncovered_tail": (lambda: nn.Conv2d(2, 3, 3, stride=3), (1, 2, 8, 11)),
    "conv3d": (lambda: nn.Conv3d(3, 4, (3, 2, 3), stride=2, padding=1), (2, 3, 5, 6, 7)),
    "conv_transpose1d": (lambda: nn.ConvTranspose1d(3, 4, 3, stride=2), (2, 3, 6)),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1,
                                                    output_padding=1, groups=2, dilation=2),
                         (2, 4, 5, 6)),
    "conv_transpose2d_plain": (lambda: nn.ConvTranspose2d(3, 2, 4, stride=2, padding=1),
                               (2, 3, 4, 5)),
    "conv_transpose3d": (lambda: nn.ConvTranspose3d(2, 3, 2, stride=2), (1, 2, 3, 4, 3)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_module(case: str, dtype: torch.dtype) -> None:
    make, shape = CONV_CASES[case]
    check_module(make, torch.randn(shape), dtype)


def test_conv_functional_all_grads() -> None:
    check_grad(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=(1, 2), dilation=(1, 2)),
               torch.randn(2, 3, 9, 10), torch.randn(4, 3, 3, 3), torch.randn(4))


def test_conv_nan_propagates() -> None:
    x = torch.randn(1, 2, 6, 6)
    x[0, 1, 2, 3] = float("nan")
    check_grad(lambda x, w, b: F.conv2d(x, w, b, padding=1), x, torch.randn(3, 2, 3, 3),
               torch.randn(3))


def test_conv_empty_batch() -> None:
    check_grad(lambda x, w, b: F.conv2d(x, w, b, padding=1), torch.randn(0, 3, 5, 5),
               torch.randn(4, 3, 3, 3), torch.randn(4))


def test_conv_fp32_default_precision() -> None:
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        check_grad(lambda x, w, b: F.conv2d(x, w, b, padding=1), torch.randn(2, 3, 6, 6),
                   torch.randn(4, 3, 3, 3), torch.randn(4), tol={"rtol": 2e-2, "atol": 2e-2})
    finally:
        torch.set_float32_matmul_precision(prev)


# convolution_backward with output_mask entries False (no bias; input without
# requires_grad): PyTorch's meta kernel returns undefined tensors for those
# results; the dispatcher returns them undefined and the rule computes the rest.
@pytest.mark.parametrize("mask", ["no_bias", "no_input_grad"])
def test_conv_backward_masked(mask: str) -> None:
    x, w, b = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4)

    def run(device: str) -> list[torch.Tensor]:
        xd = x.to(device, copy=True).requires_grad_(mask != "no_input_grad")
        wd = w.to(device, copy=True).requires_grad_(True)
        bd = b.to(device, copy=True).requires_grad_(True) if mask != "no_bias" else None
        F.conv2d(xd, wd, bd, padding=1).sum().backward()
        return [t.grad.cpu() for t in (xd, wd, bd) if t is not None and t.grad is not None]

    expected = run("cpu")
    before = _fallbacks()
    actual = run("tpu")
    torch.testing.assert_close(actual, expected, **TOL[torch.float32])
    assert _fallbacks() == before


# ---------------------------------------------------------------- pooling

POOL_CASES = {
    "max2d": lambda x: F.max_pool2d(x, 3, 2, 1),
    "max2d_ceil": lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
    "max2d_dilation": lambda x: F.max_pool2d(x, 2, 1, 0, dilation=2),
    "max2d_rect": lambda x: F.max_pool2d(x, (2, 3), (1, 2), (1, 0)),
    "avg2d": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "avg2d_ceil_nopad": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True,
                                               count_include_pad=False),
    "avg2d_ceil_pad": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
    "avg2d_divisor": lambda x: F.avg_pool2d(x, (2, 3), (3, 2), (1, 0), divisor_override=5),
    "adaptive_avg2d": lambda x: F.adaptive_avg_pool2d(x, (4, 3)),
    "adaptive_avg2d_up": lambda x: F.adaptive_avg_pool2d(x, (12, 11)),
    "adaptive_avg2d_global": lambda x: F.adaptive_avg_pool2d(x, 1),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_pool2d(case: str, dtype: torch.dtype) -> None:
    check_grad(POOL_CASES[case], torch.randn(2, 3, 9, 10), dtype=dtype)


def test_pool2d_unbatched() -> None:
    check_grad(lambda x: F.max_pool2d(x, 2), torch.randn(3, 6, 8))
    check_grad(lambda x: F.avg_pool2d(x, 2), torch.randn(3, 6, 8))
    check_grad(lambda x: F.adaptive_avg_pool2d(x, 3), torch.randn(3, 6, 8))


def test_max_pool_indices_and_nan() -> None:
    x = torch.randn(2, 2, 6, 7)
    x[0, 0, 1, 1] = float("nan")
    x[1, 1, :2, :2] = 5.0  # ties: first index wins
    check_grad(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)[0], x)
    check_grad(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)[1].float(), x,
               grad=False)


def test_max_pool_all_minus_inf() -> None:
    x = torch.full((1, 1, 4, 4), float("-inf"))
    check_grad(lambda x: F.max_pool2d(x, 2, return_indices=True)[1].float(), x, grad=False)


def test_pool_empty_batch() -> None:
    check_grad(lambda x: F.max_pool2d(x, 2), torch.randn(0, 3, 4, 4))
    check_grad(lambda x: F.avg_pool2d(x, 2), torch.randn(0, 3, 4, 4))


def test_pool3d() -> None:
    x = torch.randn(1, 2, 5, 6, 7)
    check_grad(lambda x: F.max_pool3d(x, 2, 2, 1, ceil_mode=True), x)
    check_grad(lambda x: F.avg_pool3d(x, 3, 2, 1, count_include_pad=False), x)
    check_grad(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)), x)


def test_pool1d() -> None:
    x = torch.randn(2, 3, 11)
    check_grad(lambda x: F.max_pool1d(x, 3, 2, 1), x)
    check_grad(lambda x: F.avg_pool1d(x, 3, 2, 1), x)
    check_grad(lambda x: F.adaptive_avg_pool1d(x, 4), x)


# ---------------------------------------------------------------- pads

PAD_CASES = {
    "reflect1d": ((2, 3, 7), (2, 3)),
    "reflect2d": ((2, 3, 6, 7), (1, 2, 3, 2)),
    "reflect3d": ((1, 2, 4, 5, 6), (1, 2, 0, 1, 3, 2)),
    "replicate1d": ((2, 3, 7), (4, 3)),
    "replicate2d": ((2, 3, 6, 7), (1, 2, 3, 2)),
    "replicate3d": ((1, 2, 4, 5, 6), (1, 2, 0, 1, 3, 2)),
    "circular2d": ((2, 3, 6, 7), (1, 2, 3, 2)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(PAD_CASES))
def test_pad(case: str, dtype: torch.dtype) -> None:
    shape, pad = PAD_CASES[case]
    mode = case[:-2]
    check_grad(lambda x: F.pad(x, pad, mode=mode), torch.randn(shape), dtype=dtype)


def test_pad_unbatched_and_nan() -> None:
    x = torch.randn(3, 5, 6)
    x[1, 0, 0] = float("nan")
    check_grad(lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), x)
    check_grad(lambda x: F.pad(x, (2, 1, 1, 2), mode="replicate"), x)


def test_conv_padding_mode_reflect() -> None:
    check_module(lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"),
                 torch.randn(2, 3, 6, 7))
    check_module(lambda: nn.Conv2d(3, 4, 3, padding=2, padding_mode="replicate"),
                 torch.randn(2, 3, 6, 7))


# ---------------------------------------------------------------- resampling

INTERP_CASES = [
    ("nearest", None), ("nearest-exact", None),
    ("bilinear", False), ("bilinear", True), ("bicubic", False), ("bicubic", True),
]


@pytest.mark.parametrize("how,dtype", [
    ("scale_up", torch.float32), ("scale_frac", torch.float32), ("size_down", torch.float32),
    ("size_up", torch.float32), ("same", torch.float32), ("scale_frac", torch.bfloat16),
], ids=str)
@pytest.mark.parametrize("mode,align", INTERP_CASES, ids=lambda v: str(v))
def test_interpolate2d(mode: str, align: bool | None, how: str, dtype: torch.dtype) -> None:
    kw: dict[str, Any] = {
        "scale_up": {"scale_factor": 2},
        "scale_frac": {"scale_factor": (1.7, 0.6)},
        "size_down": {"size": (4, 7)},
        "size_up": {"size": (13, 21)},
        "same": {"size": (9, 10)},
    }[how]
    check_grad(lambda x: F.interpolate(x, mode=mode, align_corners=align, **kw),
               torch.randn(2, 3, 9, 10), dtype=dtype)


def test_interpolate_recompute_scale_and_antialias_free() -> None:
    x = torch.randn(1, 2, 5, 7)
    check_grad(lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear",
                                       recompute_scale_factor=True), x)
    check_grad(lambda x: F.interpolate(x, scale_factor=2.5, mode="nearest",
                                       recompute_scale_factor=True), x)


def test_interpolate_1d_3d() -> None:
    x1 = torch.randn(2, 3, 7)
    for mode in ("nearest", "nearest-exact"):
        check_grad(lambda x: F.interpolate(x, scale_factor=2.3, mode=mode), x1)
    check_grad(lambda x: F.interpolate(x, size=11, mode="linear", align_corners=False), x1)
    check_grad(lambda x: F.interpolate(x, size=4, mode="linear", align_corners=True), x1)
    x3 = torch.randn(1, 2, 3, 4, 5)
    for mode in ("nearest", "nearest-exact"):
        check_grad(lambda x: F.interpolate(x, size=(5, 3, 8), mode=mode), x3)
    check_grad(lambda x: F.interpolate(x, scale_factor=1.5, mode="trilinear"), x3)


def test_interpolate_nearest_integer_and_nan() -> None:
    xi = torch.randint(0, 255, (1, 2, 4, 5), dtype=torch.uint8)
    check_grad(lambda x: F.interpolate(x, scale_factor=3, mode="nearest"), xi, grad=False)
    x = torch.randn(1, 1, 4, 4)
    x[0, 0, 1, 2] = float("nan")
    check_grad(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), x)


# ---------------------------------------------------------------- a small UNet block


class TinyUNet(nn.Module):
    """conv-relu-pool, conv-relu, upsample, skip concat, conv."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, padding=1)
        self.mid = nn.Conv2d(8, 8, 3, padding=1)
        self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.out = nn.Conv2d(16 + 8, 4, 3, padding=1, padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = F.relu(self.down(x))
        m = F.relu(self.mid(F.max_pool2d(d, 2)))
        u1 = F.interpolate(m, scale_factor=2, mode="bilinear", align_corners=False)
        u2 = self.up(F.avg_pool2d(m, 1))
        return self.out(torch.cat([d, u1, u2], dim=1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tiny_unet(dtype: torch.dtype) -> None:
    check_module(TinyUNet, torch.randn(2, 3, 8, 8), dtype)
