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
rows are cut into tiles of ``tile`` rows that each belong to one expert. The
forward loops over the tiles in use (``fori_loop`` with a data-dependent trip
count): each iteration gathers its tokens, runs both projections against its
expert's weights read in place and adds the weighted rows into the float32
output. The backward (``jax.custom_vjp``) differentiates the whole-array form:
``ceil(S / tile) + min(E, S)`` tiles (a static count), one batched
``tile x K @ K x N`` product per projection against the gathered weights.

Where ``tokamax`` is installed and its ragged-dot kernel runs (the ``tpu``
platform: Mosaic; ``cuda``: Triton), both grouped matmuls are
``tokamax.ragged_dot_general`` instead (forward and backward through its own
vjp): ``grouped_matmul()`` says which one runs, ``use_grouped_matmul(name)``
chooses. On XLA:CPU tokamax lowers to a dense masked dot over all experts
(tokens x experts work), so the tiles run there.

``sparse_moe_block(block, hidden, residual)`` (``torch_tpu_kernels::moe_block``)
is the whole sparse MoE block of Qwen3-MoE / Mixtral, router included (linear,
float32 softmax, top-k, optional renormalisation), plus the residual add: ONE
op per MoE layer; ``dense.kernelize_dense`` puts it into the model.

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
import sys
from typing import Any, Optional

import torch

from . import kernel_op

__all__ = ["IMPLEMENTATION", "experts_forward", "register", "supports", "supports_block",
           "sparse_moe_block", "grouped_matmul", "use_grouped_matmul"]

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


#: Platforms where tokamax's ragged dot has a kernel of its own (elsewhere it
#: falls back to XLA's ragged_dot, a dense masked dot on XLA:CPU).
_TOKAMAX_PLATFORMS = ("tpu", "cuda")
_GROUPED = ["auto"]  # use_grouped_matmul's choice


def use_grouped_matmul(name: str) -> None:
    """Chooses the grouped matmul of the kernels: ``"tokamax"``
    (``tokamax.ragged_dot_general``; raises ImportError without tokamax),
    ``"tiles"`` (torch_tpu's own lowering) or ``"auto"`` (the default: tokamax
    where its kernel runs, see :func:`grouped_matmul`)."""
    if name not in ("auto", "tokamax", "tiles"):
        raise ValueError(f"torch_tpu moe: grouped matmul {name!r}; choose 'auto', 'tokamax' "
                         "or 'tiles'")
    if name == "tokamax":
        _tokamax()
    _GROUPED[0] = name


@functools.cache
def _tokamax_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("tokamax") is not None


def _tokamax() -> Any:
    try:
        import tokamax
    except ImportError as e:
        raise ImportError("torch_tpu moe: the 'tokamax' grouped matmul needs tokamax "
                          f"({e}); pip install tokamax==0.0.12") from e
    from absl import flags  # tokamax's dependency

    if not flags.FLAGS.is_parsed():
        # tokamax reads its config from absl flags, parsing sys.argv on first
        # use: the host program's own options (pytest -q, --batch) would be
        # "unknown flags". Parse none, as tokamax's own tests do.
        flags.FLAGS(sys.argv[:1])
    return tokamax


def grouped_matmul() -> str:
    """The grouped matmul the kernels use now: ``"tokamax"`` if chosen, or under
    ``"auto"`` when tokamax is installed and the platform is one where its
    kernel runs (tpu, cuda); ``"tiles"`` otherwise."""
    if _GROUPED[0] != "auto":
        return _GROUPED[0]
    import torch_tpu  # noqa: F401  (torch.tpu)

    platform = torch.tpu.get_platform()
    _AUTO[0] = "tokamax" if platform in _TOKAMAX_PLATFORMS and _tokamax_installed() else "tiles"
    return _AUTO[0]


_AUTO = ["tiles"]  # what "auto" resolved to (grouped_matmul())


