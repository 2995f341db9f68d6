"""Attention as ONE op: decode over a KV cache and flash-style prefill.

Two ``torch.tpu.pallas.jax_op`` kernels, each the whole attention of one
layer call (scores, scale, soft-cap, causal / sliding-window / padding mask,
softmax, weighted sum of the values; GQA without repeating the KV heads):

- ``torch_tpu_kernels::decode_attention``: a few query tokens against the
  whole cache in one pass (scores of every key at once, float32 softmax);
- ``torch_tpu_kernels::flash_attention``: prefill, blockwise over the keys
  with an online softmax (running max and sum in float32, ``lax.scan`` over
  key blocks), so no (Sq x Sk) score matrix of the whole sequence is kept.

Backward is ``jax.vjp`` of the same functions (one more op each).

:func:`register` adds :func:`attention_forward` to Transformers' attention
registry (``AttentionInterface``) and the SDPA mask builder under the same
name, so the model hands the kernel a boolean mask (True = attend) that
already encodes the causal structure, the padding of ``attention_mask``, the
sliding window and the unfilled slots of a StaticCache; where Transformers
skips the mask (pure causal, no padding), the kernel applies the causal mask
itself (queries at the end of the keys, as in a KV cache) and the module's
``sliding_window``::

    from torch_tpu.hub_kernels import attention
    attention.register()                     # "torch_tpu_attention"
    model.set_attn_implementation("torch_tpu_attention")

Works with DynamicCache and StaticCache (the op sees the keys the cache
returns). Calls the kernels do not cover (dropout in training, attention
sinks ``s_aux``, ``output_attentions``) run Transformers' SDPA implementation.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from . import kernel_op

__all__ = ["IMPLEMENTATION", "attention_forward", "register", "decode_attention",
           "flash_attention"]

#: The name under which :func:`register` adds the implementation.
IMPLEMENTATION = "torch_tpu_attention"

#: Keys per block of the flash (prefill) kernel.
FLASH_BLOCK = 128


def _allowed(jnp: Any, mask: Any, shape: tuple, causal: bool, window: int) -> tuple:
    """(boolean (B, Hkv|1, G|1, Sq, Sk) keep-mask or None, additive bias or None)."""
    b, hkv, g, sq, sk = shape
    keep = None
    if causal or window > 0:
        qpos = jnp.arange(sq)[:, None] + (sk - sq)  # the queries are the last Sq positions
        kpos = jnp.arange(sk)[None, :]
        keep = jnp.ones((sq, sk), bool)
        if causal:
            keep = keep & (kpos <= qpos)
        if window > 0:
            keep = keep & (qpos - kpos < window)
        keep = keep[None, None, None]
    bias = None
    if mask is not None:
        heads = mask.shape[1] if mask.ndim == 4 else 1
        m = jnp.broadcast_to(mask, (b, heads, sq, sk))
        m = m[:, :, None] if heads == 1 else m.reshape(b, hkv, g, sq, sk)
        if m.dtype == jnp.bool_:
            keep = m if keep is None else keep & m
        else:
            bias = m.astype(jnp.float32)
    return keep, bias


def _scores(jnp: Any, qg: Any, k: Any, scaling: float, softcap: float) -> Any:
    s = jnp.einsum("bhgqd,bhkd->bhgqk", qg, k, preferred_element_type=jnp.float32) * scaling
    if softcap > 0:
        s = jnp.tanh(s / softcap) * softcap
    return s


def _out_layout(jnp: Any, out: Any, dtype: Any) -> Any:
    """(B, Hkv, G, Sq, D) -> Transformers' (B, Sq, H, D)."""
    b, hkv, g, sq, d = out.shape
    return jnp.transpose(out.reshape(b, hkv * g, sq, d), (0, 2, 1, 3)).astype(dtype)


