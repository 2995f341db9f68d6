"""torch_tpu.hub_kernels.dense variants: Gemma's ``(1 + weight)`` RMSNorm (alone
and with the residual add) and partial rotary (GPT-NeoX / Phi-style
``partial_rotary_factor``: RoPE on the first features of each head), against
Transformers' own modules and functions on the CPU (float32 rtol / atol 1e-5,
gradients 1e-4; bfloat16 2e-2); zero CPU fallbacks. Also the eager fast path
of ``jax_op`` (no torch.library dispatch when no gradient is recorded).
"""
from __future__ import annotations

import pytest
import torch

import torch_tpu

pytest.importorskip("jax")
pytest.importorskip("transformers")

from torch_tpu.hub_kernels import dense  # noqa: E402

F32 = dict(rtol=1e-5, atol=1e-5)
GRAD = dict(rtol=1e-4, atol=1e-4)
BF16 = dict(rtol=2e-2, atol=2e-2)


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _both(fn_tpu, fn_cpu, *inputs, tol=F32, backward=True):
    """fn on tpu and on CPU (same inputs as leaves): outputs and gradients equal."""
    cpu = [t.clone().requires_grad_(backward) for t in inputs]
    tpu = [t.to("tpu").requires_grad_(backward) for t in inputs]
    before = dict(torch_tpu.debug.stats()["fallbacks"])
    out, ref = fn_tpu(*tpu), fn_cpu(*cpu)
    out, ref = (out if isinstance(out, tuple) else (out,)), (ref if isinstance(ref, tuple) else (ref,))
    if backward:
        probes = [_randn(*r.shape, seed=9 + i) for i, r in enumerate(ref)]
        sum((o.float() * p.to("tpu")).sum() for o, p in zip(out, probes)).backward()
        sum((r.float() * p).sum() for r, p in zip(ref, probes)).backward()
    assert dict(torch_tpu.debug.stats()["fallbacks"]) == before, "a CPU fallback ran"
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.detach().cpu(), r.detach(), **tol)
    if backward:
        for t, c in zip(tpu, cpu):
            torch.testing.assert_close(t.grad.cpu(), c.grad, **GRAD)


def _gemma_norm(dtype=torch.float32):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    norm = Gemma3RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(_randn(16, seed=2) * 0.5)
    return norm.to(dtype)


def test_gemma_rms_norm_alone_and_with_residual_add() -> None:
    ref = _gemma_norm()
    assert dense.is_gemma_rms_norm(ref) and not dense.is_llama_rms_norm(ref)
    x, r = _randn(3, 4, 16, seed=3), _randn(3, 4, 16, seed=4)

    def ref_fn(x, w):  # the module's own forward, with w (a leaf) as its weight
        return torch.func.functional_call(ref, {"weight": w}, (x,))
    _both(lambda x, w: dense.rms_norm(x, w, ref.eps, unit_offset=True), ref_fn, x, ref.weight.detach())
    _both(lambda x, r: dense.add_rms_norm(x, r, ref.weight.detach().to("tpu"), ref.eps,
                                          unit_offset=True),
          lambda x, r: (_gemma_norm()(r + x), r + x), x, r)
    mod = _gemma_norm().to("tpu")
    with torch.no_grad():
        out = dense.rms_norm_module(mod, x.to("tpu"))
    torch.testing.assert_close(out.cpu(), _gemma_norm()(x).detach(), **F32)


def test_gemma_rms_norm_bfloat16_rounds_after_the_scale() -> None:
    x = _randn(4, 16, dtype=torch.bfloat16, seed=5)
    mod = _gemma_norm(torch.bfloat16)
    with torch.no_grad():
        out = dense.rms_norm_module(mod.to("tpu"), x.to("tpu"))
        ref = _gemma_norm(torch.bfloat16)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), ref, **BF16)


def _neox_rope(partial: float):
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox import modeling_gpt_neox as mn

    cfg = GPTNeoXConfig(hidden_size=64, num_attention_heads=4, rotary_pct=partial,
                        max_position_embeddings=32)
    cfg.rope_parameters["partial_rotary_factor"] = partial
    q = _randn(2, 4, 5, 16)
    cos, sin = mn.GPTNeoXRotaryEmbedding(cfg)(q, torch.arange(5)[None].expand(2, 5))
    return mn.apply_rotary_pos_emb, cos, sin


def test_partial_rotary_equals_gpt_neox() -> None:
    apply, cos, sin = _neox_rope(0.25)
    assert cos.shape[-1] == 4  # a quarter of head_dim 16
    q, k = _randn(2, 4, 5, 16), _randn(2, 4, 5, 16, seed=1)
    _both(lambda q, k: dense.rotary_pos_emb(q, k, cos.to("tpu"), sin.to("tpu")),
          lambda q, k: apply(q, k, cos, sin), q, k)


def test_qkv_rope_with_partial_rotary() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama as ml

    apply, cos, sin = _neox_rope(0.5)
    torch.manual_seed(0)
    attn = ml.LlamaAttention(LlamaConfig(hidden_size=64, num_attention_heads=4,
                                         num_key_value_heads=2), 0)
    x = _randn(2, 5, 64, seed=7)
    with torch.no_grad():
        split = [m(x).view(2, 5, -1, 16).transpose(1, 2) for m in (attn.q_proj, attn.k_proj,
                                                                   attn.v_proj)]
        ref = (*apply(split[0], split[1], cos, sin), split[2])
        out = dense.qkv_rope(attn.to("tpu"), x.to("tpu"), cos.to("tpu"), sin.to("tpu"))
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.cpu(), r, **F32)
    with pytest.raises(ValueError, match="even number of features"):
        dense.rotary_pos_emb(out[0], out[1], cos[..., :3].to("tpu"), sin[..., :3].to("tpu"))


def test_jax_op_fast_path_skips_the_dispatcher_only_without_gradients() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    x = _randn(3, 16, seed=1)
    mod = _gemma_norm().to("tpu")
    op = torch.ops.torch_tpu_kernels.rms_norm.default
    seen = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        fast = dense.rms_norm_module(mod, x.to("tpu"))
        with Seen():  # a dispatch mode sees the op: the fast path stands aside
            dense.rms_norm_module(mod, x.to("tpu"))
    assert op in seen
    xt = x.to("tpu").requires_grad_()
    slow = dense.rms_norm_module(mod, xt)  # records a gradient: through the dispatcher
    assert slow.grad_fn is not None and fast.grad_fn is None
    torch.testing.assert_close(fast.cpu(), slow.detach().cpu(), rtol=0, atol=0)
