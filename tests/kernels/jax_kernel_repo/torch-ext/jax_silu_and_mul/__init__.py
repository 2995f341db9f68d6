"""SiLU-and-mul (SwiGLU's gate) as one Pallas kernel, written for TorchTPU.

``silu_and_mul(x)`` = ``silu(x[..., :d]) * x[..., d:]`` with ``d = x.shape[-1] // 2``.
Forward and backward are Pallas kernels (``jax.custom_vjp``), compiled on
TPU and run in Pallas' interpret mode elsewhere.
"""
import functools

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl
from torch.tpu.pallas import jax_op

from . import layers

__all__ = ["layers", "silu_and_mul"]


def _forward_kernel(x_ref, o_ref):
    d = o_ref.shape[-1]
    x = x_ref[...].astype(jnp.float32)
    gate, up = x[:, :d], x[:, d:]
    o_ref[...] = (gate * jax.nn.sigmoid(gate) * up).astype(o_ref.dtype)


def _backward_kernel(x_ref, g_ref, dx_ref):
    d = g_ref.shape[-1]
    x = x_ref[...].astype(jnp.float32)
    g = g_ref[...].astype(jnp.float32)
    gate, up = x[:, :d], x[:, d:]
    sig = jax.nn.sigmoid(gate)
    d_gate = g * up * sig * (1 + gate * (1 - sig))
    dx_ref[...] = jnp.concatenate([d_gate, g * gate * sig], axis=-1).astype(dx_ref.dtype)


@functools.cache
def _interpret() -> bool:
    return torch.tpu.get_platform() != "tpu"


def _call(kernel, out_shape, *args):
    return pl.pallas_call(kernel, out_shape=out_shape, interpret=_interpret())(*args)


@jax.custom_vjp
def _silu_and_mul_2d(rows):
    out = jax.ShapeDtypeStruct((rows.shape[0], rows.shape[1] // 2), rows.dtype)
    return _call(_forward_kernel, out, rows)


def _fwd(rows):
    return _silu_and_mul_2d(rows), rows


def _bwd(rows, g):
    return (_call(_backward_kernel, jax.ShapeDtypeStruct(rows.shape, rows.dtype), rows, g),)


_silu_and_mul_2d.defvjp(_fwd, _bwd)


@jax_op("jax_silu_and_mul::silu_and_mul")
def silu_and_mul(x: jax.Array) -> jax.Array:
    out = _silu_and_mul_2d(x.reshape(-1, x.shape[-1]))
    return out.reshape(*x.shape[:-1], x.shape[-1] // 2)
