"""Bounded dynamic shapes in strict eager (csrc/aten/dynamic.cpp).

Modes (TORCH_TPU_DYNAMIC_SHAPES, or set_mode() at run time):
  "0"    exact shapes: every new input shape compiles;
  "auto" (the default) the first sizes of an op signature compile static; a
         second size in some dim makes that dim dynamic: one executable per
         size bucket serves every size in it (4, 8, 16, then 8 buckets per
         octave: < 12.5% padding per dim above 16; a small size reuses the
         smallest warm small bucket that holds it);
  "1"    every dim of size > 1 dynamic from the first call (for measuring).
Ops that run dynamic: the lowering rules marked dynamic (rules(): elementwise,
reductions, softmax, matmul, clone, cat, embedding and its backward,
masked_fill, cumsum, isin, norms, attention in its sequence dims), in their
functional forms and in place on whole storages, also on views such as
transposed heads and slices; everything else keeps exact shapes
(debug.report() says why). bucket(n) is the size a dynamic dim of size n
runs at.

Hints, in every mode (and forwarded to torch._dynamo, so that the same call
works for torch.compile): mark_dynamic(t, dim, min=None, max=None) makes a
dim of t run bounded from the first call (at max when the size fits, else at
its bucket); mark_static(t, dim) keeps a dim exact.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence, Union

import torch

from . import _C

Dims = Union[int, Sequence[int]]


def mode() -> str:
    """The current mode: "0", "auto" or "1"."""
    return _C._dynamic_shapes()


def set_mode(value: str) -> None:
    """Sets the mode ("0", "auto" or "1"); ValueError for anything else."""
    if value not in ("0", "auto", "1"):
        raise ValueError(f"torch_tpu.dynamic.set_mode: mode must be '0', 'auto' or '1', got {value!r}")
    _C._set_dynamic_shapes(value)


def bucket(n: int) -> int:
    """The size a dynamic dim of size `n` is padded to: 4, 8 or 16 up to 16,
    else `n` rounded up to a multiple of 2^(floor(log2 n) - 3) (8 buckets per
    octave: 16, 18, ..., 30, 32, 36, ...); sizes 0 and 1 stay as they are."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"torch_tpu.dynamic.bucket: expected an int size, got {n!r}")
    if n < 0:
        raise ValueError(f"torch_tpu.dynamic.bucket: a size is >= 0, got {n}")
    return n if n <= 1 else int(_C._dynamic_bucket(n))


def rules() -> list[str]:
    """The lowering rules strict eager may run bounded-dynamic (their in-place
    forms too), sorted."""
    return sorted(_C._dynamic_rules())


def forget_sizes() -> None:
    """Forgets the sizes each op signature has seen, so that the next call of
    a signature is its first again (compiled executables are kept); also
    the sizes jax_op families have seen (torch_tpu.pallas)."""
    _C._forget_dynamic_sizes()
    from . import jax_dynamic  # noqa: PLC0415

    jax_dynamic.forget()


@contextmanager
def dynamic_shapes(value: str) -> Iterator[None]:
    """Runs the block with the mode set to `value`, then restores the old one."""
    old = mode()
    set_mode(value)
    try:
        yield
    finally:
        set_mode(old)


def _dims(t: torch.Tensor, dim: Dims, what: str) -> list[int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"torch_tpu.{what}: expected a tensor, got {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    out = []
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool):
            raise TypeError(f"torch_tpu.{what}: dims must be ints, got {d!r}")
        if not -t.dim() <= d < t.dim():
            raise ValueError(f"torch_tpu.{what}: dim {d} is out of range for a {t.dim()}-d tensor")
        out.append(d % t.dim())
    return out


def _bound(value: int | None, name: str) -> int:
    if value is None:
        return -1
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"torch_tpu.mark_dynamic: {name} must be a non-negative int or None, got {value!r}")
    return value


def _note_hints() -> None:
    from . import jax_dynamic  # noqa: PLC0415  (jax_op reads hints once any exist)

    jax_dynamic._HINTS[0] = True


def mark_dynamic(t: torch.Tensor, dim: Dims, min: int | None = None, max: int | None = None) -> None:
    """Marks dim(s) of `t` dynamic: the ops that take `t` (and, through the
    ops that run dynamic, their results) compile one executable bounded by
    `max` (when the size fits; else the size's bucket) from the first call,
    whatever the mode. Also TorchTPU's spelling mark_dynamic(t, dim, lower,
    upper). Forwarded to torch._dynamo.mark_dynamic (imported on first use)."""
    dims = _dims(t, dim, "mark_dynamic")
    lo, hi = _bound(min, "min"), _bound(max, "max")
    if hi >= 0 and hi < 2:
        raise ValueError(f"torch_tpu.mark_dynamic: max must be at least 2 (a dim of size <= 1 stays static), got {hi}")
    if lo >= 0 and hi >= 0 and lo > hi:
        raise ValueError(f"torch_tpu.mark_dynamic: min ({lo}) is larger than max ({hi})")
    if t.device.type == "tpu":
        _C._mark_dims(t, dims, True, lo, hi)
        _note_hints()
    import torch._dynamo

    torch._dynamo.mark_dynamic(t, dims, min=min, max=max)


def mark_static(t: torch.Tensor, dim: Dims) -> None:
    """Marks dim(s) of `t` static: they never run dynamic in eager (nor
    count as a new size), whatever the mode. Forwarded to
    torch._dynamo.mark_static."""
    dims = _dims(t, dim, "mark_static")
    if t.device.type == "tpu":
        _C._mark_dims(t, dims, False, -1, -1)
        _note_hints()
    import torch._dynamo

    torch._dynamo.mark_static(t, dims)


def dim_hints(t: torch.Tensor) -> list[str]:
    """Per dim of `t`: "dynamic", "static" or "" (no hint)."""
    return list(_C._dim_hints(t))
