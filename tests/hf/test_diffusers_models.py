"""Diffusers models and schedulers on "tpu" next to CPU: tiny configs, random weights, no hub.

Each model: eval forward equal to CPU, one AdamW step (MSE loss) giving the same gradients and
parameters as CPU, and no CPU fallback. Schedulers: step() on tpu tensors equal to CPU's (noise
drawn from a CPU generator, as diffusers' randn_tensor allows), no CPU fallback.
"""
import copy

import pytest
import torch

diffusers = pytest.importorskip("diffusers", reason="diffusers not installed (scripts/install.sh installs it)")

import torch_tpu  # noqa: E402

# Shared with test_diffusers_pipelines.py: same shapes, so its pipelines hit the compile cache.
UNET_COND = dict(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                 attention_head_dim=2, norm_num_groups=4)
VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
           up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(8, 16),
           layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16)
# DiTPipeline's unconditional class is 1000, so the label table needs 1000 classes.
DIT = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2,
           sample_size=8, patch_size=2, num_embeds_ada_norm=1000, norm_num_groups=4)


def _inputs(name):
    g = torch.Generator().manual_seed(1)
    if name == "unet":
        return dict(sample=torch.randn(2, 4, 8, 8, generator=g), timestep=torch.tensor([3, 70]),
                    encoder_hidden_states=torch.randn(2, 5, 16, generator=g))
    if name == "vae":  # batch 1: StableDiffusionPipeline / DiTPipeline decode one image
        return dict(sample=torch.randn(1, 3, 16, 16, generator=g), sample_posterior=False)
    return dict(hidden_states=torch.randn(2, 4, 8, 8, generator=g), timestep=torch.tensor([3, 70]),
                class_labels=torch.tensor([1, 999]))


def _model(name):
    if name == "unet":
        return diffusers.UNet2DConditionModel(**UNET_COND)
    if name == "vae":
        return diffusers.AutoencoderKL(**VAE)
    return diffusers.DiTTransformer2DModel(**DIT)


def _to(inputs, device):
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}


@pytest.mark.parametrize("name", ["unet", "vae", "dit"])
def test_model_forward_and_adamw_step_match_cpu(name):
    torch.manual_seed(0)
    cpu = _model(name)
    for m in cpu.modules():  # the DiT label embedding drops labels at random in training
        if hasattr(m, "dropout_prob"):
            m.dropout_prob = 0.0
    dev = copy.deepcopy(cpu).to("tpu")
    inputs = _inputs(name)
    torch_tpu.debug.reset_stats()

    cpu.eval(), dev.eval()
    with torch.no_grad():
        ref = cpu(**inputs).sample
        out = dev(**_to(inputs, "tpu")).sample
    assert out.device.type == "tpu" and out.shape == ref.shape
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)

    # One training step. AdamW's eps is 1e-6: with the default 1e-8, parameters whose gradient
    # is rounding noise (e.g. attention key biases, mathematically 0) move by +-lr on both.
    initial = [p.detach().clone() for p in cpu.parameters()]
    grads = {}
    for m, device in ((cpu, "cpu"), (dev, "tpu")):
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, eps=1e-6)
        pred = m(**_to(inputs, device)).sample
        loss = torch.nn.functional.mse_loss(pred, torch.zeros_like(pred))
        loss.backward()
        grads[device] = [p.grad.detach().cpu().clone() for p in m.parameters()]
        opt.step()
        opt.zero_grad()
    for (k, _), gc, gd in zip(cpu.named_parameters(), grads["cpu"], grads["tpu"]):
        torch.testing.assert_close(gd, gc, rtol=1e-4, atol=1e-6, msg=lambda s: f"grad {k}: {s}")
    # The step itself, against PyTorch's AdamW on the CPU given the same (tpu) gradients: a
    # parameter whose gradient is about eps moves by a fraction of lr that a gradient
    # difference within the tolerance above changes by up to ~1% of lr (seen on an Intel host).
    ref = [p0.clone().requires_grad_() for p0 in initial]
    for r, g in zip(ref, grads["tpu"]):
        r.grad = g
    torch.optim.AdamW(ref, lr=1e-3, eps=1e-6).step()
    for (k, _), r, pd in zip(cpu.named_parameters(), ref, dev.parameters()):
        assert pd.device.type == "tpu"
        torch.testing.assert_close(pd.detach().cpu(), r.detach(), rtol=1e-5, atol=1e-6, msg=lambda s: f"{k}: {s}")
    moved = 0.0
    for pc, p0 in zip(cpu.parameters(), initial):
        moved = max(moved, (pc.detach() - p0).abs().max().item())
    assert moved > 5e-4  # the step really changed the weights (by about lr)
    assert torch_tpu.debug.stats()["fallbacks"] == {}


# ---------------------------------------------------------------- schedulers