def _tile_rows(rows: int, experts: int) -> int:
    """Rows per tile: about the mean rows per expert, a power of two in [8, 256]."""
    mean = max(1, -(-rows // experts))
    return min(256, max(8, 1 << (mean - 1).bit_length()))


@functools.cache
def _op() -> Any:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from torch_tpu.pallas import jax_op

    grouped_matmul()  # resolves "auto" for _grouped()

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

    def sort_by_expert(top_k_index: Any, experts: int) -> tuple[Any, Any, int]:
        """The (token, k) slots sorted by expert (stable), each expert's row
        count, and the row tile of the grouped matmuls."""
        flat = top_k_index.reshape(-1).astype(jnp.int32)
        perm = jnp.argsort(flat, stable=True)
        sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
        return perm, sizes, _tile_rows(flat.shape[0], experts)

    def experts_tiles(hidden: Any, top_k_index: Any, top_k_weights: Any, gate_up_proj: Any,
                      down_proj: Any, activation: str, transposed: bool) -> Any:
        """The experts forward as whole-array ops (differentiable: the backward)."""
        tokens, top_k = top_k_index.shape
        perm, sizes, tile = sort_by_expert(top_k_index, gate_up_proj.shape[0])
        x = hidden[perm // top_k]
        h = grouped(x, gate_up_proj, sizes, tile, transposed)
        gate, up = jnp.split(h, 2, axis=-1)
        h = (acts[activation](gate) * up).astype(hidden.dtype)
        y = grouped(h, down_proj, sizes, tile, transposed).astype(jnp.float32)
        y = y * top_k_weights.reshape(-1)[perm].astype(jnp.float32)[:, None]
        y = y[jnp.argsort(perm)]  # back to (token, k) order
        return y.reshape(tokens, top_k, -1).sum(axis=1).astype(hidden.dtype)

    def experts_loop(hidden: Any, top_k_index: Any, top_k_weights: Any, gate_up_proj: Any,
                     down_proj: Any, activation: str, transposed: bool) -> Any:
        """The experts forward as a loop over the used tiles: each iteration gathers
        its ``tile`` tokens, runs both projections against its expert's weights
        (read in place, never gathered into a copy) and adds the weighted rows
        into the float32 output. Costs the ragged work; the loop runs only the
        tiles in use (``sum(ceil(rows_e / tile))``)."""
        tokens, top_k = top_k_index.shape
        experts = gate_up_proj.shape[0]
        perm, sizes, tile = sort_by_expert(top_k_index, experts)
        ends = jnp.cumsum(sizes)
        starts = ends - sizes
        tile_ends = jnp.cumsum((sizes + tile - 1) // tile)
        tile_starts = tile_ends - (sizes + tile - 1) // tile
        pad = jnp.zeros((tile,), jnp.int32)
        token_of = jnp.concatenate([(perm // top_k).astype(jnp.int32), pad])
        weight_of = jnp.concatenate([top_k_weights.reshape(-1)[perm].astype(jnp.float32),
                                     pad.astype(jnp.float32)])
        spec = "tk,kn->tn" if transposed else "tk,nk->tn"

        def body(t: Any, out: Any) -> Any:
            e = jnp.minimum(jnp.searchsorted(tile_ends, t, side="right"), experts - 1)
            r0 = starts[e] + (t - tile_starts[e]) * tile
            valid = r0 + jnp.arange(tile) < ends[e]
            toks = jax.lax.dynamic_slice(token_of, (r0,), (tile,))
            w = jnp.where(valid, jax.lax.dynamic_slice(weight_of, (r0,), (tile,)), 0.0)
            h = jnp.einsum(spec, hidden[toks], gate_up_proj[e],
                           preferred_element_type=jnp.float32).astype(hidden.dtype)
            gate, up = jnp.split(h, 2, axis=-1)
            h = (acts[activation](gate) * up).astype(hidden.dtype)
            y = jnp.einsum(spec, h, down_proj[e], preferred_element_type=jnp.float32)
            y = y.astype(hidden.dtype).astype(jnp.float32)
            # rows past the expert's end (next expert's tokens) add exactly 0, even if y is inf
            return out.at[toks].add(jnp.where(valid[:, None], y * w[:, None], 0.0))

        out = jax.lax.fori_loop(0, tile_ends[-1], body,
                                jnp.zeros((tokens, hidden.shape[-1]), jnp.float32))
        return out.astype(hidden.dtype)

    @functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
    def experts(hidden: Any, top_k_index: Any, top_k_weights: Any, gate_up_proj: Any,
                down_proj: Any, activation: str, transposed: bool) -> Any:
        return experts_loop(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                            activation, transposed)

    def experts_fwd(hidden: Any, top_k_index: Any, top_k_weights: Any, gate_up_proj: Any,
                    down_proj: Any, activation: str, transposed: bool) -> tuple:
        out = experts(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                      activation, transposed)
        return out, (hidden, top_k_index, top_k_weights, gate_up_proj, down_proj)

    def experts_bwd(activation: str, transposed: bool, saved: tuple, ct: Any) -> tuple:
        hidden, top_k_index, top_k_weights, gate_up_proj, down_proj = saved
        _, pullback = jax.vjp(lambda h, w, gu, d: experts_tiles(h, top_k_index, w, gu, d,
                                                                activation, transposed),
                              hidden, top_k_weights, gate_up_proj, down_proj)
        gh, gw, ggu, gd = pullback(ct)
        index_ct = np.zeros(top_k_index.shape, dtype=jax.dtypes.float0)
        return gh, index_ct, gw, ggu, gd

    experts.defvjp(experts_fwd, experts_bwd)

    def ragged(x: Any, w: Any, sizes: Any, transposed: bool) -> Any:
        """tokamax's grouped matmul: rows of ``x`` (sorted) times their expert's
        ``w``, read as (E, K, N) if ``transposed`` else (E, N, K)."""
        numbers = jax.lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(([1], [1 if transposed else 2]), ([], [])),
            lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
        y = _tokamax().ragged_dot_general(x, w, sizes, numbers,
                                          preferred_element_type=jnp.float32)
        return y.astype(x.dtype)

    def experts_tokamax(hidden: Any, top_k_index: Any, top_k_weights: Any, gate_up_proj: Any,
                        down_proj: Any, activation: str, transposed: bool) -> Any:
        """The experts forward on tokamax.ragged_dot_general (backward: its vjp)."""
        tokens, top_k = top_k_index.shape
        perm, sizes, _ = sort_by_expert(top_k_index, gate_up_proj.shape[0])
        h = ragged(hidden[perm // top_k], gate_up_proj, sizes, transposed)
        gate, up = jnp.split(h, 2, axis=-1)
        h = (acts[activation](gate) * up).astype(hidden.dtype)
        y = ragged(h, down_proj, sizes, transposed).astype(jnp.float32)
        y = y * top_k_weights.reshape(-1)[perm].astype(jnp.float32)[:, None]
        y = y[jnp.argsort(perm)]  # back to (token, k) order
        return y.reshape(tokens, top_k, -1).sum(axis=1).astype(hidden.dtype)

    paths = {"tiles": experts, "tokamax": experts_tokamax}

    @jax_op("torch_tpu_kernels::moe_experts")
    def moe_experts(hidden: jax.Array, top_k_index: jax.Array, top_k_weights: jax.Array,
                    gate_up_proj: jax.Array, down_proj: jax.Array, activation: str,
                    transposed: bool, grouped: str = "tiles") -> jax.Array:
        return paths[grouped](hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                              activation, transposed)

    @jax_op("torch_tpu_kernels::moe_block")
    def moe_block(hidden: jax.Array, router_weight: jax.Array, gate_up_proj: jax.Array,
                  down_proj: jax.Array, residual: Optional[jax.Array], top_k: int,
                  norm_topk_prob: bool, cast_scores: bool, activation: str,
                  transposed: bool, grouped: str = "tiles") -> jax.Array:
        """Router (linear, float32 softmax, top-k, optional renormalisation, cast
        back) + experts (+ residual add): a whole sparse MoE block."""
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        logits = jnp.einsum("tk,ek->te", x, router_weight,
                            preferred_element_type=jnp.float32).astype(x.dtype)
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        top, index = jax.lax.top_k(probs, top_k)
        if norm_topk_prob:
            top = top / jnp.sum(top, axis=-1, keepdims=True)
        top = top.astype(x.dtype) if cast_scores else top
        y = paths[grouped](x, index, top, gate_up_proj, down_proj, activation,
                           transposed).reshape(shape)
        return y if residual is None else residual + y

    return moe_experts, moe_block


def _grouped() -> str:
    """grouped_matmul() as a plain read (torch.compile traces this; ``_op()``,
    which registers the ops, resolved "auto")."""
    return _GROUPED[0] if _GROUPED[0] != "auto" else _AUTO[0]


def experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """Transformers experts implementation: the fused kernel where it applies."""
    if not supports(self):
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    if not torch.compiler.is_compiling():
        _op()  # registers the op (torch.compile then sees torch.ops.torch_tpu_kernels.*)
    return kernel_op("moe_experts")(
        hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj,
        _activation(self), bool(self.is_transposed), _grouped())


#: Router classes whose forward the fused block computes: name -> (renormalise
#: the top-k probabilities (None: the router's ``norm_topk_prob``), cast the
#: scores back to the logits' dtype).
_ROUTERS = {"Qwen3MoeTopKRouter": (None, True), "MixtralTopKRouter": (True, False)}


def supports_block(block: Any) -> bool:
    """Whether :func:`sparse_moe_block` computes this sparse MoE block's forward
    (a Qwen3-MoE / Mixtral-style router and supported experts; no router jitter
    in training, no shared experts)."""
    gate, experts = getattr(block, "gate", None), getattr(block, "experts", None)
    names = {n for n, _ in block.named_children()}
    return type(gate).__name__ in _ROUTERS and experts is not None and supports(experts) \
        and names == {"gate", "experts"} and isinstance(getattr(gate, "weight", None), torch.Tensor) \
        and not (block.training and getattr(block, "jitter_noise", 0) > 0)


def sparse_moe_block(block: Any, hidden_states: torch.Tensor,
                     residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A whole sparse MoE block (router softmax / top-k / renormalisation and the
    experts), plus ``residual`` if given, as ONE op."""
    if not supports_block(block):
        raise ValueError(f"torch_tpu sparse_moe_block: {type(block).__name__} is not a supported "
                         "MoE block (Qwen3-MoE / Mixtral-style router + fused experts)")
    if residual is not None and residual.shape != hidden_states.shape:
        raise ValueError(f"torch_tpu sparse_moe_block: residual {tuple(residual.shape)} and "
                         f"hidden states {tuple(hidden_states.shape)} differ")
    if not torch.compiler.is_compiling():
        _op()
    gate, experts = block.gate, block.experts
    norm, cast = _ROUTERS[type(gate).__name__]
    norm = bool(gate.norm_topk_prob) if norm is None else norm
    return kernel_op("moe_block")(
        hidden_states, gate.weight, experts.gate_up_proj, experts.down_proj, residual,
        int(gate.top_k), norm, cast, _activation(experts), bool(experts.is_transposed),
        _grouped())


def register(name: str = IMPLEMENTATION) -> str:
    """Adds :func:`experts_forward` to Transformers' ``ALL_EXPERTS_FUNCTIONS``."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    _op()
    ALL_EXPERTS_FUNCTIONS.register(name, experts_forward)
    return name
