"""Dense-model kernels: RoPE, RMSNorm + residual add, gated (SwiGLU / GeGLU) MLP.

Each is ONE ``torch.tpu.pallas.jax_op`` (backward through ``jax.vjp``):

- ``torch_tpu_kernels::rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)``: the
  rotation of Transformers' ``apply_rotary_pos_emb`` for q and k at once
  (partial rotary too: cos / sin narrower than head_dim rotate the first
  features, the rest pass, as GPT-NeoX / Phi / StableLM);
- ``torch_tpu_kernels::qkv_rope(x, w_q, w_k, w_v, biases, cos, sin, head_dim)``:
  the q / k / v projections split into heads, RoPE on q and k (the attention
  layer's whole prologue);
- ``torch_tpu_kernels::add_rms_norm(x, residual, weight, eps, unit_offset)``:
  ``s = residual + x`` and ``weight * rms_normalize(s)`` (float32 statistics,
  rounded to the input dtype as LlamaRMSNorm does; with ``unit_offset``
  Gemma's ``(1 + weight)`` scale in float32), returning (normalized, s);
- ``torch_tpu_kernels::rms_norm(x, weight, eps, unit_offset)``: the same norm
  without the add (Gemma's RMSNorm has no native fused op);
- ``torch_tpu_kernels::gated_mlp(x, w_gate, w_up, w_down, ..., residual, act)``:
  ``down(act(gate(x)) * up(x)) (+ residual)`` with SiLU (SwiGLU) or GELU /
  GELU-tanh (GeGLU), biases optional.

Transformers 5.24 hooks only RMSNorm (class) and ``rotary_pos_emb`` (a
function, wired to ``kernels`` >= 0.18.2) for the hub; its MLP, attention and
decoder-layer classes have no hook. :func:`kernelize_dense` makes the dense
layers of a Llama-style model kernelizable (``kernels.replace_kernel_forward_
from_hub`` on the model's own classes, instances checked by a condition) and
runs ``kernels.kernelize(model, device="tpu")`` with torch_tpu's local kernel
repository ``hub_kernels/dense_layers``, whose layers call these ops; it also
selects the fused attention (:mod:`torch_tpu.hub_kernels.attention`)::

    from torch_tpu.hub_kernels import dense
    dense.kernelize_dense(model)          # model on tpu; inference or training

Per decoder layer the result runs: the fused RMSNorm, ONE q/k/v-projection +
RoPE op, the cache update, ONE attention op, the output projection, ONE add +
RMSNorm op, ONE MLP op (with the residual add).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Optional

import torch

from . import kernel_op

__all__ = ["rotary_pos_emb", "qkv_rope", "add_rms_norm", "rms_norm", "rms_norm_module", "gated_mlp",
           "mlp_activation", "kernelize_dense", "DENSE_REPO"]

#: The local kernel repository with the dense layers.
DENSE_REPO = Path(__file__).resolve().parent / "dense_layers"

_ACTS = {"SiLU": "silu", "SiLUActivation": "silu", "GELUActivation": "gelu",
         "PytorchGELUTanh": "gelu_tanh", "GELUTanh": "gelu_tanh",
         "NewGELUActivation": "gelu_tanh", "GELUPytorchTanh": "gelu_tanh"}


def mlp_activation(act: Any) -> Optional[str]:
    """The kernel's name for an MLP activation module, or None if unsupported."""
    if isinstance(act, torch.nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    return _ACTS.get(type(act).__name__)


@functools.cache
def _ops() -> tuple:
    import jax
    import jax.numpy as jnp

    from torch_tpu.pallas import jax_op

    def rotate_half(x: Any) -> Any:
        h = x.shape[-1] // 2
        return jnp.concatenate([-x[..., h:], x[..., :h]], axis=-1)

    def rotate(x: Any, c: Any, s: Any) -> Any:
        """RoPE on the first ``c.shape[-1]`` features (all of them, or partial
        rotary as GPT-NeoX / Phi / StableLM: the rest passes unchanged)."""
        dt = jnp.result_type(x, c)
        rot = c.shape[-1]
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        out = (x_rot * c).astype(dt) + (rotate_half(x_rot) * s).astype(dt)
        return out if rot == x.shape[-1] else jnp.concatenate([out, x_pass.astype(dt)], axis=-1)

    @jax_op("torch_tpu_kernels::rotary_pos_emb")
    def rope(q: jax.Array, k: jax.Array, cos: jax.Array, sin: jax.Array,
             unsqueeze_dim: int) -> tuple[jax.Array, jax.Array]:
        c, s = jnp.expand_dims(cos, unsqueeze_dim), jnp.expand_dims(sin, unsqueeze_dim)
        return rotate(q, c, s), rotate(k, c, s)

    def rms_normalize(x: Any, eps: float) -> Any:
        """``x * rsqrt(mean(x^2) + eps)`` in float32 (as Transformers' RMSNorms)."""
        h = x.astype(jnp.float32)
        return h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)

    def scale(h: Any, weight: Any, dtype: Any, unit_offset: bool) -> Any:
        """Llama: ``weight * h.to(dtype)``; Gemma: ``(h * (1 + weight.float())).to(dtype)``."""
        if unit_offset:
            return (h * (1.0 + weight.astype(jnp.float32))).astype(dtype)
        return weight * h.astype(dtype)

    @jax_op("torch_tpu_kernels::add_rms_norm")
    def add_norm(x: jax.Array, residual: jax.Array, weight: jax.Array, eps: float,
                 unit_offset: bool = False) -> tuple[jax.Array, jax.Array]:
        s = residual + x
        return scale(rms_normalize(s, eps), weight, s.dtype, unit_offset), s

    @jax_op("torch_tpu_kernels::rms_norm")
    def norm(x: jax.Array, weight: jax.Array, eps: float, unit_offset: bool) -> jax.Array:
        return scale(rms_normalize(x, eps), weight, x.dtype, unit_offset)

    acts = {"silu": jax.nn.silu, "gelu": lambda g: jax.nn.gelu(g, approximate=False),
            "gelu_tanh": lambda g: jax.nn.gelu(g, approximate=True)}

    def linear(x: Any, w: Any, b: Any) -> Any:
        y = jnp.einsum("...k,nk->...n", x, w, preferred_element_type=jnp.float32).astype(x.dtype)
        return y if b is None else y + b

    @jax_op("torch_tpu_kernels::gated_mlp")
    def mlp(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array,
            b_gate: Optional[jax.Array], b_up: Optional[jax.Array], b_down: Optional[jax.Array],
            residual: Optional[jax.Array], act: str) -> jax.Array:
        h = acts[act](linear(x, w_gate, b_gate)) * linear(x, w_up, b_up)
        y = linear(h, w_down, b_down)
        return y if residual is None else residual + y

    @jax_op("torch_tpu_kernels::qkv_rope")
    def qkv_rope(x: jax.Array, w_q: jax.Array, w_k: jax.Array, w_v: jax.Array,
                 b_q: Optional[jax.Array], b_k: Optional[jax.Array], b_v: Optional[jax.Array],
                 cos: jax.Array, sin: jax.Array, head_dim: int,
                 q_norm: Optional[jax.Array] = None, k_norm: Optional[jax.Array] = None,
                 norm_eps: float = 1e-6) -> tuple[jax.Array, jax.Array, jax.Array]:
        def heads(y: Any, norm: Any = None) -> Any:  # (B, S, N * D) -> (B, N, S, D)
            y = y.reshape(y.shape[:2] + (-1, head_dim))
            if norm is not None:  # Qwen3 / OLMo2-style RMSNorm over each head
                y = norm * rms_normalize(y, norm_eps).astype(y.dtype)
            return jnp.transpose(y, (0, 2, 1, 3))
        q = heads(linear(x, w_q, b_q), q_norm)
        k = heads(linear(x, w_k, b_k), k_norm)
        v = heads(linear(x, w_v, b_v))
        c, s = cos[:, None], sin[:, None]
        return rotate(q, c, s), rotate(k, c, s), v

    return rope, add_norm, mlp, qkv_rope, norm


