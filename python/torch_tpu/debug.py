"""Introspection: compilation, cache, execution and fallback counters."""
from __future__ import annotations

import os
from typing import Any

from . import _C


def stats() -> dict[str, Any]:
    """Counters since start (or the last reset_stats()).

    Keys: compiles, cache_hits, executions, compile_seconds, fallbacks (op name
    -> count of CPU-fallback runs), native_ops (op name -> count),
    transfers_to_device, transfers_to_host, cache_size; bounded dynamic shapes
    (torch_tpu.dynamic): dynamic_executables (compiled), dynamic_hits (calls
    that reused one), dynamic_exact_fallbacks (signatures XLA could not pad,
    back to exact shapes); compiles_by_op (op name -> strict-eager compiles,
    exact-shape and dynamic: which ops still recompile for new shapes).
    """
    return dict(_C._stats())


def reset_stats() -> None:
    """Zeroes the counters (the compilation cache is kept)."""
    _C._reset_stats()


def clear_cache() -> None:
    """Drops every compiled executable from the in-memory cache."""
    _C._clear_cache()


def native_ops() -> list[str]:
    """ATen ops (schema names) that have a native lowering rule."""
    return sorted(_C._native_ops())


def report(file: Any = None) -> str:
    """Prints (and returns) a readable summary of stats()."""
    s = stats()
    lines = [
        "torch_tpu report",
        f"  platform            {_C._platform()} ({os.path.basename(_C._plugin_path())})",
        f"  compiles            {s['compiles']}  ({s['compile_seconds']:.3f} s)",
        f"  cache hits          {s['cache_hits']}",
        f"  executions          {s['executions']}",
        f"  host->device        {s['transfers_to_device']}",
        f"  device->host        {s['transfers_to_host']}",
    ]
    native = s["native_ops"]
    lines.append(f"  native ops          {sum(native.values())} calls of {len(native)} ops")
    fb = s["fallbacks"]
    if fb:
        lines.append(f"  CPU fallbacks       {sum(fb.values())} calls of {len(fb)} ops:")
        for name, n in sorted(fb.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {name:<40} {n}")
    else:
        lines.append("  CPU fallbacks       none")
    text = "\n".join(lines)
    print(text, file=file)
    return text
