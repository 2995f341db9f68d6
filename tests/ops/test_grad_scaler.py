"""torch.amp.GradScaler("tpu"): its two ops native, fp16 training equal to CPU.

`_amp_foreach_non_finite_check_and_unscale_` and `_amp_update_scale_` run as
native rules (csrc/lowering/amp.cpp): no CPU fallback, and the scale, growth
tracker and found_inf stay on the device.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from no_fallback import native


def test_unscale_and_found_inf_match_cpu() -> None:
    grads = [torch.randn(3, 4), torch.randn(5).half(), torch.randn(2, 2).bfloat16()]
    for poison in (None, float("inf"), float("nan")):
        cpu = [g.clone() for g in grads]
        if poison is not None:
            cpu[1][2] = poison
        tpu = [g.to("tpu") for g in cpu]
        found_cpu, found_tpu = torch.zeros(()), torch.zeros((), device="tpu")
        inv_cpu = torch.full((), 0.125)
        with native():
            torch._amp_foreach_non_finite_check_and_unscale_(tpu, found_tpu, inv_cpu.to("tpu"))
        torch._amp_foreach_non_finite_check_and_unscale_(cpu, found_cpu, inv_cpu)
        assert found_tpu.cpu().item() == found_cpu.item() == (0.0 if poison is None else 1.0)
        for g, r in zip(tpu, cpu):
            assert g.dtype == r.dtype
            torch.testing.assert_close(g.cpu(), r, equal_nan=True, rtol=0, atol=0)
    # found_inf is only ever set, never cleared
    found = torch.ones((), device="tpu")
    torch._amp_foreach_non_finite_check_and_unscale_([torch.ones(2, device="tpu")], found,
                                                     torch.ones((), device="tpu"))
    assert found.item() == 1.0


@pytest.mark.parametrize("found", [0.0, 1.0])
@pytest.mark.parametrize("tracker", [0, 2])
def test_update_scale_matches_cpu(found: float, tracker: int) -> None:
    for start in (1024.0, 3.0e38):  # the grown scale may overflow: then it stays
        s_cpu, t_cpu = torch.full((1,), start), torch.full((1,), tracker, dtype=torch.int32)
        s_tpu, t_tpu = s_cpu.to("tpu"), t_cpu.to("tpu")
        f = torch.full((1,), found)
        with native():
            out = torch._amp_update_scale_(s_tpu, t_tpu, f.to("tpu"), 2.0, 0.5, 3)
        torch._amp_update_scale_(s_cpu, t_cpu, f, 2.0, 0.5, 3)
        assert out is s_tpu
        assert s_tpu.cpu().item() == s_cpu.item()
        assert t_tpu.cpu().item() == t_cpu.item()


def _train(device: str, model: nn.Module, data: list, poison_step: int) -> tuple:
    m = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
    losses, scales = [], []
    for step, (x, y) in enumerate(data):
        x, y = x.to(device), y.to(device)
        with torch.autocast(device, dtype=torch.float16):
            loss = nn.functional.mse_loss(m(x).float(), y)
        if step == poison_step:
            loss = loss * float("inf")  # an overflowing step: skipped, scale backs off
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales, [p.detach().cpu() for p in m.parameters()]


def test_fp16_autocast_training_equals_cpu() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    data = [(torch.randn(6, 8), torch.randn(6, 4)) for _ in range(5)]
    ref = _train("cpu", model, data, poison_step=2)
    with native():
        got = _train("tpu", model, data, poison_step=2)
    assert got[1] == ref[1]  # the same scale schedule: 1024, 2048, 1024, 1024, 2048
    assert got[0][:2] == pytest.approx(ref[0][:2], rel=2e-3)
    assert got[0][3:] == pytest.approx(ref[0][3:], rel=2e-3)
    for g, r in zip(got[2], ref[2]):
        torch.testing.assert_close(g, r, rtol=2e-3, atol=2e-3)


def test_grad_scaler_accepts_tpu_device() -> None:
    scaler = torch.amp.GradScaler("tpu")
    assert scaler.is_enabled()
    t = torch.ones(2, device="tpu", requires_grad=True)
    scaled = scaler.scale(t.sum())
    assert scaled.device.type == "tpu"
    assert scaled.item() == 2.0 * 65536.0
