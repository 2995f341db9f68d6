"""torch_tpu.hub_kernels.dense: RoPE, residual add + RMSNorm and the gated
(SwiGLU / GeGLU) MLP as one op each, and ``kernelize_dense`` on a tiny
random-weight Llama (Transformers' own classes, through ``kernels``).

References: the same PyTorch code on the CPU (Transformers' functions and
modules). Tolerances: float32 rtol / atol 1e-5 (gradients 1e-4), bfloat16
2e-2. Every tpu run asserts zero CPU fallbacks.
"""
from __future__ import annotations

import pytest
import torch

import torch_tpu

pytest.importorskip("jax")
pytest.importorskip("kernels")
pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama import modeling_llama as ml  # noqa: E402

from torch_tpu.hub_kernels import dense  # noqa: E402

F32 = dict(rtol=1e-5, atol=1e-5)
GRAD = dict(rtol=1e-4, atol=1e-4)
BF16 = dict(rtol=2e-2, atol=2e-2)


class native:  # noqa: N801
    def __enter__(self) -> None:
        self.before = dict(torch_tpu.debug.stats()["fallbacks"])

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            assert dict(torch_tpu.debug.stats()["fallbacks"]) == self.before, "a CPU fallback ran"


def _both(fn_tpu, fn_cpu, *inputs, tol=F32, backward=True):
    """Runs fn on tpu and on CPU (same inputs, leaves); compares outputs and grads."""
    cpu = [t.clone().requires_grad_(t.is_floating_point() and backward) for t in inputs]
    tpu = [t.to("tpu").requires_grad_(t.is_floating_point() and backward) for t in inputs]
    with native():
        out = fn_tpu(*tpu)
        out = out if isinstance(out, tuple) else (out,)
        if backward:
            sum(o.float().square().sum() for o in out).backward()
    ref = fn_cpu(*cpu)
    ref = ref if isinstance(ref, tuple) else (ref,)
    if backward:
        sum(r.float().square().sum() for r in ref).backward()
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.detach().cpu(), r.detach(), **tol)
    if backward:
        for t, c in zip(tpu, cpu):
            torch.testing.assert_close(t.grad.cpu(), c.grad, **GRAD)


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _add_norm_ref(x, r, w, eps=1e-5):
    """``residual + x``, then LlamaRMSNorm's forward with weight ``w``."""
    s = r + x
    h = s.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(s.dtype), s


def _mlp(act: str, bias: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4, hidden_act=act,
                      mlp_bias=bias)
    return ml.LlamaMLP(cfg)


def test_rope_add_rms_norm_and_gated_mlp_forward_backward_float32() -> None:
    q, k = _randn(2, 4, 5, 8), _randn(2, 2, 5, 8, seed=1)
    pos = torch.arange(5)[None].expand(2, 5)
    cos, sin = ml.LlamaRotaryEmbedding(LlamaConfig(hidden_size=32, num_attention_heads=4))(q, pos)
    _both(lambda *a: dense.rotary_pos_emb(*a, cos.to("tpu"), sin.to("tpu")),
          lambda *a: ml.apply_rotary_pos_emb(*a, cos, sin), q, k)
    cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                      attention_bias=True)  # Qwen2-style biases
    torch.manual_seed(0)
    attn_ref = ml.LlamaAttention(cfg, 0)
    attn = ml.LlamaAttention(cfg, 0).to("tpu")
    attn.load_state_dict(attn_ref.state_dict())

    def qkv_ref(x):
        split = [m(x).view(2, 5, -1, 8).transpose(1, 2)
                 for m in (attn_ref.q_proj, attn_ref.k_proj, attn_ref.v_proj)]
        return (*ml.apply_rotary_pos_emb(split[0], split[1], cos, sin), split[2])
    _both(lambda x: dense.qkv_rope(attn, x, cos.to("tpu"), sin.to("tpu")), qkv_ref,
          _randn(2, 5, 32, seed=7))
    _both(lambda x, r, w: dense.add_rms_norm(x, r, w, 1e-5), _add_norm_ref,
          _randn(3, 4, 16, seed=3), _randn(3, 4, 16, seed=4), _randn(16, seed=2))
    for act, bias in [("silu", False), ("gelu_pytorch_tanh", True)]:  # SwiGLU, GeGLU
        ref, mod = _mlp(act, bias), _mlp(act, bias).to("tpu")
        x, res = _randn(3, 16, seed=5), _randn(3, 16, seed=6)
        _both(lambda x, r: dense.gated_mlp(mod, x, r), lambda x, r: ref(x) + r, x, res)
        torch.testing.assert_close(mod.gate_proj.weight.grad.cpu(), ref.gate_proj.weight.grad, **GRAD)
        torch.testing.assert_close(mod.down_proj.weight.grad.cpu(), ref.down_proj.weight.grad, **GRAD)


def test_bfloat16_forward() -> None:
    q, k = _randn(1, 4, 3, 8, dtype=torch.bfloat16), _randn(1, 2, 3, 8, dtype=torch.bfloat16, seed=1)
    cos, sin = ml.LlamaRotaryEmbedding(LlamaConfig(hidden_size=32, num_attention_heads=4))(
        q, torch.arange(3)[None])
    _both(lambda *a: dense.rotary_pos_emb(*a, cos.to("tpu"), sin.to("tpu")),
          lambda *a: ml.apply_rotary_pos_emb(*a, cos, sin), q, k, tol=BF16, backward=False)
    ref, mod = _mlp("silu", False).bfloat16(), _mlp("silu", False).bfloat16().to("tpu")
    x = _randn(4, 16, dtype=torch.bfloat16)
    _both(lambda x: dense.gated_mlp(mod, x), ref, x, tol=BF16, backward=False)
    _both(lambda *a: dense.add_rms_norm(*a, 1e-5), _add_norm_ref, x,
          _randn(4, 16, dtype=torch.bfloat16, seed=2), _randn(16, dtype=torch.bfloat16, seed=1),
          tol=BF16, backward=False)


