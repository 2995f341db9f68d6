"""Hugging Face `kernels` on the "tpu" device: backend detection and
kernelize() with torch_tpu's LOCAL kernel repository (no hub).

torch_tpu ships python/torch_tpu/hub_kernels/rms_norm/torch-tpu (a noarch
build variant for the tpu backend) whose layer `RMSNorm` replaces the
forward of layers decorated with @use_kernel_forward_from_hub("RMSNorm") by
one natively lowered aten::_fused_rms_norm. The tests check that the swap
really happens (the bound forward is the kernel's, the fused op is counted in
torch_tpu.debug.stats() and the eager pow/mean/rsqrt chain is gone) and that
outputs and gradients are unchanged vs the original layer and vs CPU.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_tpu

kernels = pytest.importorskip("kernels")  # scripts/install.sh pins kernels==0.17.2

from kernels import Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping  # noqa: E402

from torch_tpu import hub_kernels  # noqa: E402

FUSED = "_fused_rms_norm"
FUSED_BWD = "_fused_rms_norm_backward"


def _stats() -> dict:
    return torch_tpu.debug.stats()


def _kernel_layer() -> type:
    return hub_kernels.rms_norm_repository().load()


@use_kernel_forward_from_hub("RMSNorm")
class TinyRMSNorm(nn.Module):
    """Transformers-style RMSNorm (the reference the kernel must reproduce)."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * h.to(dtype)


