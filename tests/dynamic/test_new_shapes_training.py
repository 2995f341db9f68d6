"""A ragged last batch inside a warm bucket compiles nothing (TORCH_TPU_DYNAMIC_SHAPES=auto):
forward, backward (GELU, cross-entropy) and the AdamW step of a small MLP,
losses, gradients and parameters compared with PyTorch on the CPU."""
import pytest
import torch
import torch.nn as nn

from torch_tpu import debug


pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py


def make():
    return nn.Sequential(nn.Linear(24, 48), nn.GELU(), nn.Linear(48, 10))  # LayerNorm: exact shapes


def test_ragged_batches_in_a_warm_bucket_compile_nothing():
    torch.manual_seed(0)
    cpu = make()
    dev = make()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("tpu")
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2)

    def step(b, seed):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(b, 24, generator=g), torch.randint(0, 10, (b,), generator=g)
        losses = []
        for model, opt, device in ((cpu, opt_cpu, "cpu"), (dev, opt_dev, "tpu")):
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().cpu())
        return losses

    for i, b in enumerate((32, 32, 19)):  # 19 (bucket 20) makes the batch dim dynamic
        step(b, i)
    for i, b in enumerate((20, 32, 19)):
        debug.reset_stats()
        loss_cpu, loss_dev = step(b, 10 + i)
        s = debug.stats()
        assert s["compiles"] == 0, (b, s["compiles_by_op"])
        assert s["fallbacks"] == {}
        torch.testing.assert_close(loss_dev, loss_cpu, rtol=1e-5, atol=1e-6)
    for pc, pd in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(pd.detach().cpu(), pc.detach(), rtol=1e-4, atol=1e-5)