def test_bad_inputs_raise_clear_errors() -> None:
    # partial rotary (cos narrower than head_dim) is supported: test_dense_variants.py
    with pytest.raises(ValueError, match="at most the head_dim"):
        dense.rotary_pos_emb(_randn(1, 1, 2, 8), _randn(1, 1, 2, 8), _randn(1, 2, 10), _randn(1, 2, 10))
    with pytest.raises(ValueError, match="do not match"):
        dense.add_rms_norm(_randn(2, 8), _randn(2, 8), _randn(4), 1e-6)


def _pair(**overrides):
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      **overrides)
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).eval()
    model = LlamaForCausalLM(cfg).eval()
    model.load_state_dict(ref.state_dict())
    return ref, model.to("tpu")


def _executions_per_decode_step(model, ids) -> float:
    with torch.no_grad():
        out = model(ids, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        model(tok, past_key_values=past, use_cache=True)  # compiles the step
        torch.tpu.synchronize()
        before = torch_tpu.debug.stats()["executions"]
        model(tok, past_key_values=past, use_cache=True)
        torch.tpu.synchronize()
    return torch_tpu.debug.stats()["executions"] - before


def test_kernelize_dense_llama_generate_equals_default_and_runs_fewer_ops() -> None:
    ref, model = _pair()
    ids = torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(1))
    default_execs = _executions_per_decode_step(model, ids.to("tpu"))
    dense.kernelize_dense(model)
    layer = model.model.layers[0]
    assert model.config._attn_implementation == "torch_tpu_attention"
    for module, kernel in [(layer, "PreNormDecoderLayer"), (layer.self_attn, "RopeAttention"),
                           (layer.mlp, "GatedMLP"), (model.model.norm, "RMSNorm")]:
        assert type(module.forward.__self__) is type(module) and \
            module.forward.__func__.__qualname__.startswith(kernel), (module, kernel)
    kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)  # DynamicCache
    with torch.no_grad(), native():
        logits = model(ids.to("tpu")).logits.cpu()
        got = model.generate(ids.to("tpu"), **kw).cpu()
    with torch.no_grad():
        torch.testing.assert_close(logits, ref(ids).logits, **F32)
        assert torch.equal(got, ref.generate(ids, **kw))
    fused_execs = _executions_per_decode_step(model, ids.to("tpu"))
    assert fused_execs < default_execs, (fused_execs, default_execs)


def test_kernelize_dense_training_gradients_and_torch_compile() -> None:
    ref, model = _pair()
    ref.train()
    model.train()
    dense.kernelize_dense(model)  # Mode.TRAINING (the model is in training mode)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(2))
    with native():
        loss = model(ids.to("tpu"), labels=ids.to("tpu")).loss
        loss.backward()
    ref_loss = ref(ids, labels=ids).loss
    ref_loss.backward()
    torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach(), **F32)
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad.cpu(), r.grad, **GRAD, msg=name)
    # One kernelized decoder layer inside torch.compile: RoPE, attention,
    # add + RMSNorm and MLP ops in one graph module (causal, mask skipped).
    model.eval()
    ref.eval()
    h = _randn(2, 7, 32, seed=3)
    pos = torch.arange(7)[None]
    cos, sin = ref.model.rotary_emb(h, pos)
    ref.config._attn_implementation = "sdpa"
    torch_tpu.compile.reset_stats()
    layer = model.model.layers[0]
    compiled = torch.compile(lambda x, c, s: layer(x, position_embeddings=(c, s)), backend="tpu",
                             fullgraph=True)
    with torch.no_grad(), native():
        out = compiled(h.to("tpu"), cos.to("tpu"), sin.to("tpu")).cpu()
    st = torch_tpu.compile.stats()
    assert st["fallback_graphs"] == 0 and st["native_graphs"] == st["graphs"] >= 1, st
    with torch.no_grad():
        torch.testing.assert_close(out, ref.model.layers[0](h, position_embeddings=(cos, sin)), **F32)


def test_rotary_pos_emb_function_hook_through_kernels() -> None:
    """Transformers' ``@use_kernel_forward_from_hub("rotary_pos_emb")`` on a
    function (+ ``use_kernelized_func``), as wired with kernels >= 0.18.2: the
    mapping swaps in the fused RoPE op."""
    from kernels import Mode, kernelize, use_kernel_forward_from_hub, use_kernelized_func
    from kernels import use_kernel_mapping

    rope = use_kernel_forward_from_hub("rotary_pos_emb")(ml.apply_rotary_pos_emb)

    @use_kernelized_func(rope)
    class Rotate(torch.nn.Module):
        def forward(self, q, k, cos, sin):
            return rope(q, k, cos, sin)

    q, k = _randn(2, 4, 5, 8), _randn(2, 2, 5, 8, seed=1)
    cos, sin = ml.LlamaRotaryEmbedding(LlamaConfig(hidden_size=32, num_attention_heads=4))(
        q, torch.arange(5)[None].expand(2, 5))
    model = Rotate()
    with use_kernel_mapping(dense.kernel_mapping()):
        kernelize(model, device="tpu", mode=Mode.INFERENCE)
    before = torch_tpu.debug.stats()["native_ops"].get("jax_op", 0)
    with native():
        out = model(*(t.to("tpu") for t in (q, k, cos, sin)))
    assert torch_tpu.debug.stats()["native_ops"].get("jax_op", 0) == before + 1
    for o, r in zip(out, ml.apply_rotary_pos_emb(q, k, cos, sin)):
        torch.testing.assert_close(o.cpu(), r, **F32)
