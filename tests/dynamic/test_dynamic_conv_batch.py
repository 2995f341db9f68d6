"""Convolutions, poolings, upsampling, batch norm and group norm run bounded-dynamic in their batch dim
(TORCH_TPU_DYNAMIC_SHAPES=auto): a CNN's ragged last batch (a DataLoader
without drop_last) compiles nothing inside a warm batch bucket.
Convolutions (run static at the bucket on zero-filled padding), max pooling
(on -inf padding), average pooling whose windows never clip at the end,
global average pooling, group norm and nearest upsampling by a scale factor
are dynamic in their spatial dims too: a new image size inside a warm bucket
compiles nothing, in training as in evaluation. Average pooling with
ceil_mode, adaptive pooling to other sizes and bilinear upsampling keep their
spatial dims static, and debug.stats() says so for a new resolution. Every loss and
weight is compared with PyTorch on the CPU; compiles are read from
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


def _pair(model=None, seed=0):
    """A CPU model and its copy on tpu, with the same weights."""
    torch.manual_seed(seed)
    cpu = (model or Cnn)()
    dev = (model or Cnn)()
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev.to("tpu")


def _step(model, opt, x, y, loss=F.cross_entropy):
    opt.zero_grad()
    value = loss(model(x), y)
    value.backward()
    opt.step()
    return value.detach()


def _train_equal_to_cpu(cpu, dev, batches, loss=F.cross_entropy, warm=2, atol=1e-6):
    """SGD steps on `batches` (CPU (input, target) pairs) on both models: each loss and every
    state entry (running statistics too) equal to CPU's; nothing compiles after the first `warm`."""
    opts = torch.optim.SGD(cpu.parameters(), lr=0.1), torch.optim.SGD(dev.parameters(), lr=0.1)
    for i, (x, y) in enumerate(batches):
        debug.reset_stats()
        got = _step(dev, opts[1], x.to("tpu"), y.to("tpu"), loss)
        s = debug.stats()
        want = _step(cpu, opts[0], x, y, loss)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(dev.state_dict().items(), cpu.state_dict().values()):
            torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=atol, msg=name)
        if i >= warm:
            assert s["compiles"] == 0, (tuple(x.shape), s["compiles_by_op"], s["exact_reasons"])
            assert s["dynamic_hits"] > 0


