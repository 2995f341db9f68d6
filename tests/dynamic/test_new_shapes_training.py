"""A ragged last batch inside a warm bucket compiles nothing (TORCH_TPU_DYNAMIC_SHAPES=auto):
forward, backward (GELU, LayerNorm, cross-entropy) and the AdamW step of a small MLP,
losses, gradients and parameters compared with PyTorch on the CPU."""
import pytest
import torch
import torch.nn as nn

from torch_tpu import debug


pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py


def make():
    return nn.Sequential(nn.Linear(24, 48), nn.GELU(), nn.LayerNorm(48), nn.Linear(48, 10))


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


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_norms_on_rows_padded_in_batch_and_sequence(norm):
    # [b, s, h] padded in both b and s: the statistics reduce h in place (a reshape
    # to [b*s, h] and back mixed the padding rows into the real ones).
    torch.manual_seed(0)
    w, bias = torch.randn(32), torch.randn(32)
    dw, db = w.to("tpu").requires_grad_(), bias.to("tpu").requires_grad_()
    cw, cb = w.clone().requires_grad_(), bias.clone().requires_grad_()
    ds, cs = torch.ones(32, device="tpu", requires_grad=True), torch.ones(32, requires_grad=True)

    def f(x, weight, b):
        if norm == "layer_norm":
            return nn.functional.layer_norm(x, (32,), weight, b, 1e-5)
        return nn.functional.rms_norm(x, (32,), weight, 1e-6)

    def run(b, s):
        x = torch.randn(b, s, 32)
        g = torch.randn(b, s, 32)
        grads = []
        for device, weight, b, scale in (("tpu", dw, db, ds), ("cpu", cw, cb, cs)):
            h = torch.exp(x.to(device) * 0.5) * scale  # dynamic once b and s changed
            h.retain_grad()  # the norm's input gradient
            y = f(h, weight, b)
            y.backward(g.to(device))
            grads.append((y, h.grad))
        return (grads[0][0], grads[1][0]), (grads[0][1], grads[1][1])

    for b, s in ((9, 19), (10, 20)):  # batch bucket 16 (smaller batches reuse it), sequence 20
        run(b, s)
    for b, s in ((5, 19), (2, 20)):
        for p in (dw, db, cw, cb, ds, cs):
            p.grad = None
        debug.reset_stats()
        (y, yc), (gx, gxc) = run(b, s)
        stats = debug.stats()
        torch.testing.assert_close(y.detach().cpu(), yc.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gx.cpu(), gxc, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(dw.grad.cpu(), cw.grad, rtol=1e-4, atol=1e-4)
        if norm == "layer_norm":
            torch.testing.assert_close(db.grad.cpu(), cb.grad, rtol=1e-4, atol=1e-4)
        dynamic = stats["dynamic_compiles_by_op"]
        assert stats["compiles"] == 0, ((b, s), stats["compiles_by_op"], dynamic)
