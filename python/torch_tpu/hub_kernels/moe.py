"""Fused MoE experts: the whole experts forward of a Transformers MoE layer as ONE op.

``experts_forward(self, hidden_states, top_k_index, top_k_weights)`` is a
Transformers experts implementation (the signature of
``transformers.integrations.moe.grouped_mm_experts_forward``). It runs one
``jax_op`` (``torch_tpu_kernels::moe_experts``): sort the (token, expert)
pairs by expert, a ragged grouped matmul for the gate/up projection, the
gate (``act(gate) * up``), the ragged grouped matmul of the down projection,
the routing weights, the un-sort and the sum over the top-k in float32. One
executable per layer call instead of ~20 small ones; backward through
``jax.vjp`` of the same function.

The grouped matmul costs the ragged work, not tokens x experts: the sorted
rows are cut into tiles of ``tile`` rows that each belong to one expert
(``ceil(S / tile) + min(E, S)`` tiles at most, a static count), and one batched
``tile x K @ K x N`` product runs every tile against its expert's weights.

Register it once, then select it like any experts implementation::

    from torch_tpu.hub_kernels import moe
    moe.register()                                   # name: "torch_tpu_fused"
    model.set_experts_implementation("torch_tpu_fused")

Supported: concatenated gate/up weights (``gate_up_proj``) with the default
gate, transposed or not, no biases, no post-expert norm, activations SiLU
(Qwen3-MoE, Mixtral-style) and GELU / GELU-tanh (Gemma-style). Other
layouts run Transformers' ``grouped_mm`` implementation unchanged.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["IMPLEMENTATION", "experts_forward", "register", "supports"]

#: The name under which :func:`register` adds the implementation.
IMPLEMENTATION = "torch_tpu_fused"

_ACTIVATIONS = {  # class name of the module's act_fn -> JAX activation
    "SiLU": "silu", "SiLUActivation": "silu",
    "GELUActivation": "gelu", "GELU": "gelu",
    "PytorchGELUTanh": "gelu_tanh", "GELUTanh": "gelu_tanh", "NewGELUActivation": "gelu_tanh",
    "GELUPytorchTanh": "gelu_tanh",
}


def _activation(module: Any) -> str | None:
    act = getattr(module, "act_fn", None)
    name = _ACTIVATIONS.get(type(act).__name__)
    if type(act).__name__ == "GELU" and getattr(act, "approximate", "none") == "tanh":
        return "gelu_tanh"
    return name


def supports(module: Any) -> bool:
    """Whether the fused kernel computes this experts module's forward."""
    from transformers.integrations import moe as hf_moe

    return (getattr(module, "has_gate", False) and not getattr(module, "has_bias", True)
            and not getattr(module, "has_post_expert_norm", True)
            and getattr(module, "is_concatenated", False)
            and not getattr(module, "_is_expert_parallel", True)
            and type(module)._apply_gate is hf_moe._default_apply_gate
            and _activation(module) is not None and hasattr(module, "gate_up_proj"))


def _tile_rows(rows: int, experts: int) -> int:
    """Rows per tile: about the mean rows per expert, a power of two in [8, 256]."""
    mean = max(1, -(-rows // experts))
    return min(256, max(8, 1 << (mean - 1).bit_length()))


@functools.cache
def _op() -> Any:
    import jax
    import jax.numpy as jnp

    from torch_tpu.pallas import jax_op

    def grouped(x: Any, w: Any, sizes: Any, tile: int, transposed: bool) -> Any:
        """Rows of ``x`` (sorted by expert, ``sizes`` rows each) times their expert's ``w``.

        The rows are cut into tiles that each belong to one expert (at most
        ``ceil(S / tile) + min(E, S)``); one batched product runs every tile against
        its expert's weights, and each row is read back from its tile.
        """
        rows, k = x.shape
        experts = w.shape[0]
        ends = jnp.cumsum(sizes)
        starts = ends - sizes
        tiles_per = (sizes + tile - 1) // tile
        tile_ends = jnp.cumsum(tiles_per)
        tile_starts = tile_ends - tiles_per
        n_tiles = -(-rows // tile) + min(experts, rows)  # at most min(E, S) experts are used
        t = jnp.arange(n_tiles)
        e = jnp.minimum(jnp.searchsorted(tile_ends, t, side="right"), experts - 1)
        index = (starts[e] + (t - tile_starts[e]) * tile)[:, None] + jnp.arange(tile)[None, :]
        valid = (t < tile_ends[-1])[:, None] & (index < ends[e][:, None])
        xp = jnp.concatenate([x, jnp.zeros((1, k), x.dtype)])
        tiles = xp[jnp.where(valid, index, rows)]  # (n_tiles, tile, K); padding reads zeros
        # (tile, N) results come out transposed: XLA:CPU's fastest batched layout.
        spec = "tkn,tik->tni" if transposed else "tnk,tik->tni"
        y = jnp.einsum(spec, jnp.take(w, e, axis=0), tiles, preferred_element_type=jnp.float32)
        y = jnp.swapaxes(y, 1, 2)
        # Row r of expert g sits in tile tile_starts[g] + (r - starts[g]) // tile.
        g = jnp.searchsorted(ends, jnp.arange(rows), side="right")
        local = jnp.arange(rows) - starts[g]
        return y[tile_starts[g] + local // tile, local % tile].astype(x.dtype)

    acts = {"silu": jax.nn.silu, "gelu": lambda g: jax.nn.gelu(g, approximate=False),
            "gelu_tanh": lambda g: jax.nn.gelu(g, approximate=True)}

    @jax_op("torch_tpu_kernels::moe_experts")
    def moe_experts(hidden: jax.Array, top_k_index: jax.Array, top_k_weights: jax.Array,
                    gate_up_proj: jax.Array, down_proj: jax.Array, activation: str,
                    transposed: bool) -> jax.Array:
        tokens, top_k = top_k_index.shape
        experts = gate_up_proj.shape[0]
        flat = top_k_index.reshape(-1).astype(jnp.int32)
        perm = jnp.argsort(flat, stable=True)
        sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
        tile = _tile_rows(flat.shape[0], experts)
        x = hidden[perm // top_k]
        h = grouped(x, gate_up_proj, sizes, tile, transposed)
        gate, up = jnp.split(h, 2, axis=-1)
        h = (acts[activation](gate) * up).astype(hidden.dtype)
        y = grouped(h, down_proj, sizes, tile, transposed).astype(jnp.float32)
        y = y * top_k_weights.reshape(-1)[perm].astype(jnp.float32)[:, None]
        y = y[jnp.argsort(perm)]  # back to (token, k) order
        return y.reshape(tokens, top_k, -1).sum(axis=1).astype(hidden.dtype)

    return moe_experts


def experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """Transformers experts implementation: the fused kernel where it applies."""
    if not supports(self):
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    if not torch.compiler.is_compiling():
        _op()  # registers the op (torch.compile then sees torch.ops.torch_tpu_kernels.*)
    return torch.ops.torch_tpu_kernels.moe_experts(
        hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj,
        _activation(self), bool(self.is_transposed))


def register(name: str = IMPLEMENTATION) -> str:
    """Adds :func:`experts_forward` to Transformers' ``ALL_EXPERTS_FUNCTIONS``."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    _op()
    ALL_EXPERTS_FUNCTIONS.register(name, experts_forward)
    return name
