"""Fused eager mode: record ops, run each chain as one compiled module.

Inside ``with torch_tpu.fused():`` (or with ``TORCH_TPU_DEFER_AND_FUSE=1``
for the whole process) ops are recorded instead of executed; the recorded
chain is compiled and run as ONE module when a value is needed: ``.cpu()``,
``.item()``, printing, ``torch.tpu.synchronize()``, an op that falls back to
the CPU or depends on data, a chain-length limit (``TORCH_TPU_FUSE_MAX_OPS``,
default 512), or leaving the context. Results are identical to strict eager;
a repeated chain (a training step, a decode step) hits the compilation cache.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from . import _C


@contextlib.contextmanager
def fused(enabled: bool = True) -> Iterator[None]:
    """Context manager turning fused eager on (or off).

    The setting is process-wide while the context is active (autograd runs
    backward ops on its own thread, and they join the same recording).
    """
    previous = _C._fusion_enabled()
    _C._set_fusion(enabled)
    try:
        yield
    finally:
        _C._set_fusion(previous)
        _C._flush()


def flush() -> None:
    """Runs the ops recorded so far (no-op in strict eager)."""
    _C._flush()