def test_ragged_batches_train_equal_to_cpu_and_compile_nothing():
    cpu, dev = _pair()
    # Batch 8, then 6: the second size makes the batch dim dynamic (bucket 8).
    batches = []
    for i, b in enumerate((8, 6, 5, 7, 3)):
        g = torch.Generator().manual_seed(i)
        batches.append((torch.randn(b, 3, 16, 16, generator=g), torch.randint(0, 5, (b,), generator=g)))
    _train_equal_to_cpu(cpu, dev, batches)
    # Evaluation (batch norm on its running statistics) at new batch sizes.
    cpu.eval(), dev.eval()
    with torch.no_grad():
        for b in (4, 6, 7):
            x = torch.randn(b, 3, 16, 16, generator=torch.Generator().manual_seed(b))
            debug.reset_stats()
            torch.testing.assert_close(dev(x.to("tpu")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)
            if b == 7:
                assert debug.stats()["compiles"] == 0, (debug.stats()["compiles_by_op"], debug.stats()["exact_reasons"])


class FullyConvolutional(nn.Module):
    """The ops a diffusion UNet or VAE runs at a new image size: 3x3 / strided / dilated / grouped / 1x1 /
    transposed convolutions, group norm, nearest upsampling by a scale factor, SiLU."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.n1 = nn.GroupNorm(4, 8)
        self.down = nn.Conv2d(8, 8, 3, stride=2, padding=2, dilation=2, groups=2)
        self.n2 = nn.GroupNorm(2, 8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.c2 = nn.Conv2d(4, 4, 3, stride=2)
        self.out = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        h = F.silu(self.n1(self.c1(x)))
        h = F.silu(self.n2(self.down(h)))                 # ceil(r / 2)
        h = F.interpolate(h, scale_factor=2.0)            # 2 * ceil(r / 2)
        h = self.c2(F.silu(self.up(h)))                   # (4 * ceil(r / 2) - 3) // 2 + 1
        return self.out(h)


def test_new_resolutions_in_a_warm_bucket_train_equal_to_cpu_and_compile_nothing():
    cpu, dev = _pair(FullyConvolutional, seed=3)
    # 32 compiles static, 40 makes the spatial dims dynamic (bucket 40: 37..40;
    # its stride-2 results 19..20 in bucket 20); odd and even sizes follow.
    batches = []
    for i, side in enumerate((32, 40, 38, 37, 39)):
        g = torch.Generator().manual_seed(i)
        out = (4 * ((side + 1) // 2) - 3) // 2 + 1
        batches.append((torch.randn(2, 3, side, side, generator=g), torch.randn(2, 2, out, out, generator=g)))
    _train_equal_to_cpu(cpu, dev, batches, loss=F.mse_loss)
    cpu.eval(), dev.eval()
    with torch.no_grad():
        # A new bucket (36: 33..36) at 36 and 33 (an odd side: its stride-2
        # and upsampled dims meet buckets 36 did not), then sizes inside it.
        for side in (36, 33, 34, 35):
            x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(side))
            debug.reset_stats()
            torch.testing.assert_close(dev(x.to("tpu")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)
            if side in (34, 35):
                assert debug.stats()["compiles"] == 0, (side, debug.stats()["compiles_by_op"], debug.stats()["dynamic_compiles_by_op"], debug.stats()["exact_reasons"])


def test_upsampling_to_an_explicit_size_keeps_it_in_the_key():
    # interpolate(size=...) maps by the ratio of the sizes: its spatial dims stay
    # static, and each output size is its own signature (values equal CPU).
    x = torch.randn(1, 2, 6, 6)
    for size in ((9, 9), (12, 12), (11, 10)):
        for mode in ("nearest", "nearest-exact"):
            want = F.interpolate(x, size=size, mode=mode)
            got = F.interpolate(x.to("tpu"), size=size, mode=mode)
            torch.testing.assert_close(got.cpu(), want)
    # By a scale factor at new sizes: dynamic, backward included.
    for side in (6, 8, 7):
        x = torch.randn(2, 3, side, side, requires_grad=True)
        xd = x.detach().to("tpu").requires_grad_()
        for scale in (2.0, 1.5):
            F.interpolate(x, scale_factor=scale).square().sum().backward()
            F.interpolate(xd, scale_factor=scale).square().sum().backward()
        torch.testing.assert_close(xd.grad.cpu(), x.grad)


class Classifier(nn.Module):
    """A ResNet stem and head: strided 7x7 convolution, batch norm, max pooling (3, stride 2, padding 1),
    a 3x3 convolution and a global average pooling before the linear classifier."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn1 = nn.Conv2d(3, 8, 7, stride=2, padding=3), nn.BatchNorm2d(8)
        self.conv, self.bn2 = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.stem(x))), 3, stride=2, padding=1)
        h = F.relu(self.bn2(self.conv(h)))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def test_a_classifier_at_new_image_sizes_trains_equal_to_cpu_and_compiles_nothing():
    # Max pooling runs static at the bucket on -inf padding, its indices counted in the
    # real plane; the global average pooling divides by the real count.
    cpu, dev = _pair(Classifier, seed=4)
    batches = []
    for i, side in enumerate((32, 40, 38, 37, 39)):
        g = torch.Generator().manual_seed(i)
        batches.append((torch.randn(4, 3, side, side, generator=g), torch.randint(0, 5, (4,), generator=g)))
    _train_equal_to_cpu(cpu, dev, batches, atol=1e-5)


def test_max_pooling_at_new_sizes_keeps_cpus_indices_and_nan():
    # Windows past the real plane (ceil_mode, padding) and NaN: values and indices as CPU's.
    for side in (9, 12, 11, 10):
        x = torch.randn(2, 3, side, side + 1, generator=torch.Generator().manual_seed(side))
        x[0, 0, 1, 1] = float("nan")
        for kw in (dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                   dict(kernel_size=2, dilation=2)):
            xc = x.clone().requires_grad_()
            xd = x.to("tpu").requires_grad_()
            want, wi = F.max_pool2d(xc, return_indices=True, **kw)
            got, gi = F.max_pool2d(xd, return_indices=True, **kw)
            torch.testing.assert_close(got.cpu(), want, equal_nan=True)
            assert torch.equal(gi.cpu(), wi), kw
            want.nan_to_num().sum().backward()
            got.nan_to_num().sum().backward()
            torch.testing.assert_close(xd.grad.cpu(), xc.grad)


