"""The compile-burst log (csrc/aten/compile_log.cpp).

A burst of compiles (each within 2 s of the previous one) whose compile time
passes TORCH_TPU_COMPILE_LOG_SECONDS (default 1; 0 turns it off) logs ONE
warning on the "torch_tpu" logger: how many new executables, how long,
whether the disk cache is on, and how to make shapes dynamic. Nothing runs
per compile in Python; nothing at all on cache hits.
"""
from __future__ import annotations

import logging

from . import _C

logger = logging.getLogger("torch_tpu")


def message(count: int, seconds: float) -> str:
    """The line for a burst of `count` compiles that took `seconds`."""
    disk = _C._stats()["disk_cache_dir"]
    cache = f"disk cache on ({disk}): a new process loads them" if disk else \
        "disk cache off (TORCH_TPU_CACHE_DIR): a new process compiles them again"
    mode = _C._dynamic_shapes()
    if mode == "0":
        shapes = "each new input shape compiles again; TORCH_TPU_DYNAMIC_SHAPES=auto lets new sizes reuse " \
                 "bounded-dynamic executables"
    else:
        shapes = f"TORCH_TPU_DYNAMIC_SHAPES={mode}"
    plural = "s" if count != 1 else ""
    return (f"torch_tpu: {count} new executable{plural} compiled in {seconds:.1f} s so far "
            f"({cache}; {shapes}); torch_tpu.debug.report() names the ops that recompile")


def _on_burst(count: int, seconds: float) -> None:
    logger.warning(message(count, seconds))


def install() -> None:
    _C._set_compile_log_callback(_on_burst)
