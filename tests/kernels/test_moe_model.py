"""The whole Qwen3-MoE / Mixtral model on torch_tpu's kernels
(``dense.kernelize_dense``): the sparse MoE block (router softmax / top-k /
renormalisation + experts + residual add) as ONE op, the q/k-projection +
per-head q/k RMSNorm + RoPE as ONE op, against Transformers' own modules on
the CPU (float32 rtol / atol 1e-5, gradients 1e-4); greedy tokens of a tiny
random Qwen3-MoE equal CPU's; zero CPU fallbacks.
"""
from __future__ import annotations

import pytest
import torch

import torch_tpu

pytest.importorskip("jax")
pytest.importorskip("kernels")
pytest.importorskip("transformers")

from torch_tpu.hub_kernels import dense, moe  # noqa: E402

F32 = dict(rtol=1e-5, atol=1e-5)
GRAD = dict(rtol=1e-4, atol=1e-4)


def _qwen3_moe_config(**kw):
    from transformers import Qwen3MoeConfig

    args = dict(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                max_position_embeddings=64, norm_topk_prob=True)
    args.update(kw)
    return Qwen3MoeConfig(**args)


def _block(kind: str) -> torch.nn.Module:
    if kind == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as cls

        cfg = MixtralConfig(hidden_size=32, intermediate_size=16, num_local_experts=8,
                            num_experts_per_tok=2)
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as cls

        cfg = _qwen3_moe_config(norm_topk_prob=kind == "qwen3_moe")
    cfg._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    block = cls(cfg)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return block


class native:  # noqa: N801
    def __enter__(self) -> None:
        self.before = dict(torch_tpu.debug.stats()["fallbacks"])

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            assert dict(torch_tpu.debug.stats()["fallbacks"]) == self.before, "a CPU fallback ran"


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_sparse_moe_block_equals_the_module_forward_and_backward(kind: str, grouped: str) -> None:
    ref_block, block = _block(kind), _block(kind).to("tpu")
    assert moe.supports_block(block)
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(1))
    r = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(2))
    xc, rc = x.clone().requires_grad_(), r.clone().requires_grad_()
    probe = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(4))
    ref = ref_block(xc) + rc
    (ref * probe).sum().backward()
    xt, rt = x.to("tpu").requires_grad_(), r.to("tpu").requires_grad_()
    with native():
        out = moe.sparse_moe_block(block, xt, rt)
        (out * probe.to("tpu")).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), **F32)
    for t, c in [(xt, xc), (rt, rc)] + [(p, q) for p, q in zip(block.parameters(),
                                                                ref_block.parameters())]:
        torch.testing.assert_close(t.grad.cpu(), c.grad, **GRAD)


def test_sparse_moe_block_is_one_execution_unnormalized_top_k() -> None:
    ref_block, block = _block("qwen3_moe_unnormalized"), _block("qwen3_moe_unnormalized").to("tpu")
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(1))
    xt = x.to("tpu")
    with torch.no_grad():
        moe.sparse_moe_block(block, xt)  # compiles
        torch.tpu.synchronize()
        before = torch_tpu.debug.stats()["executions"]
        out = moe.sparse_moe_block(block, xt)
        torch.tpu.synchronize()
        assert torch_tpu.debug.stats()["executions"] - before == 1
        torch.testing.assert_close(out.cpu(), ref_block(x), **F32)


def test_unsupported_block_raises() -> None:
    block = _block("qwen3_moe")
    block.experts.has_bias = True
    assert not moe.supports_block(block)
    with pytest.raises(ValueError, match="not a supported MoE block"):
        moe.sparse_moe_block(block, torch.zeros(1, 1, 32))


def test_qkv_rope_with_head_norms_equals_qwen3_attention_prologue() -> None:
    from transformers.models.qwen3_moe import modeling_qwen3_moe as mq

    cfg = _qwen3_moe_config()
    torch.manual_seed(0)
    attn = mq.Qwen3MoeAttention(cfg, layer_idx=0)
    for n in (attn.q_norm, attn.k_norm):
        torch.nn.init.normal_(n.weight, mean=1.0, std=0.3)
    rope = mq.Qwen3MoeRotaryEmbedding(cfg)
    x = torch.randn(2, 5, 32)
    cos, sin = rope(x, torch.arange(5)[None].expand(2, 5))
    with torch.no_grad():
        shape = (2, 5, -1, 8)
        q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = mq.apply_rotary_pos_emb(q, k, cos, sin)
        attn_tpu = attn.to("tpu")
        with native():
            out = dense.qkv_rope(attn_tpu, x.to("tpu"), cos.to("tpu"), sin.to("tpu"))
    for o, r in zip(out, (q, k, v)):
        torch.testing.assert_close(o.cpu(), r, **F32)


