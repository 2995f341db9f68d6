"""Introspection: compilation, cache, execution and fallback counters."""
from __future__ import annotations

import os
from typing import Any

from . import _C


def stats() -> dict[str, Any]:
    """Counters since start (or the last reset_stats()).

    Keys: compiles, cache_hits (hit_path_hits: of them, calls launched from
    a fingerprint of their arguments, without planning), executions, compile_seconds, fallbacks (op name
    -> count of CPU-fallback runs), native_ops (op name -> count),
    transfers_to_device, transfers_to_host, cache_size; bounded dynamic shapes
    (torch_tpu.dynamic): dynamic_executables (compiled), dynamic_hits (calls
    that reused one; dynamic_hit_path_hits: of them, a call at sizes and
    layouts that ran before, launched without planning again),
    dynamic_derived_specs (new sizes whose output shapes came from what the
    signature learnt of its sizes, without PyTorch's meta kernel),
    dynamic_exact_fallbacks (signatures XLA could not pad,
    back to exact shapes); compiles_by_op (op name -> strict-eager compiles,
    exact-shape and dynamic: which ops still recompile for new shapes),
    dynamic_compiles_by_op (of those, the bounded-dynamic ones); exact_reasons
    (op name -> why its exact-shape compiles did not run dynamic -> count).
    """
    return dict(_C._stats())


def reset_stats() -> None:
    """Zeroes the counters (the compilation cache is kept)."""
    _C._reset_stats()


def clear_cache() -> None:
    """Drops every compiled executable held in memory: strict eager's exact-shape and
    bounded-dynamic caches, its hit path and the runtime's cache (a recorded fused
    chain runs first). The next call of each signature compiles again, or loads its
    executable from the disk cache when that is on."""
    _C._clear_cache()


def xla_compile_options() -> dict[str, str]:
    """The XLA debug options every compile passes (name -> value as given):
    what TORCH_TPU_XLA_OPTIONS="name=value,..." set when the runtime started
    (empty when it is unset)."""
    return dict(_C._xla_compile_options())


def native_ops() -> list[str]:
    """ATen ops (schema names) that have a native lowering rule."""
    return sorted(_C._native_ops())


class Report(dict):
    """report()'s result: a dict of what it printed (its "text" too), shown
    briefly at the prompt (the text is already printed)."""

    def __repr__(self) -> str:
        return (f"<torch_tpu report: {self['compiles']} compiles, "
                f"{len(self['recompiling_ops'])} ops recompiling per shape; .text or print() for all>")

    def __str__(self) -> str:
        return self["text"]


def _compile_section(s: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    """Ops that compiled more than one exact-shape executable (they recompile
    per new input shape), and the lines that name them."""
    by_op, dyn = s["compiles_by_op"], s["dynamic_compiles_by_op"]
    exact = {op: n - dyn.get(op, 0) for op, n in by_op.items()}
    recompiling = {op: n for op, n in sorted(exact.items(), key=lambda kv: (-kv[1], kv[0])) if n > 1}
    lines = []
    if recompiling:
        lines.append(f"  recompiling per shape {len(recompiling)} ops (exact-shape compiles, most first):")
        reasons = s.get("exact_reasons", {})
        for op, n in list(recompiling.items())[:20]:
            extra = f" (+{dyn[op]} dynamic)" if dyn.get(op) else ""
            why = sorted(reasons.get(op, {}).items(), key=lambda kv: -kv[1])
            because = f"  exact: {why[0][0]}" if why else ""
            lines.append(f"    {op:<40} {n}{extra}{because}")
        if len(recompiling) > 20:
            lines.append(f"    ... and {len(recompiling) - 20} more (report()['recompiling_ops'])")
        if _C._dynamic_shapes() == "0":
            lines.append("    new shapes compile again: TORCH_TPU_DYNAMIC_SHAPES=auto (or torch_tpu.mark_dynamic)"
                         " lets new sizes reuse bounded-dynamic executables")
        else:
            lines.append("    these ops (or these inputs: views, in-place/out=) run exact shapes only"
                         " (README: dynamic shapes)")
    else:
        lines.append("  recompiling per shape none")
    return recompiling, lines


def report(file: Any = None) -> Report:
    """Prints a readable summary of stats() and returns it as a dict: why a
    call was slow (the ops that still recompile per shape, the dynamic
    executables and their hits, CPU fallbacks, the disk cache)."""
    s = stats()
    disk = s["disk_cache_dir"]
    mode = _C._dynamic_shapes()
    lines = [
        "torch_tpu report",
        f"  platform            {_C._platform()} ({os.path.basename(_C._plugin_path())})",
        f"  compiles            {s['compiles']}  ({s['compile_seconds']:.3f} s)",
        f"  cache hits          {s['cache_hits']}",
        f"  executions          {s['executions']}",
        f"  host->device        {s['transfers_to_device']}",
        f"  device->host        {s['transfers_to_host']}",
        f"  disk cache          " + (f"on ({disk}): {s['disk_hits']} loaded, {s['disk_misses']} missed, "
                                     f"{s['disk_prefetched']} prefetched" if disk else "off"),
        f"  dynamic shapes      mode {mode}: {s['dynamic_executables']} dynamic executables, "
        f"{s['dynamic_hits']} hits, {s['dynamic_exact_fallbacks']} signatures back to exact shapes",
    ]
    recompiling, compile_lines = _compile_section(s)
    lines += compile_lines
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
    return Report(
        text=text, compiles=s["compiles"], compile_seconds=s["compile_seconds"],
        recompiling_ops=recompiling, compiles_by_op=dict(s["compiles_by_op"]),
        dynamic={"mode": mode, "executables": s["dynamic_executables"], "hits": s["dynamic_hits"],
                 "exact_fallbacks": s["dynamic_exact_fallbacks"],
                 "compiles_by_op": dict(s["dynamic_compiles_by_op"])},
        fallbacks=dict(fb),
        disk_cache={"enabled": bool(disk), "dir": disk, "hits": s["disk_hits"], "misses": s["disk_misses"],
                    "prefetched": s["disk_prefetched"]},
    )
