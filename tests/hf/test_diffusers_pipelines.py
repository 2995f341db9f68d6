"""Diffusers pipelines with pipe.to("tpu") next to the same pipeline on CPU.

Each pipeline is built from tiny configs with random weights (and, for Stable Diffusion, a CLIP
tokenizer made from a vocab/merges file written here), saved with save_pretrained and loaded back
with from_pretrained, so the real loading path runs. Same seed from a CPU generator: images equal
to CPU's; no CPU fallback. A generator on the device ("tpu") works too: reproducible per seed.
"""
import json

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers", reason="diffusers not installed (scripts/install.sh installs it)")

import torch_tpu  # noqa: E402
from test_diffusers_models import DIT, UNET_COND, VAE  # noqa: E402  (same shapes: shared compile cache)

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _tokenizer(path):
    from transformers import CLIPTokenizer

    vocab = ["<|startoftext|>", "<|endoftext|>"] + list(LETTERS) + [c + "</w>" for c in LETTERS]
    vocab += ["ca", "cat</w>", "do", "dog</w>"]
    path.mkdir()
    (path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (path / "merges.txt").write_text("#version: 0.2\nc a\nca t</w>\nd o\ndo g</w>\n")
    # model_max_length 5: prompts are padded to 5 tokens (the UNet test's encoder states).
    tok = CLIPTokenizer(str(path / "vocab.json"), str(path / "merges.txt"), model_max_length=5)
    assert tok("a cat").input_ids == [0, vocab.index("a</w>"), vocab.index("cat</w>"), 1]
    return tok, len(vocab)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from transformers import CLIPTextConfig, CLIPTextModel

    root = tmp_path_factory.mktemp("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                                 block_out_channels=(8, 16), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4,
                                 attention_head_dim=4)
    diffusers.DDPMPipeline(unet=unet, scheduler=diffusers.DDPMScheduler(num_train_timesteps=100)).save_pretrained(
        root / "ddpm")

    tok, vocab_size = _tokenizer(root / "tok")
    text = CLIPTextModel(CLIPTextConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=8,
                                        projection_dim=16, bos_token_id=0, eos_token_id=1, pad_token_id=1))
    vae = diffusers.AutoencoderKL(**VAE)
    scheduler = diffusers.DDIMScheduler(num_train_timesteps=100, beta_schedule="scaled_linear", clip_sample=False,
                                        set_alpha_to_one=False, steps_offset=1)
    diffusers.StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=tok,
                                      unet=diffusers.UNet2DConditionModel(**UNET_COND), scheduler=scheduler,
                                      safety_checker=None, feature_extractor=None,
                                      requires_safety_checker=False).save_pretrained(root / "sd")

    diffusers.DiTPipeline(transformer=diffusers.DiTTransformer2DModel(**DIT), vae=vae,
                          scheduler=diffusers.EulerDiscreteScheduler(num_train_timesteps=100)).save_pretrained(
        root / "dit")
    return root


CASES = {
    "ddpm": ("DDPMPipeline", dict(batch_size=1, num_inference_steps=3)),
    # guidance > 1: classifier-free guidance, the UNet / DiT run on a batch of 2.
    "sd": ("StableDiffusionPipeline", dict(prompt="a cat", height=16, width=16, num_inference_steps=2,
                                           guidance_scale=5.0)),
    "dit": ("DiTPipeline", dict(class_labels=[7], num_inference_steps=2, guidance_scale=4.0)),
}


def _load(saved, name, device):
    pipe = getattr(diffusers, CASES[name][0]).from_pretrained(saved / name).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _images(pipe, name, generator):
    return pipe(generator=generator, output_type="np", **CASES[name][1]).images


@pytest.mark.parametrize("name", list(CASES))
def test_pipeline_matches_cpu(saved, name):
    ref = _images(_load(saved, name, "cpu"), name, torch.Generator("cpu").manual_seed(0))
    pipe = _load(saved, name, "tpu")
    assert pipe.device.type == "tpu"
    assert all(p.device.type == "tpu" for m in pipe.components.values()
               if isinstance(m, torch.nn.Module) for p in m.parameters())
    torch_tpu.debug.reset_stats()
    out = _images(pipe, name, torch.Generator("cpu").manual_seed(0))
    assert torch_tpu.debug.stats()["fallbacks"] == {}
    assert out.shape == ref.shape and ref.std() > 0.01  # a real image, not a constant
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["ddpm", "sd"])
def test_pipeline_with_device_generator(saved, name):
    pipe = _load(saved, name, "tpu")
    torch_tpu.debug.reset_stats()
    a = _images(pipe, name, torch.Generator("tpu").manual_seed(0))
    b = _images(pipe, name, torch.Generator("tpu").manual_seed(0))
    c = _images(pipe, name, torch.Generator("tpu").manual_seed(1))
    assert torch_tpu.debug.stats()["fallbacks"] == {}
    assert np.isfinite(a).all() and a.std() > 0.01
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 0.05
