"""Kernel layers: stateless ``nn.Module`` subclasses whose ``forward`` replaces
the decorated layer's forward (``self`` is the original module instance).

Each forward keeps the original layer's arguments and results; the work runs
in torch_tpu's fused ops (``torch_tpu.hub_kernels.dense``)."""
import sys

import torch
from torch import nn

from torch_tpu.hub_kernels import dense, moe


def _sliding_window(module: nn.Module):
    """Qwen2-style layers carry ``sliding_window`` (None on full layers); Mistral's config."""
    if hasattr(module, "sliding_window"):
        return module.sliding_window
    return getattr(module.config, "sliding_window", None)


def _attention_function(module: nn.Module):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    return ALL_ATTENTION_FUNCTIONS.get_interface(module.config._attn_implementation, eager)


class GatedMLP(nn.Module):
    """``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (SwiGLU / GeGLU) as ONE op."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense.gated_mlp(self, x)


class RopeAttention(nn.Module):
    """Llama-style attention: q/k/v projections and RoPE as ONE op, the cache update,
    the configured attention function (``torch_tpu_attention`` after
    ``kernelize_dense``: ONE op), the output projection."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None,
                **kwargs):
        input_shape = hidden_states.shape[:-1]
        cos, sin = position_embeddings
        q, k, v = dense.qkv_rope(self, hidden_states, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        window = _sliding_window(self)
        extra = {} if window is None else {"sliding_window": window}
        out, weights = _attention_function(self)(
            self, q, k, v, attention_mask, dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling, **extra, **kwargs)
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out), weights


class PreNormDecoderLayer(nn.Module):
    """Llama's decoder layer with the residual add + post-attention RMSNorm as
    ONE op and the MLP together with its residual add as ONE op."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, position_embeddings=None, **kwargs):
        residual = hidden_states
        h = self.input_layernorm(hidden_states)
        h, _ = self.self_attn(hidden_states=h, attention_mask=attention_mask,
                              position_ids=position_ids, cache=cache, use_cache=use_cache,
                              position_embeddings=position_embeddings, **kwargs)
        norm = self.post_attention_layernorm
        h, residual = dense.add_rms_norm(h, residual, norm.weight, norm.variance_epsilon)
        return dense.gated_mlp(self.mlp, h, residual)


class MoEDecoderLayer(nn.Module):
    """A Qwen3-MoE / Mixtral decoder layer: the attention as in ``RopeAttention``
    (q/k head norms fused into the projection + RoPE op), the residual add +
    post-attention RMSNorm as ONE op, and the whole sparse MoE block (router
    softmax / top-k / renormalisation, experts, residual add) as ONE op."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, position_embeddings=None, **kwargs):
        residual = hidden_states
        h = self.input_layernorm(hidden_states)
        h, _ = self.self_attn(hidden_states=h, attention_mask=attention_mask,
                              position_ids=position_ids, cache=cache, use_cache=use_cache,
                              position_embeddings=position_embeddings, **kwargs)
        norm = self.post_attention_layernorm
        h, residual = dense.add_rms_norm(h, residual, norm.weight, norm.variance_epsilon)
        return moe.sparse_moe_block(self.mlp, h, residual)


class RotaryPosEmb(nn.Module):
    """Transformers' ``apply_rotary_pos_emb`` hook (layer name ``rotary_pos_emb``)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return dense.rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
