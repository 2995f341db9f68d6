"""Training on tpu follows the CPU run step by step."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: str, momentum: float,
           steps: int = 20) -> tuple[list[float], list[torch.Tensor], list[torch.Tensor]]:
    model = copy.deepcopy(model).to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [p.detach().cpu() for p in model.parameters()]
    grads = [p.grad.detach().cpu() for p in model.parameters()]
    return losses, params, grads


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_mlp_sgd_matches_cpu(momentum):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(64, 8)
    y = torch.randn(64, 4)
    cpu_losses, cpu_params, cpu_grads = _train(model, x, y, "cpu", momentum)
    tpu_losses, tpu_params, tpu_grads = _train(model, x, y, "tpu", momentum)
    assert cpu_losses[-1] < cpu_losses[0] * 0.9  # it actually trains
    for step, (c, t) in enumerate(zip(cpu_losses, tpu_losses)):
        assert abs(c - t) <= 1e-5 * abs(c), f"step {step}: cpu {c} tpu {t}"
    for c, t in zip(cpu_params, tpu_params):
        torch.testing.assert_close(t, c, rtol=0, atol=1e-5)
    for c, t in zip(cpu_grads, tpu_grads):
        torch.testing.assert_close(t, c, rtol=1e-4, atol=1e-6)


def test_backward_through_views_and_inplace():
    base = torch.randn(6, 5)

    def run(device: str) -> torch.Tensor:
        w = base.clone().to(device).requires_grad_()
        h = w * 1.0
        h[:, 1:3].mul_(2)
        h = h.t()[::2] + h[:3].sum()
        (h.relu() ** 2).sum().backward()
        return w.grad.cpu()

    torch.testing.assert_close(run("tpu"), run("cpu"), rtol=1e-5, atol=1e-5)
    # Gradients land on the parameter's device.
    p = torch.ones(3, device="tpu", requires_grad=True)
    (p * 2).sum().backward()
    assert p.grad.device == p.device and torch.equal(p.grad.cpu(), torch.full((3,), 2.0))