def _run_scheduler(cls, device, steps=4, **config):
    s = cls(num_train_timesteps=100, **config)
    s.set_timesteps(steps, device=device)
    x = (torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0)) * s.init_noise_sigma).to(device)
    gen = torch.Generator("cpu").manual_seed(3)  # variance noise drawn on CPU, moved to the device
    trajectory = []
    for t in s.timesteps:
        xin = s.scale_model_input(x, t)
        eps = torch.sin(3.0 * xin) + 0.01 * t  # a deterministic stand-in for the model
        kwargs = {"generator": gen}
        if cls is diffusers.DDIMScheduler:
            kwargs["eta"] = 0.5  # stochastic DDIM: uses the generator too
        if cls is diffusers.EulerDiscreteScheduler:
            kwargs.update(s_churn=0.5)
        if "generator" not in cls.step.__code__.co_varnames:
            kwargs = {}
        x = s.step(eps, t, x, **kwargs).prev_sample
        assert x.device.type == device
        trajectory.append(x.cpu())
    return torch.stack(trajectory)


@pytest.mark.parametrize("cls_name", ["DDPMScheduler", "DDIMScheduler", "EulerDiscreteScheduler",
                                      "UniPCMultistepScheduler", "KDPM2DiscreteScheduler"])
def test_scheduler_step_matches_cpu(cls_name):
    # UniPC solves a small linear system (torch.linalg.solve) each step; KDPM2 uses torch.lerp.
    cls = getattr(diffusers, cls_name)
    ref = _run_scheduler(cls, "cpu")
    torch_tpu.debug.reset_stats()
    out = _run_scheduler(cls, "tpu")
    assert torch_tpu.debug.stats()["fallbacks"] == {}
    assert not torch.equal(ref[0], ref[-1])
    # UniPC's float32 solve of a small Vandermonde-like system is the least accurate step (~7e-6).
    atol = 3e-5 if cls_name == "UniPCMultistepScheduler" else 1e-5
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=atol)


# ---------------------------------------------------------------- the ops behind them


def test_lerp_matches_cpu():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    w = torch.tensor([-0.5, 0.2, 0.5, 1.5])
    torch_tpu.debug.reset_stats()
    for args in ((a, b, 0.3), (a, b, 0.7), (a, b, w), (a[:1], b, w)):
        out = torch.lerp(*[x.to("tpu") if torch.is_tensor(x) else x for x in args])
        assert torch.equal(out.cpu(), torch.lerp(*args))
    x = a.to("tpu")
    x.lerp_(b.to("tpu"), 0.25)
    assert torch.equal(x.cpu(), a.lerp(b, 0.25))
    h = torch.lerp(a.bfloat16().to("tpu"), b.bfloat16().to("tpu"), 0.3)
    assert torch.equal(h.cpu(), a.bfloat16().lerp(b.bfloat16(), 0.3))
    wd = w.to("tpu").requires_grad_()
    torch.lerp(a.to("tpu"), b.to("tpu"), wd).sum().backward()
    wc = w.clone().requires_grad_()
    torch.lerp(a, b, wc).sum().backward()
    torch.testing.assert_close(wd.grad.cpu(), wc.grad)
    assert torch_tpu.debug.stats()["fallbacks"] == {}


def test_linalg_solve_and_lu_match_cpu():
    torch.manual_seed(0)
    torch_tpu.debug.reset_stats()
    A = torch.randn(2, 4, 4, dtype=torch.float64)
    B = torch.randn(2, 4, 3, dtype=torch.float64)
    Ad, Bd = A.to("tpu"), B.to("tpu")
    torch.testing.assert_close(torch.linalg.solve(Ad, Bd).cpu(), torch.linalg.solve(A, B))
    torch.testing.assert_close(torch.linalg.solve(Ad, Bd.mT, left=False).cpu(), torch.linalg.solve(A, B.mT, left=False))
    LU, piv = torch.linalg.lu_factor(A)
    LUd, pivd = torch.linalg.lu_factor(Ad)
    torch.testing.assert_close(LUd.cpu(), LU)
    assert torch.equal(pivd.cpu(), piv)
    torch.testing.assert_close(torch.linalg.lu_solve(LUd, pivd, Bd, adjoint=True).cpu(),
                               torch.linalg.lu_solve(LU, piv, B, adjoint=True))
    # Row exchanges needed (zero leading entry), a vector right-hand side, float32 like the schedulers.
    P = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(torch.linalg.solve(P.to("tpu"), P[0].to("tpu")).cpu(), torch.linalg.solve(P, P[0]))
    ac, ad = A.clone().requires_grad_(), Ad.clone().requires_grad_()
    torch.linalg.solve(ac, B).square().sum().backward()
    torch.linalg.solve(ad, Bd).square().sum().backward()
    torch.testing.assert_close(ad.grad.cpu(), ac.grad)
    assert torch_tpu.debug.stats()["fallbacks"] == {}
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]], device="tpu")
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.solve(singular, torch.ones(2, device="tpu"))
    assert torch.linalg.lu_factor_ex(singular).info.item() == 2