def _ensure() -> None:
    if not torch.compiler.is_compiling():
        _ops()


def rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   unsqueeze_dim: int = 1) -> tuple:
    """Transformers' ``apply_rotary_pos_emb`` as one op (full-width rotary only)."""
    if cos.shape[-1] > q.shape[-1] or sin.shape != cos.shape or cos.shape[-1] % 2:
        raise ValueError(f"torch_tpu rotary_pos_emb: cos / sin {tuple(cos.shape)} must cover an "
                         f"even number of features, at most the head_dim of q {tuple(q.shape)}")
    _ensure()
    return kernel_op("rotary_pos_emb")(q, k, cos, sin, int(unsqueeze_dim))


def qkv_rope(attn: torch.nn.Module, hidden_states: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple:
    """The q / k / v projections of a Llama-style attention module, split into
    heads (B, N, S, D), with RoPE applied to q and k: ONE op (no strided views
    to copy, no separate rotary op)."""
    if cos.shape[-1] > attn.head_dim or cos.shape[-1] % 2 or hidden_states.dim() != 3:
        raise ValueError(f"torch_tpu qkv_rope: hidden states {tuple(hidden_states.shape)} must be "
                         f"(B, S, hidden) and cos {tuple(cos.shape)} cover an even number of "
                         f"features, at most head_dim {attn.head_dim}")
    _ensure()
    p = (attn.q_proj, attn.k_proj, attn.v_proj)
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if (q_norm is None) != (k_norm is None):
        raise ValueError("torch_tpu qkv_rope: the attention module has only one of q_norm / k_norm")
    norms, eps = (None, None), 1e-6
    if q_norm is not None:
        if not (is_llama_rms_norm(q_norm) and is_llama_rms_norm(k_norm)) or \
                q_norm.variance_epsilon != k_norm.variance_epsilon or \
                q_norm.weight.shape != (attn.head_dim,):
            raise ValueError("torch_tpu qkv_rope: q_norm / k_norm must be per-head RMSNorms "
                             f"(weight of shape ({attn.head_dim},), one epsilon)")
        norms, eps = (q_norm.weight, k_norm.weight), float(q_norm.variance_epsilon)
    return kernel_op("qkv_rope")(hidden_states, *(m.weight for m in p),
                                                *(m.bias for m in p), cos, sin, int(attn.head_dim),
                                                *norms, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, unit_offset: bool = False) -> tuple:
    """(weight * rms_norm(residual + x), residual + x) as one op; with
    ``unit_offset`` Gemma's ``(1 + weight)`` scale in float32."""
    if x.shape != residual.shape or weight.shape != x.shape[-1:]:
        raise ValueError(f"torch_tpu add_rms_norm: x {tuple(x.shape)}, residual "
                         f"{tuple(residual.shape)} and weight {tuple(weight.shape)} do not match")
    _ensure()
    return kernel_op("add_rms_norm")(x, residual, weight, float(eps), bool(unit_offset))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             unit_offset: bool = False) -> torch.Tensor:
    """``weight * rms_norm(x)`` (Llama) or, with ``unit_offset``, Gemma's
    ``(rms_norm(x.float()) * (1 + weight.float())).to(x.dtype)``, as one op."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"torch_tpu rms_norm: weight {tuple(weight.shape)} does not match the "
                         f"last dim of x {tuple(x.shape)}")
    _ensure()
    return kernel_op("rms_norm")(x, weight, float(eps), bool(unit_offset))


def is_gemma_rms_norm(m: torch.nn.Module) -> bool:
    """Gemma's RMSNorm: ``(1 + weight)`` scale, ``eps`` attribute (Gemma, Gemma 2, Gemma 3)."""
    return type(m).__name__ in ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm") and \
        isinstance(getattr(m, "weight", None), torch.Tensor) and isinstance(getattr(m, "eps", None), float)


