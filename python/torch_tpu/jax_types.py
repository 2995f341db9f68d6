"""What jax_op (pallas.py) and its bounded-dynamic policy (jax_dynamic.py)
both read: torch <-> JAX / builder dtype names, and the tensor avals of a
call signature."""
from __future__ import annotations

from typing import Any

import torch

_DTYPE_NAMES = {  # torch dtype <-> numpy/JAX name
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int8: "int8", torch.int16: "int16", torch.int32: "int32",
    torch.int64: "int64", torch.uint8: "uint8", torch.uint16: "uint16", torch.uint32: "uint32",
    torch.uint64: "uint64", torch.bool: "bool",
}
_FROM_JAX = {v: k for k, v in _DTYPE_NAMES.items()}
_FROM_HLO = {  # the builder's element type names (graph rule arguments)
    "f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
    "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
    "ui8": torch.uint8, "ui16": torch.uint16, "ui32": torch.uint32, "ui64": torch.uint64,
    "i1": torch.bool,
}
_WIDE = {torch.float64, torch.int64, torch.uint64}


def _jax_dtype(dtype: torch.dtype, op: str) -> str:
    if dtype not in _DTYPE_NAMES:
        raise TypeError(f"jax_op {op}: tensors of dtype {dtype} are not supported")
    return _DTYPE_NAMES[dtype]


def _torch_dtype(jax_dtype: Any, op: str) -> torch.dtype:
    name = str(jax_dtype)
    if name not in _FROM_JAX:
        raise TypeError(f"jax_op {op}: the JAX function returns dtype {name}, which torch lacks")
    return _FROM_JAX[name]


def _avals_of(sig: tuple) -> list:
    """The tensor avals of a signature, in flat order."""
    out = []
    for s in sig:
        if s is not None and s[0] == "T":
            out.append(s)
        elif s is not None and s[0] == "L":
            out.extend(s[1])
    return out
