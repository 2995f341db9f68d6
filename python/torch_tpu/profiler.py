"""Profiling tpu programs: ``torch.profiler`` as on CUDA, plus what it cannot say.

``torch.profiler.profile(activities=[ProfilerActivity.CPU,
ProfilerActivity.PrivateUse1])`` (``ProfilerActivity.TPU`` is the same
activity: torch 2.13 has no member of that name, torch_tpu adds it as an
alias) records, next to PyTorch's host events, the runtime's spans
(``csrc/runtime/trace.h``):

- ``execute``: each tpu op's (or fused chain's, or compiled graph's) device
  execution, from the later of its launch and the previous completion on
  the device to the moment its outputs are ready (PJRT completion events);
- ``compile``: each StableHLO compilation (a cache miss), named by op;
- ``to_device`` / ``to_host``: host<->device transfers.

``prof.export_chrome_trace(path)`` (and ``tensorboard_trace_handler``) write
them into the same Chrome trace, as one process per device ("tpu:0") with a
row per kind, on the host events' clock. PyTorch's tables
(``key_averages()``) stay host-only; :func:`summary` gives the device table.

Without ``torch.profiler``, ``with torch_tpu.profiler.trace() as t:`` collects
the same spans (``t.spans``, ``t.summary()``, ``t.export_chrome_trace(path)``).
Also available as ``torch.tpu.profiler``.
"""
from __future__ import annotations

import collections
import gzip
import json
import os
import time
from dataclasses import dataclass

import torch

from . import _C

KINDS = ("execute", "compile", "to_device", "to_host")
_ROWS = {"execute": (0, "device execution"), "compile": (1, "compile (host)"),
         "to_device": (2, "transfers (host)"), "to_host": (2, "transfers (host)")}
_CATEGORIES = {"execute": "kernel", "compile": "tpu_compile", "to_device": "gpu_memcpy",
               "to_host": "gpu_memcpy"}
_active: Trace | None = None


@dataclass
class Span:
    """One runtime span; times in nanoseconds since the Unix epoch."""
    kind: str
    name: str
    device: int
    start_ns: int
    end_ns: int

    @property
    def duration_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1e3