@functools.cache
def _ops() -> tuple:
    import jax
    import jax.numpy as jnp

    from torch_tpu.pallas import jax_op

    @jax_op("torch_tpu_kernels::decode_attention")
    def decode(q: jax.Array, k: jax.Array, v: jax.Array, mask: Optional[jax.Array],
               scaling: float, causal: bool, window: int, softcap: float) -> jax.Array:
        b, h, sq, d = q.shape
        hkv = k.shape[1]
        qg = q.reshape(b, hkv, h // hkv, sq, d)
        s = _scores(jnp, qg, k, scaling, softcap)
        keep, bias = _allowed(jnp, mask, (b, hkv, h // hkv, sq, k.shape[2]), causal, window)
        if bias is not None:
            s = s + bias
        if keep is not None:
            s = jnp.where(keep, s, -jnp.inf)
        m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))  # exact: cancels out
        p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
        l = jnp.sum(p, axis=-1, keepdims=True)
        p = (p / jnp.where(l > 0, l, 1.0)).astype(v.dtype)  # fully masked rows give 0
        out = jnp.einsum("bhgqk,bhkd->bhgqd", p, v, preferred_element_type=jnp.float32)
        return _out_layout(jnp, out, q.dtype)

    @jax_op("torch_tpu_kernels::flash_attention")
    def flash(q: jax.Array, k: jax.Array, v: jax.Array, mask: Optional[jax.Array],
              scaling: float, causal: bool, window: int, softcap: float,
              block: int) -> jax.Array:
        return _flash(jax, jnp, q, k, v, mask, scaling, causal, window, softcap, block)

    return decode, flash


def _flash(jax: Any, jnp: Any, q: Any, k: Any, v: Any, mask: Any, scaling: float, causal: bool,
           window: int, softcap: float, block: int) -> Any:
    """Blockwise attention with an online softmax over key blocks of ``block`` keys."""
    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    g = h // hkv
    block = max(1, min(block, sk))
    nb = -(-sk // block)
    pad = nb * block - sk
    qg = q.reshape(b, hkv, g, sq, d)
    keep, bias = _allowed(jnp, mask, (b, hkv, g, sq, sk), causal, window)
    valid = jnp.arange(nb * block) < sk  # padded keys never count
    keep = valid[None, None, None, None] if keep is None else \
        jnp.pad(keep, [(0, 0)] * 4 + [(0, pad)]) & valid
    keep = jnp.broadcast_to(keep, keep.shape[:3] + (sq, nb * block))
    bias = None if bias is None else jnp.pad(bias, [(0, 0)] * 4 + [(0, pad)])

    def blocks(x: Any) -> Any:  # (..., nb*block) on the last axis -> (nb, ..., block)
        return jnp.moveaxis(x.reshape(x.shape[:-1] + (nb, block)), -2, 0)

    kb = jnp.moveaxis(jnp.pad(k, [(0, 0), (0, 0), (0, pad), (0, 0)]).reshape(b, hkv, nb, block, d), 2, 0)
    vb = jnp.moveaxis(jnp.pad(v, [(0, 0), (0, 0), (0, pad), (0, 0)]).reshape(b, hkv, nb, block, d), 2, 0)
    xs = (kb, vb, blocks(keep)) + (() if bias is None else (blocks(bias),))

    def step(carry: tuple, x: tuple) -> tuple:
        m, l, acc = carry
        s = _scores(jnp, qg, x[0], scaling, softcap)
        if len(x) == 4:
            s = s + x[3]
        s = jnp.where(x[2], s, -jnp.inf)
        m_new = jnp.maximum(m, jax.lax.stop_gradient(jnp.max(s, axis=-1)))  # cancels out
        base = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - base[..., None])
        corr = jnp.exp(jnp.where(jnp.isfinite(m), m, 0.0) - base) * jnp.isfinite(m)
        l = l * corr + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bhgqk,bhkd->bhgqd", p.astype(x[1].dtype), x[1],
                        preferred_element_type=jnp.float32)
        return (m_new, l, acc * corr[..., None] + pv), None

    init = (jnp.full((b, hkv, g, sq), -jnp.inf, jnp.float32), jnp.zeros((b, hkv, g, sq), jnp.float32),
            jnp.zeros((b, hkv, g, sq, d), jnp.float32))
    (_, l, acc), _ = jax.lax.scan(step, init, xs)
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]
    return _out_layout(jnp, out, q.dtype)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError("torch_tpu attention: expected query (B, H, Sq, D) and key / value "
                         f"(B, Hkv, Sk, D) of one shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[1] % k.shape[1] or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"torch_tpu attention: {q.shape[1]} query heads cannot share "
                         f"{k.shape[1]} KV heads (or batch / head_dim differ): "
                         f"{tuple(q.shape)} vs {tuple(k.shape)}")
    if mask is not None and mask.dim() != 4:
        raise ValueError("torch_tpu attention: the attention mask must be 4-D (B|1, 1|H, Sq, Sk) "
                         f"(boolean keep-mask or additive float), got shape {tuple(mask.shape)}")


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: Optional[torch.Tensor] = None, *, scaling: Optional[float] = None,
                     causal: bool = True, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """Attention of q (B, H, Sq, D) over the cache k, v (B, Hkv, Sk, D): (B, Sq, H, D)."""
    _check(q, k, v, mask)
    scale = q.shape[-1] ** -0.5 if scaling is None else float(scaling)
    if not torch.compiler.is_compiling():
        _ops()
    return kernel_op("decode_attention")(q, k, v, mask, scale, bool(causal),
                                                        int(window or 0), float(softcap or 0.0))


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: Optional[torch.Tensor] = None, *, scaling: Optional[float] = None,
                    causal: bool = True, window: int = 0, softcap: float = 0.0,
                    block: int = FLASH_BLOCK) -> torch.Tensor:
    """Blockwise (online-softmax) attention, same contract as :func:`decode_attention`."""
    _check(q, k, v, mask)
    scale = q.shape[-1] ** -0.5 if scaling is None else float(scaling)
    if not torch.compiler.is_compiling():
        _ops()
    return kernel_op("flash_attention")(q, k, v, mask, scale, bool(causal),
                                                       int(window or 0), float(softcap or 0.0),
                                                       int(block))


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, **kwargs: Any) -> tuple:
    """A Transformers attention function (``sdpa_attention_forward``'s contract)."""
    if (dropout and module.training) or kwargs.get("s_aux") is not None \
            or kwargs.get("output_attentions"):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    causal, window = False, 0
    if attention_mask is None:  # Transformers skipped the mask: pure causal, no padding
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None) or 0
    args = dict(scaling=scaling, causal=causal, window=window, softcap=kwargs.get("softcap") or 0.0)
    if query.shape[2] == 1:
        return decode_attention(query, key, value, attention_mask, **args), None
    return flash_attention(query, key, value, attention_mask, **args), None


def register(name: str = IMPLEMENTATION) -> str:
    """Adds :func:`attention_forward` (and the SDPA mask builder) under ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    _ops()
    AttentionInterface.register(name, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
    return name