def test_average_pooling_at_new_sizes_equals_cpu():
    # Dynamic in space where its real windows divide alike at the bucket (no ceil_mode;
    # count_include_pad or no padding; a divisor override); static otherwise.
    for side in (9, 12, 11, 10):
        x = torch.randn(2, 3, side, side + 1, generator=torch.Generator().manual_seed(side))
        for kw in (dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                   dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
                   dict(kernel_size=2, ceil_mode=True), dict(kernel_size=3, stride=2, divisor_override=5)):
            xc = x.clone().requires_grad_()
            xd = x.to("tpu").requires_grad_()
            want, got = F.avg_pool2d(xc, **kw), F.avg_pool2d(xd, **kw)
            torch.testing.assert_close(got.cpu(), want, msg=str(kw))
            want.square().sum().backward()
            got.square().sum().backward()
            torch.testing.assert_close(xd.grad.cpu(), xc.grad, msg=str(kw))


def test_a_pooling_at_a_new_resolution_runs_exact_and_says_why():
    with torch.no_grad():
        for side in (8, 10, 12):
            x = torch.randn(2, 3, side, side)
            debug.reset_stats()
            want = F.avg_pool2d(x, 3, 2, ceil_mode=True)
            torch.testing.assert_close(F.avg_pool2d(x.to("tpu"), 3, 2, ceil_mode=True).cpu(), want)
    reasons = debug.stats()["exact_reasons"].get("avg_pool2d", {})
    assert "the channel and spatial dims of a pooling or upsampling are static" in reasons, debug.stats()["exact_reasons"]


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


class PatchClassifier(nn.Module):
    """A ViT's patch embedding and class token: the convolution's backward reads the
    `[:, 1:, :]` window of the cat's gradient split into the 4x4 patch grid (a view no
    padded layout maps: the module gathers it out of the batch-padded buffer)."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 16, 4, stride=4)
        self.cls = nn.Parameter(torch.randn(1, 1, 16))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        e = self.patch(x).flatten(2).transpose(1, 2)  # [b, 16 patches, 16]
        e = torch.cat([self.cls.expand(x.shape[0], -1, -1), e], 1)  # [b, 17, 16]
        return self.head(torch.tanh(e).mean(1))


def test_a_vit_patch_embedding_at_new_batch_sizes_compiles_nothing():
    cpu, dev = _pair(PatchClassifier)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(b, 3, 16, 16, generator=g), torch.randint(0, 5, (b,), generator=g))
               for b in (8, 6, 7, 5, 3)]
    _train_equal_to_cpu(cpu, dev, batches, atol=1e-5)


@pytest.mark.parametrize("mode, dims", [("reflect", 1), ("reflect", 2), ("replicate", 2), ("replicate", 3)])
def test_reflection_and_replication_pads_at_new_batch_sizes_compile_nothing(mode, dims):
    # They ran exact shapes at every batch size; now dynamic in the dims before
    # the ones they pad (batch, channels), those static: they read the border.
    pad = (1, 2) * dims
    scale = torch.rand(3, *(1,) * dims) + 0.5
    compiles = []
    for b in (3, 5, 8, 6, 7):  # 6 and 7 in the warm 8-bucket (the pad and its backward compiled)
        x = torch.randn((b, 3) + (6,) * dims)
        w = torch.randn(F.pad(x, pad, mode=mode).shape)
        s_tpu = scale.to("tpu").requires_grad_()
        debug.reset_stats()
        y = F.pad(x.to("tpu") * s_tpu, pad, mode=mode)
        (y * w.to("tpu")).sum().backward()  # the pad's backward reaches the scale
        compiles.append(sum(n for op, n in debug.stats()["compiles_by_op"].items() if "_pad" in op))
        s_cpu = scale.clone().requires_grad_()
        want = F.pad(x * s_cpu, pad, mode=mode)
        (want * w).sum().backward()
        torch.testing.assert_close(y.detach().cpu(), want.detach())
        torch.testing.assert_close(s_tpu.grad.cpu(), s_cpu.grad, atol=1e-4, rtol=1e-5)
    assert compiles[3:] == [0, 0], compiles
    # a new width compiles its own executable (the padded dims are static, in its key)
    debug.reset_stats()
    F.pad(torch.randn((6, 3) + (7,) * dims, device="tpu") * 1.0, pad, mode=mode).cpu()
    assert sum(n for op, n in debug.stats()["compiles_by_op"].items() if "_pad" in op) == 1
