"""A new image size inside a warm bucket compiles nothing (TORCH_TPU_DYNAMIC_SHAPES=auto), through
the attention of a Diffusers transformer block too: its tokens, the h*w pixels of a [b, c, h, w]
image read as [b, h*w, c], take the product of the image's buckets as their bucket (40x40 = 1600 for
both 38x38 and 40x40, where each size's own bucket would be 1536 and 1664), read by gathering the
real pixels out of the padded image, and every op on the tokens keeps that bucket.
Every result is compared with PyTorch on the CPU; compiles are read from debug.stats()."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_tpu import debug

pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py


class SpatialAttention(nn.Module):
    """Diffusers' Transformer2DModel in small: group norm, a 1x1 projection, the pixels as tokens
    (permute + reshape), layer norm, multi-head self-attention, a residual, back to an image."""

    def __init__(self, c=16, heads=4):
        super().__init__()
        self.heads = heads
        self.norm, self.proj_in = nn.GroupNorm(4, c), nn.Conv2d(c, c, 1)
        self.ln, self.qkv, self.out = nn.LayerNorm(c), nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.proj_out = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        b, c, h, w = x.shape
        t = self.proj_in(self.norm(x)).permute(0, 2, 3, 1).reshape(b, h * w, c)
        q, k, v = self.qkv(self.ln(t)).view(b, h * w, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, h * w, c)
        t = self.out(a) + t
        return self.proj_out(t.reshape(b, h, w, c).permute(0, 3, 1, 2)) + x


def _pair():
    torch.manual_seed(0)
    cpu = SpatialAttention()
    return cpu, copy.deepcopy(cpu).to("tpu")


def test_attention_over_the_pixels_of_new_image_sizes_compiles_nothing():
    cpu, dev = _pair()
    # 24 compiles static, 30 makes the spatial dims dynamic (bucket 30: 29..30, tokens 900);
    # 29 is inside it; 28 is a bucket of its own (tokens 784), 27 inside that.
    with torch.no_grad():
        for side in (24, 30, 29, 28, 27):
            x = torch.randn(2, 16, side, side, generator=torch.Generator().manual_seed(side))
            debug.reset_stats()
            y = dev(x.to("tpu"))
            s = debug.stats()
            torch.testing.assert_close(y.cpu(), cpu(x), rtol=1e-4, atol=1e-5)
            if side in (29, 27):
                assert s["compiles"] == 0, (side, s["compiles_by_op"], s["exact_reasons"])


def test_attention_over_the_pixels_trains_equal_to_cpu_and_compiles_nothing():
    # The backward reads the tokens' product buckets too, and attention's saved
    # logsumexp (its rows rounded up to 32: 841 tokens save 864 rows, their bucket
    # 900 saves 928) is a padded result. The backward reads it cut to the real rows:
    # a window at the front of its storage at 30 (900 rows of 928), the whole
    # storage at 24 (576): one signature (dynamic.cpp FrontWindow), so the
    # backward turns dynamic at 30 with the rest and 29 compiles nothing.
    cpu, dev = _pair()
    for side in (24, 30, 29, 28, 27):
        x = torch.randn(2, 16, side, side, generator=torch.Generator().manual_seed(side))
        debug.reset_stats()
        y = dev(x.to("tpu"))
        y.square().mean().backward()
        s = debug.stats()
        want = cpu(x)
        want.square().mean().backward()
        torch.testing.assert_close(y.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-5)
        for (name, p), q in zip(dev.named_parameters(), cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=name)
        if side in (29, 27):
            assert s["compiles"] == 0, (side, s["compiles_by_op"], s["exact_reasons"])
        for m in (dev, cpu):
            m.zero_grad()


diffusers = pytest.importorskip("diffusers", reason="diffusers not installed (scripts/install.sh installs it)")

UNET = dict(sample_size=32, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=16, attention_head_dim=4, norm_num_groups=4)
VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
           up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(16, 32), layers_per_block=1,
           latent_channels=4, norm_num_groups=4)


def test_unet_and_vae_at_a_second_resolution_of_a_warm_bucket_compile_nothing():
    torch.manual_seed(0)
    cpu = diffusers.UNet2DConditionModel(**UNET).eval(), diffusers.AutoencoderKL(**VAE).eval()
    dev = tuple(copy.deepcopy(m).to("tpu") for m in cpu)

    def run(models, latents, t, text):
        with torch.no_grad():
            return models[1].decode(models[0](latents, t, encoder_hidden_states=text).sample).sample

    # Latent side 32, then 40 (the 40-bucket: 37..40; images 80); 38 and 40's neighbours
    # share it (a 512x512 and a 480x480 pipeline differ by a bucket: 64 and 60).
    for side in (32, 40, 38):
        g = torch.Generator().manual_seed(side)
        latents, text = torch.randn(1, 4, side, side, generator=g), torch.randn(1, 7, 16, generator=g)
        t = torch.tensor([10])
        debug.reset_stats()
        got = run(dev, latents.to("tpu"), t.to("tpu"), text.to("tpu")).cpu()
        s = debug.stats()
        torch.testing.assert_close(got, run(cpu, latents, t, text), rtol=1e-4, atol=1e-4)
        if side == 38:
            assert s["compiles"] == 0, (s["compiles_by_op"], s["exact_reasons"])
            assert s["dynamic_hits"] > 100
