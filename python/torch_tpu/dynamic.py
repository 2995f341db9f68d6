"""Bounded dynamic shapes in strict eager (csrc/aten/dynamic.cpp).

Modes (TORCH_TPU_DYNAMIC_SHAPES, or set_mode() at run time):
  "0"    exact shapes: every new input shape compiles (the default for now);
  "auto" the first sizes of an op signature compile static; a second size in
         some dim makes that dim dynamic: one executable per size bucket
         (8 buckets per octave, < 12.5% padding per dim) serves every size in it;
  "1"    every dim of size > 1 dynamic from the first call (for measuring).
Ops that run dynamic: elementwise, reductions, softmax, matmul/linear
(functional variants); everything else keeps exact shapes.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from . import _C


def mode() -> str:
    """The current mode: "0", "auto" or "1"."""
    return _C._dynamic_shapes()


def set_mode(value: str) -> None:
    """Sets the mode ("0", "auto" or "1"); ValueError for anything else."""
    if value not in ("0", "auto", "1"):
        raise ValueError(f"torch_tpu.dynamic.set_mode: mode must be '0', 'auto' or '1', got {value!r}")
    _C._set_dynamic_shapes(value)


def forget_sizes() -> None:
    """Forgets the sizes each op signature has seen, so that the next call of
    a signature is its first again (compiled executables are kept)."""
    _C._forget_dynamic_sizes()


@contextmanager
def dynamic_shapes(value: str) -> Iterator[None]:
    """Runs the block with the mode set to `value`, then restores the old one."""
    old = mode()
    set_mode(value)
    try:
        yield
    finally:
        set_mode(old)