class Trace:
    """The runtime's spans between start() and stop() (one session at a time)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.dropped = 0

    def start(self) -> Trace:
        global _active
        if _active is not None:
            raise RuntimeError("torch_tpu.profiler: a trace is already being collected; "
                               "stop it before starting another")
        _active = self
        _C._trace_start()
        return self

    def stop(self) -> Trace:
        global _active
        if _active is not self:
            return self
        try:
            torch.tpu.synchronize()  # every launched execution completes (and is reported)
        finally:
            raw, self.dropped = _C._trace_stop()
            _active = None
        to_unix = time.time_ns() - _C._trace_now_ns()
        self.spans = [Span(k, n, d, s + to_unix, e + to_unix) for k, n, d, s, e in raw]
        return self

    __enter__ = start

    def __exit__(self, *exc) -> None:
        self.stop()

    def summary(self, top: int = 20) -> str:
        """Totals per kind and the ops with the most device time."""
        return summary(self.spans, top)

    def chrome_events(self, base_ns: int = 0) -> list[dict]:
        """The spans as Chrome trace events (``ts`` in us after ``base_ns``)."""
        return chrome_events(self.spans, base_ns)

    def export_chrome_trace(self, path: str) -> None:
        """A Chrome trace (chrome://tracing, Perfetto) of these spans alone."""
        _write_json(path, {"traceEvents": self.chrome_events(), "displayTimeUnit": "ms"})


def trace() -> Trace:
    """``with torch_tpu.profiler.trace() as t:`` collects the runtime's spans."""
    return Trace()


def chrome_events(spans: list[Span], base_ns: int = 0) -> list[dict]:
    platform = torch.tpu.get_platform()
    events, devices = [], sorted({max(s.device, 0) for s in spans})
    for d in devices:
        events.append({"ph": "M", "name": "process_name", "pid": d, "tid": 0,
                       "args": {"name": f"tpu:{d} ({platform})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": d, "tid": 0,
                       "args": {"sort_index": d}})
        for tid, label in set(_ROWS.values()):
            events.append({"ph": "M", "name": "thread_name", "pid": d, "tid": tid,
                           "args": {"name": label}})
    for s in spans:
        events.append({"ph": "X", "cat": _CATEGORIES[s.kind], "name": s.name,
                       "pid": max(s.device, 0), "tid": _ROWS[s.kind][0],
                       "ts": (s.start_ns - base_ns) / 1e3, "dur": s.duration_us,
                       "args": {"kind": s.kind, "device": f"tpu:{max(s.device, 0)}"}})
    return events


def summary(spans: list[Span], top: int = 20) -> str:
    by_kind = collections.Counter()
    count = collections.Counter()
    by_op = collections.Counter()
    calls = collections.Counter()
    for s in spans:
        by_kind[s.kind] += s.duration_us
        count[s.kind] += 1
        if s.kind == "execute":
            by_op[s.name] += s.duration_us
            calls[s.name] += 1
    lines = [f"{'kind':<12}{'count':>8}{'total ms':>12}"]
    lines += [f"{k:<12}{count[k]:>8}{by_kind[k] / 1e3:>12.3f}" for k in KINDS]
    lines += ["", f"{'device op':<40}{'calls':>8}{'total ms':>12}{'avg us':>10}"]
    for name, us in by_op.most_common(top):
        lines.append(f"{name[:39]:<40}{calls[name]:>8}{us / 1e3:>12.3f}{us / calls[name]:>10.1f}")
    return "\n".join(lines)


def spans(prof) -> list[Span]:
    """The runtime spans a ``torch.profiler.profile`` recorded (empty unless
    its activities include ``ProfilerActivity.PrivateUse1``)."""
    t = getattr(prof, "_torch_tpu_trace", None)
    return t.spans if t is not None else []


def _write_json(path: str, data: dict) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(data, f)


def _merge_into_chrome_trace(path: str, trace_: Trace) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    base = int(data.get("baseTimeNanoseconds", 0))
    data.setdefault("traceEvents", []).extend(trace_.chrome_events(base))
    _write_json(path, data)


def _wants_tpu(prof) -> bool:
    from torch.profiler import ProfilerActivity

    return ProfilerActivity.PrivateUse1 in (getattr(prof, "activities", None) or ())


def install() -> None:
    """Hooks the runtime's spans into ``torch.profiler`` (idempotent)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler.profiler import _KinetoProfile

    if not hasattr(ProfilerActivity, "TPU"):
        try:
            ProfilerActivity.TPU = ProfilerActivity.PrivateUse1
        except (AttributeError, TypeError):
            pass
    if getattr(_KinetoProfile, "_torch_tpu_hooked", False):
        return
    start_trace, stop_trace = _KinetoProfile.start_trace, _KinetoProfile.stop_trace
    export = _KinetoProfile.export_chrome_trace

    def start_trace_with_tpu(self) -> None:
        start_trace(self)
        if _wants_tpu(self) and _active is None:
            self._torch_tpu_trace = Trace().start()

    def stop_trace_with_tpu(self) -> None:
        t = getattr(self, "_torch_tpu_trace", None)
        if t is not None and t is _active:
            t.stop()
        stop_trace(self)

    def export_with_tpu(self, path: str, *args, **kwargs):
        result = export(self, path, *args, **kwargs)
        t = getattr(self, "_torch_tpu_trace", None)
        if t is not None and t.spans and os.path.exists(path):
            _merge_into_chrome_trace(path, t)
        return result

    _KinetoProfile.start_trace = start_trace_with_tpu
    _KinetoProfile.stop_trace = stop_trace_with_tpu
    _KinetoProfile.export_chrome_trace = export_with_tpu
    _KinetoProfile._torch_tpu_hooked = True
