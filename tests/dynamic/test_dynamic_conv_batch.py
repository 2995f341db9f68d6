"""Convolutions, poolings, upsampling, batch norm and group norm run bounded-dynamic in their batch dim
(TORCH_TPU_DYNAMIC_SHAPES=auto): a CNN's ragged last batch (a DataLoader
without drop_last) compiles nothing inside a warm batch bucket. Their channel
and spatial dims stay static (XLA's padder refuses a dynamic spatial
convolution), and debug.stats() says so for a new resolution. Every loss
and weight is compared with PyTorch on the CPU; compiles are read from
debug.stats()."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_tpu import debug

pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py


class Cnn(nn.Module):
    """Strided, dilated, grouped and transposed 2-d convolutions, a 1-d one,
    batch norm (training: running statistics), group norm, max / avg /
    adaptive pooling, nearest and bilinear upsampling, and a linear head."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=2, dilation=2, groups=2)
        self.norm = nn.GroupNorm(4, 8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.c3 = nn.Conv1d(4, 6, 3, padding=1)
        self.head = nn.Linear(6, 5)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)  # [b, 8, 8, 8]
        h = F.avg_pool2d(F.silu(self.norm(self.c2(h))), 2, ceil_mode=True)  # [b, 8, 2, 2]
        h = F.interpolate(h, scale_factor=2)              # [b, 8, 4, 4]
        h = F.interpolate(h, size=(2, 2), mode="bilinear")
        h = self.up(h)                                    # [b, 4, 4, 4]
        h = self.c3(h.flatten(2))                         # [b, 6, 16]
        h = F.adaptive_avg_pool2d(h.unsqueeze(-1), (1, 1)).flatten(1)
        return self.head(h)


def _pair():
    torch.manual_seed(0)
    cpu = Cnn()
    dev = Cnn()
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev.to("tpu")


def _step(model, opt, x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def test_ragged_batches_train_equal_to_cpu_and_compile_nothing():
    cpu, dev = _pair()
    opts = torch.optim.SGD(cpu.parameters(), lr=0.1), torch.optim.SGD(dev.parameters(), lr=0.1)
    # Batch 8, then 6: the second size makes the batch dim dynamic (bucket 8).
    for i, b in enumerate((8, 6, 5, 7, 3)):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(b, 3, 16, 16, generator=g), torch.randint(0, 5, (b,), generator=g)
        debug.reset_stats()
        got = _step(dev, opts[1], x.to("tpu"), y.to("tpu"))
        s = debug.stats()
        want = _step(cpu, opts[0], x, y)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(dev.state_dict().items(), cpu.state_dict().values()):  # running stats too
            torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6, msg=name)
        if i >= 2:
            assert s["compiles"] == 0, (b, s["compiles_by_op"], s["exact_reasons"])
    # Evaluation (batch norm on its running statistics) at new batch sizes.
    cpu.eval(), dev.eval()
    with torch.no_grad():
        for b in (4, 6, 7):
            x = torch.randn(b, 3, 16, 16, generator=torch.Generator().manual_seed(b))
            debug.reset_stats()
            torch.testing.assert_close(dev(x.to("tpu")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)
            if b == 7:
                assert debug.stats()["compiles"] == 0, (debug.stats()["compiles_by_op"], debug.stats()["exact_reasons"])


def test_a_new_resolution_runs_exact_and_says_why():
    torch.manual_seed(1)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    dev = nn.Conv2d(3, 4, 3, padding=1).to("tpu")
    dev.load_state_dict(conv.state_dict())
    with torch.no_grad():
        for side in (8, 10, 12):
            x = torch.randn(2, 3, side, side)
            debug.reset_stats()
            torch.testing.assert_close(dev(x.to("tpu")).cpu(), conv(x), rtol=1e-5, atol=1e-6)
    reasons = debug.stats()["exact_reasons"].get("convolution", {})
    assert "a convolution's spatial and channel dims are static" in reasons, debug.stats()["exact_reasons"]


def test_group_norm_with_its_own_n_and_hxw_is_keyed_by_them():
    # native_group_norm's N and HxW need not be the input's own split: [2, 4, 3, 3]
    # normalised as one sample of 4 channels of 18 elements is another op (and
    # another executable) than two samples of 9, here and on the CPU.
    torch.manual_seed(2)
    x, w, b = torch.randn(2, 4, 3, 3), torch.randn(4), torch.randn(4)
    for n, hxw in ((2, 9), (1, 18), (2, 9)):
        want = torch.ops.aten.native_group_norm(x, w, b, n, 4, hxw, 2, 1e-5)
        got = torch.ops.aten.native_group_norm(x.to("tpu"), w.to("tpu"), b.to("tpu"), n, 4, hxw, 2, 1e-5)
        for g, c in zip(got, want):
            assert g.shape == c.shape
            torch.testing.assert_close(g.cpu(), c, rtol=1e-5, atol=1e-6)