def _greedy(model, ids, steps):
    with torch.no_grad():
        out = model(ids, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        toks, logits = [tok], [out.logits[:, -1]]
        for _ in range(steps):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(tok)
            logits.append(out.logits[:, -1])
    return torch.cat(toks, 1).cpu(), torch.stack(logits).cpu()


def test_kernelized_qwen3_moe_decodes_cpus_tokens_with_few_executions() -> None:
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cpu = Qwen3MoeForCausalLM(_qwen3_moe_config()).eval()
    model = Qwen3MoeForCausalLM(_qwen3_moe_config()).eval()
    model.load_state_dict(cpu.state_dict())
    model = dense.kernelize_dense(model.to("tpu"))
    layer = model.model.layers[0]
    assert type(layer).kernel_layer_name == "MoEDecoderLayer"
    assert type(layer.self_attn).kernel_layer_name == "RopeAttention"
    ids = torch.randint(0, 128, (4, 6), generator=torch.Generator().manual_seed(3))
    ref_tokens, ref_logits = _greedy(cpu, ids, 2)
    with native():
        tokens, logits = _greedy(model, ids.to("tpu"), 2)
    torch.testing.assert_close(logits, ref_logits, **F32)
    assert torch.equal(tokens, ref_tokens)
    before = torch_tpu.debug.stats()["native_ops"].get("jax_op", 0)
    with torch.no_grad():
        model(tokens[:, -1:].to("tpu"))
    # per layer: q/k/v + norms + RoPE, attention, add + RMSNorm, the MoE block
    assert torch_tpu.debug.stats()["native_ops"]["jax_op"] - before == 4 * 2


def _decode_step_executions(model, tok, past):
    """Executions and jax_op calls of one warm decode step (after a first one)."""
    with torch.no_grad():
        for _ in range(2):
            stats = torch_tpu.debug.stats()
            e0, k0 = stats["executions"], stats["native_ops"].get("jax_op", 0)
            out = model(tok, past_key_values=past, use_cache=True)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.tpu.synchronize()
    stats = torch_tpu.debug.stats()
    return tok.cpu(), stats["executions"] - e0, stats["native_ops"]["jax_op"] - k0


@pytest.mark.parametrize("dynamic_shapes", ["0", "auto"])
def test_kernelized_decode_step_under_fused_eager_joins_the_kernels(dynamic_shapes) -> None:
    """Under fused eager the kernels (4 jax_ops per layer) join the chain of
    the ops around them: a decode step runs in fewer executions than with each
    kernel running alone; the same tokens as strict eager. With exact shapes
    the whole step is fewer executions than it has kernel calls. Under
    automatic dynamic shapes the ops on the growing KV cache (its cat, the
    attention over it) run on their bounded executables, between chains: more
    executions, but a new cache length compiles no chain."""
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = dense.kernelize_dense(Qwen3MoeForCausalLM(_qwen3_moe_config()).eval().to("tpu"))
    ids = torch.randint(0, 128, (4, 6), generator=torch.Generator().manual_seed(3)).to("tpu")
    runs = {}
    torch_tpu.dynamic.forget_sizes()
    with torch_tpu.dynamic.dynamic_shapes(dynamic_shapes):
        for name, fuse, join in (("strict", False, True), ("alone", True, False), ("joined", True, True)):
            previous = torch_tpu._C._set_jax_ops_join_fused(join)
            try:
                with torch_tpu.fused(fuse), torch.no_grad():
                    out = model(ids, use_cache=True)
                    tok = out.logits[:, -1].argmax(-1, keepdim=True)
                    runs[name] = _decode_step_executions(model, tok, out.past_key_values)
            finally:
                torch_tpu._C._set_jax_ops_join_fused(previous)
    (tokens, strict, kernels), (_, alone, _), (fused_tokens, joined, fused_kernels) = \
        runs["strict"], runs["alone"], runs["joined"]
    assert kernels == fused_kernels == 4 * 2
    assert torch.equal(fused_tokens, tokens)
    assert joined < alone < strict, (joined, kernels, alone, strict)
    if dynamic_shapes == "0":
        assert joined < kernels, (joined, kernels)


def test_sparse_moe_block_inside_torch_compile() -> None:
    moe.register()  # registers the ops before tracing (kernelize_dense does too)
    ref_block, block = _block("mixtral"), _block("mixtral").to("tpu")
    x = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(5))
    torch_tpu.compile.reset_stats()
    compiled = torch.compile(lambda h: moe.sparse_moe_block(block, h, h) * 2, backend="tpu",
                             fullgraph=True)
    with torch.no_grad():
        out = compiled(x.to("tpu"))
        ref = (ref_block(x) + x) * 2
    st = torch_tpu.compile.stats()
    assert st["fallback_graphs"] == 0 and st["native_graphs"] == st["graphs"] >= 1, st
    torch.testing.assert_close(out.cpu(), ref, **F32)