def rms_norm_module(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The forward of a Llama- or Gemma-style RMSNorm module as one op."""
    if is_gemma_rms_norm(m):
        return rms_norm(x, m.weight, m.eps, unit_offset=True)
    if is_llama_rms_norm(m):
        return rms_norm(x, m.weight, m.variance_epsilon)
    raise ValueError(f"torch_tpu rms_norm_module: {type(m).__name__} is neither a Llama- nor a "
                     "Gemma-style RMSNorm")


def gated_mlp(mlp: torch.nn.Module, x: torch.Tensor,
              residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``mlp.down_proj(act(mlp.gate_proj(x)) * mlp.up_proj(x)) (+ residual)`` as one op."""
    act = mlp_activation(mlp.act_fn)
    if act is None:
        raise ValueError(f"torch_tpu gated_mlp: activation {type(mlp.act_fn).__name__} is not "
                         "fused (supported: SiLU, GELU, GELU-tanh)")
    _ensure()
    g, u, d = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    return kernel_op("gated_mlp")(x, g.weight, u.weight, d.weight, g.bias, u.bias,
                                                 d.bias, residual, act)


# ---------------------------------------------------------------- kernelize

def is_gated_mlp(m: torch.nn.Module) -> bool:
    return all(isinstance(getattr(m, n, None), torch.nn.Linear)
               for n in ("gate_proj", "up_proj", "down_proj")) and \
        mlp_activation(getattr(m, "act_fn", None)) is not None


def is_llama_rms_norm(m: torch.nn.Module) -> bool:
    """``weight * normalize(x)`` with ``variance_epsilon`` (not Gemma's ``1 + weight``)."""
    return hasattr(m, "variance_epsilon") and isinstance(getattr(m, "weight", None), torch.Tensor) \
        and "Gemma" not in type(m).__name__


def _has_head_norms(m: torch.nn.Module) -> bool:
    """No q/k norms, or per-head Llama-style RMSNorms on both (Qwen3, Qwen3-MoE)."""
    q, k = getattr(m, "q_norm", None), getattr(m, "k_norm", None)
    if q is None and k is None:
        return True
    return q is not None and k is not None and is_llama_rms_norm(q) and is_llama_rms_norm(k) \
        and tuple(q.weight.shape) == (m.head_dim,) == tuple(k.weight.shape) \
        and q.variance_epsilon == k.variance_epsilon and type(m).__name__.startswith("Qwen3")


def is_llama_attention(m: torch.nn.Module) -> bool:
    """q/k/v/o projections, RoPE on full heads, optionally per-head q/k RMSNorms
    before RoPE (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral)."""
    return all(isinstance(getattr(m, n, None), torch.nn.Linear)
               for n in ("q_proj", "k_proj", "v_proj", "o_proj")) and \
        hasattr(m, "head_dim") and hasattr(m, "layer_idx") and _has_head_norms(m) and \
        getattr(m.config, "partial_rotary_factor", 1.0) == 1.0


def is_prenorm_decoder_layer(m: torch.nn.Module) -> bool:
    """input_layernorm -> self_attn -> + -> post_attention_layernorm -> mlp -> + (Llama)."""
    names = {n for n, _ in m.named_children()}
    return names == {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"} and \
        is_llama_rms_norm(m.post_attention_layernorm) and is_gated_mlp(m.mlp) and \
        type(m).__name__.startswith(("Llama", "Mistral", "Qwen2D"))


def is_moe_decoder_layer(m: torch.nn.Module) -> bool:
    """Llama's layer structure with a sparse MoE block as the MLP (Qwen3-MoE, Mixtral)."""
    from . import moe

    names = {n for n, _ in m.named_children()}
    return names == {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"} and \
        is_llama_rms_norm(m.post_attention_layernorm) and moe.supports_block(m.mlp) and \
        type(m).__name__ in ("Qwen3MoeDecoderLayer", "MixtralDecoderLayer")


_LAYERS = {"RMSNorm": is_llama_rms_norm, "GatedMLP": is_gated_mlp,
           "RopeAttention": is_llama_attention, "PreNormDecoderLayer": is_prenorm_decoder_layer,
           "MoEDecoderLayer": is_moe_decoder_layer}


def _layer_for(module: torch.nn.Module) -> Optional[str]:
    name = type(module).__name__
    if name.endswith("RMSNorm"):
        return "RMSNorm" if is_llama_rms_norm(module) else None
    if name.endswith("MLP"):
        return "GatedMLP" if is_gated_mlp(module) else None
    if name.endswith("Attention"):
        return "RopeAttention" if is_llama_attention(module) else None
    if name.endswith("DecoderLayer"):
        if is_moe_decoder_layer(module):
            return "MoEDecoderLayer"
        return "PreNormDecoderLayer" if is_prenorm_decoder_layer(module) else None
    return None


def kernel_mapping() -> dict:
    """layer name -> {"tpu": {Mode: LocalLayerRepository}} for every dense layer,
    plus ``rotary_pos_emb`` (Transformers' function hook on ``apply_rotary_pos_emb``,
    live with ``kernels`` >= 0.18.2) -> ``RotaryPosEmb``."""
    from kernels import LocalLayerRepository, Mode

    from . import RMS_NORM_REPO

    modes = [Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE,
             Mode.TRAINING | Mode.TORCH_COMPILE]
    out = {}
    for hook, layer in [(name, name) for name in _LAYERS] + [("rotary_pos_emb", "RotaryPosEmb")]:
        path = RMS_NORM_REPO if layer == "RMSNorm" else DENSE_REPO
        repo = LocalLayerRepository(repo_path=path, layer_name=layer)
        out[hook] = {"tpu": {m: repo for m in modes}}
    return out


def kernelize_dense(model: torch.nn.Module, mode: Any = None,
                    attention: bool = True) -> torch.nn.Module:
    """Swaps the dense layers of ``model`` (on tpu) for torch_tpu's fused kernels."""
    from kernels import Mode, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping

    from . import attention as attn

    for module in model.modules():
        layer = _layer_for(module)
        cls = type(module)
        if layer is not None and getattr(cls, "kernel_layer_name", None) in (None, layer):
            replace_kernel_forward_from_hub(cls, layer, condition=_LAYERS[layer])
    if attention:
        model.set_attn_implementation(attn.register())
    _ops()
    if mode is None:
        mode = Mode.TRAINING if model.training else Mode.INFERENCE
    with use_kernel_mapping(kernel_mapping()):
        kernelize(model, device="tpu", mode=mode)
    return model