class Block(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.norm = TinyRMSNorm(hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.out_norm = TinyRMSNorm(hidden, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_norm(self.proj(self.norm(x)))


def _block(seed: int = 0, dtype: torch.dtype = torch.float32) -> Block:
    torch.manual_seed(seed)
    m = Block()
    with torch.no_grad():
        m.norm.weight.normal_()
        m.out_norm.weight.uniform_(0.5, 1.5)
    return m.to(dtype)


def _is_kernel_forward(module: nn.Module) -> bool:
    fn = getattr(module.forward, "__func__", None)
    return fn is _kernel_layer().forward


# ---------------------------------------------------------------- detection


def test_kernels_detects_the_tpu_backend_and_our_local_repository() -> None:
    from kernels.backends import _backend, _supported_backends
    from kernels.resolver import resolve_local_kernel

    assert hasattr(torch.backends, "tpu")
    assert _backend().name == "tpu" and _backend().variant_str == "tpu"
    assert "tpu" in _supported_backends()
    local = resolve_local_kernel(hub_kernels.RMS_NORM_REPO, backend=None)
    assert local.variant_path.name == "torch-tpu"
    assert str(local.metadata.backend.backend_type) in ("TPU", "Backend.TPU", "tpu")
    module = kernels.get_local_kernel(hub_kernels.RMS_NORM_REPO)
    layer = module.layers.RMSNorm
    assert issubclass(layer, nn.Module) and layer.has_backward and layer.can_torch_compile
    assert layer is _kernel_layer()


# ---------------------------------------------------------------- kernelize


@pytest.mark.parametrize("mode", [Mode.INFERENCE, Mode.TRAINING])
def test_kernelize_swaps_rmsnorm_for_the_fused_native_op(mode: Mode) -> None:
    cpu = _block()
    tpu = _block().to("tpu")
    x = torch.randn(4, 5, 32)
    original = tpu(x.to("tpu")).detach().cpu()

    with use_kernel_mapping(hub_kernels.kernel_mapping()):
        kernelize(tpu, device="tpu", mode=mode)
    assert _is_kernel_forward(tpu.norm) and _is_kernel_forward(tpu.out_norm)
    assert type(tpu.norm) is TinyRMSNorm  # the module (and its weight) stay

    torch_tpu.debug.reset_stats()
    xt = x.to("tpu").requires_grad_(mode == Mode.TRAINING)
    y = tpu(xt)
    forward_ops = dict(_stats()["native_ops"])
    assert forward_ops.get(FUSED) == 2  # two norms, one fused op each
    for eager_op in ("rsqrt", "pow.Tensor_Scalar", "mean.dim"):
        assert eager_op not in forward_ops, eager_op
    if mode == Mode.TRAINING:
        y.square().sum().backward()
    got = y.detach().cpu()
    s = _stats()
    assert s["fallbacks"] == {}

    torch.testing.assert_close(got, original, rtol=1e-5, atol=1e-5)
    xc = x.clone().requires_grad_(mode == Mode.TRAINING)
    expected = cpu(xc)
    torch.testing.assert_close(got, expected.detach(), rtol=1e-5, atol=1e-5)
    if mode == Mode.TRAINING:
        expected.square().sum().backward()
        assert s["native_ops"].get(FUSED_BWD) == 2
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
        for (name, p), (_, q) in zip(tpu.named_parameters(), cpu.named_parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-4, msg=name)


def test_kernelize_bfloat16_matches_the_original_layer() -> None:
    tpu = _block(dtype=torch.bfloat16).to("tpu")
    cpu = _block(dtype=torch.bfloat16)
    x = torch.randn(3, 7, 32).bfloat16()
    original = tpu(x.to("tpu")).detach().cpu()
    with use_kernel_mapping(hub_kernels.kernel_mapping()):
        kernelize(tpu, device="tpu", mode=Mode.INFERENCE)
    torch_tpu.debug.reset_stats()
    got = tpu(x.to("tpu")).detach().cpu()
    assert _stats()["native_ops"].get(FUSED) == 2 and _stats()["fallbacks"] == {}
    assert got.dtype == torch.bfloat16
    # Same rounding steps as the eager layer (normalize in f32, round, scale).
    torch.testing.assert_close(got.float(), original.float(), rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(got.float(), cpu(x).detach().float(), rtol=1.6e-2, atol=2e-2)


def test_kernelize_is_device_specific_and_reversible() -> None:
    m = _block()
    with use_kernel_mapping(hub_kernels.kernel_mapping()):
        kernelize(m, device="cpu", mode=Mode.INFERENCE)  # no cpu entry: original forward
        assert not _is_kernel_forward(m.norm)
        with pytest.raises(ValueError, match="No layer mapping"):
            kernelize(m, device="cpu", mode=Mode.INFERENCE, use_fallback=False)
        m.to("tpu")
        kernelize(m, mode=Mode.INFERENCE)  # device inferred from the parameters: tpu
        assert _is_kernel_forward(m.norm)
    with use_kernel_mapping({}, inherit_mapping=False):
        kernelize(m, device="tpu", mode=Mode.INFERENCE)  # no mapping: back to the original
    assert not _is_kernel_forward(m.norm)


def test_kernelize_torch_compile_mode() -> None:
    m = _block().to("tpu")
    x = torch.randn(2, 3, 32)
    original = m(x.to("tpu")).detach().cpu()
    with use_kernel_mapping(hub_kernels.kernel_mapping()):
        kernelize(m, device="tpu", mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
    assert _is_kernel_forward(m.norm)
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="tpu")
    with torch.no_grad():
        got = compiled(x.to("tpu")).cpu()
    torch.testing.assert_close(got, original, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- Transformers


@pytest.fixture
def kernelizable_llama_rmsnorm():
    """LlamaRMSNorm as Transformers decorates it when its kernels integration is on.

    Transformers 5.24 wires @use_kernel_forward_from_hub("RMSNorm") to the
    `kernels` library only for kernels >= 0.18.2 (not on PyPI yet); with
    0.17.2 the decorator is a no-op, so apply kernels' own registration.
    """
    from kernels import replace_kernel_forward_from_hub
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    had = "kernel_layer_name" in LlamaRMSNorm.__dict__
    if not had:
        replace_kernel_forward_from_hub(LlamaRMSNorm, "RMSNorm")
    yield LlamaRMSNorm
    if not had:
        del LlamaRMSNorm.kernel_layer_name
        del LlamaRMSNorm.kernel_condition


def test_kernelize_tiny_llama(kernelizable_llama_rmsnorm: type) -> None:
    import _models

    cpu, tpu = _models.build("llama")
    ids = _models.prompt(batch=2, length=8)
    with torch.no_grad():
        original = tpu(ids.to("tpu")).logits.cpu()
        expected = cpu(ids).logits
    norms = [m for m in tpu.modules() if isinstance(m, kernelizable_llama_rmsnorm)]
    assert len(norms) == 5  # 2 layers x (input, post-attention) + final

    with use_kernel_mapping(hub_kernels.kernel_mapping()):
        kernelize(tpu, device="tpu", mode=Mode.INFERENCE)
    assert all(_is_kernel_forward(m) for m in norms)
    torch_tpu.debug.reset_stats()
    with torch.no_grad():
        got = tpu(ids.to("tpu")).logits.cpu()
    s = _stats()
    assert s["fallbacks"] == {}
    assert s["native_ops"].get(FUSED) == len(norms)
    torch.testing.assert_close(got, original, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)

    # Training: one loss.backward() through the kernelized model vs CPU.
    with use_kernel_mapping(hub_kernels.kernel_mapping()):
        kernelize(tpu, device="tpu", mode=Mode.TRAINING)
    tpu.train()
    cpu.train()
    torch_tpu.debug.reset_stats()
    tpu(ids.to("tpu"), labels=ids.to("tpu")).loss.backward()
    cpu(ids, labels=ids).loss.backward()
    s = _stats()
    assert s["fallbacks"] == {} and s["native_ops"].get(FUSED_BWD) == len(norms)
    grads_cpu = dict(cpu.named_parameters())
    for name, p in tpu.named_parameters():
        torch.testing.assert_close(p.grad.cpu(), grads_cpu[name].grad, rtol=1e-3, atol=1e-4, msg=name)
