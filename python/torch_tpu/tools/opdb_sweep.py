"""op_db sweep: every entry of PyTorch's op_db, run on tpu and compared with CPU.

Usage::

    python -m torch_tpu.tools.opdb_sweep --json opdb.json            # forward f32/bf16/c64 + backward f32
    python -m torch_tpu.tools.opdb_sweep --dtypes float32 --no-backward --json f32.json
    python -m torch_tpu.tools.opdb_sweep --ops add,nn.functional.gelu --dtypes float32
    python -m torch_tpu.tools.opdb_sweep --json opdb.json --resume   # skip what the file has
    python -m torch_tpu.tools.opdb_sweep --json opdb.json --resume --retry-fallbacks  # after new rules
    python -m torch_tpu.tools.opdb_sweep --summary opdb.json         # print a saved run's table

For every op_db entry (name.variant) and dtype in float32, bfloat16 and
complex64 that the OpInfo supports on CPU, the first --samples sample inputs
run on CPU and on tpu (forward), and, for float32 when the OpInfo supports
autograd, the gradients of a random cotangent through every floating output
(backward). Results are compared with torch_tpu.tools.opinfo_compare's
tolerances (float32 1e-5, bfloat16 1.6e-2 / 1e-2, integers exact; a result
off CPU's that is closer than CPU's to the float64 result passes). An entry
whose CPU result depends on the RNG seed is compared as a random op: shapes
and dtypes, seeding (the same torch.manual_seed gives the same tpu result,
another seed another one) and distribution (values pooled over several
draws: a two-sample Kolmogorov-Smirnov test at alpha 0.001). Ops that return
uninitialized memory (empty*) are compared by shape and dtype.

Each (entry, dtype, direction) gets one status: pass (every checked sample
equal), fail (a wrong result), error (tpu raised where CPU worked, or the
worker crashed or timed out on it), skip (no sample CPU accepts) or sparse
(sparse layouts: counted apart). native: no CPU fallback ran during its tpu
calls (torch_tpu.debug.stats()['fallbacks']). Entries run in worker
subprocesses, a new one after a crash, a timeout (--timeout seconds per
entry) or every --chunk entries; --json FILE is rewritten after each entry,
so --resume continues an interrupted run.
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import time
from typing import Any

DTYPES = ("float32", "bfloat16", "complex64")
_PROTO = "@@opdb "  # prefix of the worker's protocol lines on stdout


# --------------------------------------------------------------------------- tasks

def _op_db() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def _tasks(ops: set[str] | None, dtypes: list[str], backward: bool,
           backward_dtypes: list[str]) -> list[list[str]]:
    """[entry id, dtype, "forward" | "backward"] for every op_db entry with samples in dtype."""
    import torch

    from .opinfo_compare import op_id
    tasks = []
    for op in _op_db():
        name = op_id(op)
        if ops and name not in ops and op.name not in ops:
            continue
        fwd = op.supported_dtypes("cpu")
        bwd = op.supported_backward_dtypes("cpu") if op.supports_autograd else set()
        for d in dtypes:
            if getattr(torch, d) in fwd:
                tasks.append([name, d, "forward"])
        for d in backward_dtypes if backward else ():
            if getattr(torch, d) in bwd:
                tasks.append([name, d, "backward"])
    return tasks


def _key(task: list[str]) -> str:
    return ":".join(task)


# --------------------------------------------------------------------------- parent

def _start_worker(tasks: list[list[str]], args: argparse.Namespace) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch_tpu.tools.opdb_sweep", "--worker",
           "--samples", str(args.samples)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(args.log, "ab") if args.log else subprocess.DEVNULL,
                            text=True, bufsize=1)
    proc.stdin.write(json.dumps(tasks))
    proc.stdin.close()
    return proc


def _read_line(proc: subprocess.Popen, deadline: float) -> str | None:
    """The worker's next protocol line, or None at EOF or past the deadline."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(timeout=left):
                return None
            line = proc.stdout.readline()
            if not line:
                return None
            if line.startswith(_PROTO):
                return line[len(_PROTO):].strip()
    finally:
        sel.close()


def _run_chunk(chunk: list[list[str]], args: argparse.Namespace, record) -> list[list[str]]:
    """Runs tasks in one worker until it ends; returns those it did not finish
    (the one it crashed or timed out on is recorded as an error)."""
    proc = _start_worker(chunk, args)
    left = list(chunk)
    current = None
    started = time.monotonic()
    try:
        while left:
            line = _read_line(proc, (started + args.timeout) if current else time.monotonic() + 600)
            if line is None:
                break
            kind, _, payload = line.partition(" ")
            if kind == "start":
                current, started = payload, time.monotonic()
            elif kind == "result":
                r = json.loads(payload)
                record(r)
                left = [t for t in left if _key(t) != r["key"]]
                current = None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if left and current is not None:
        timed_out = time.monotonic() - started >= args.timeout
        why = f"timeout after {args.timeout:.0f} s" if timed_out else f"worker crashed (exit {proc.returncode})"
        op, dname, direction = current.split(":")
        record({"key": current, "op": op, "dtype": dname, "dir": direction, "status": "error",
                "native": False, "why": why, "fallback_ops": [], "checked": 0, "passed": 0})
        left = [t for t in left if _key(t) != current]
    elif left:  # died before starting a task (import failure): give up on this chunk
        raise SystemExit(f"opdb_sweep: worker exited ({proc.returncode}) before running {_key(left[0])}; "
                         f"see --log")
    return left


def _sweep(tasks: list[list[str]], results: dict[str, dict], args: argparse.Namespace) -> None:
    done = [0]
    t0 = time.monotonic()

    def record(r: dict) -> None:
        results[r["key"]] = r
        done[0] += 1
        if args.json:
            _save(args.json, results)
        if not args.quiet:
            mark = "native" if r["native"] else "fallback"
            print(f"[{done[0]}/{len(tasks)} {time.monotonic() - t0:6.0f}s] {r['key']:<58} "
                  f"{r['status']:<6} {mark:<8} {r.get('why', '')[:70]}", flush=True)

    pending = list(tasks)
    while pending:
        chunk, rest = pending[:args.chunk], pending[args.chunk:]
        pending = _run_chunk(chunk, args, record) + rest


def _save(path: str, results: dict[str, dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"results": results}, f, indent=0, sort_keys=True)
    os.replace(tmp, path)


def _load(path: str) -> dict[str, dict]:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)["results"]


# --------------------------------------------------------------------------- summary

def summarize(results: dict[str, dict]) -> list[dict]:
    """One row per (direction, dtype): counts and percentages of entries."""
    rows = {}
    for r in results.values():
        row = rows.setdefault((r["dir"], r["dtype"]), {
            "dir": r["dir"], "dtype": r["dtype"], "entries": 0, "pass": 0, "native": 0,
            "fail": 0, "error": 0, "skip": 0, "sparse": 0})
        if r["status"] in ("skip", "sparse"):
            row[r["status"]] += 1
            continue
        row["entries"] += 1
        row[r["status"]] += 1
        row["native"] += r["status"] == "pass" and r["native"]
    out = []
    for key in sorted(rows, key=lambda k: (k[0] != "forward", DTYPES.index(k[1]) if k[1] in DTYPES else 9)):
        row = rows[key]
        n = max(row["entries"], 1)
        row["pass_pct"] = round(100.0 * row["pass"] / n, 1)
        row["native_pct"] = round(100.0 * row["native"] / n, 1)
        out.append(row)
    return out


def format_summary(results: dict[str, dict], top: int = 25) -> str:
    lines = [f"{'direction':<9} {'dtype':<9} {'entries':>7} {'pass':>5} {'pass%':>6} {'native':>6} "
             f"{'native%':>7} {'fail':>5} {'error':>5} {'skip':>5} {'sparse':>6}"]
    for r in summarize(results):
        lines.append(f"{r['dir']:<9} {r['dtype']:<9} {r['entries']:>7} {r['pass']:>5} {r['pass_pct']:>6} "
                     f"{r['native']:>6} {r['native_pct']:>7} {r['fail']:>5} {r['error']:>5} "
                     f"{r['skip']:>5} {r['sparse']:>6}")
    by_fallback: dict[str, int] = {}
    for r in results.values():
        for f in r.get("fallback_ops", []):
            by_fallback[f] = by_fallback.get(f, 0) + 1
    if by_fallback:
        lines.append("")
        lines.append("fallback ops by number of (entry, dtype, direction) rows using them:")
        for f, n in sorted(by_fallback.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {n:>4}  {f}")
    return "\n".join(lines)


def format_failures(results: dict[str, dict]) -> str:
    bad = [r for r in results.values() if r["status"] in ("fail", "error")]
    return "\n".join(f"{r['key']:<58} {r['status']:<6} {r.get('why', '')}"
                     for r in sorted(bad, key=lambda r: r["key"]))


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_tpu.tools.opdb_sweep",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", help="comma-separated op_db names or name.variant ids (default: all)")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="forward dtypes (default: %(default)s)")
    p.add_argument("--no-forward", action="store_true", help="skip the forward sweep")
    p.add_argument("--no-backward", action="store_true", help="skip the backward sweep")
    p.add_argument("--backward-dtypes", default="float32", help="backward dtypes (default: %(default)s)")
    p.add_argument("--samples", type=int, default=4, help="samples per entry (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per entry (default: %(default)s)")
    p.add_argument("--chunk", type=int, default=200, help="entries per worker process (default: %(default)s)")
    p.add_argument("--json", help="write the results here (rewritten after each entry)")
    p.add_argument("--resume", action="store_true", help="skip the entries --json already has")
    p.add_argument("--retry-failed", action="store_true", help="with --resume: rerun fail/error entries")
    p.add_argument("--retry-fallbacks", action="store_true",
                   help="with --resume: also rerun entries that passed through the CPU fallback")
    p.add_argument("--log", help="append the workers' stderr to this file (default: discarded)")
    p.add_argument("--failures", action="store_true", help="list failing entries at the end")
    p.add_argument("--summary", metavar="FILE", help="print the table of a saved --json run and exit")
    p.add_argument("--quiet", action="store_true", help="no line per entry")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        from ._opdb_worker import worker_main
        return worker_main(args.samples)
    if args.summary:
        results = _load(args.summary)
        print(format_summary(results))
        if args.failures:
            print(format_failures(results))
        return 0
    ops = set(args.ops.split(",")) if args.ops else None
    dtypes = [] if args.no_forward else [d for d in args.dtypes.split(",") if d]
    tasks = _tasks(ops, dtypes, not args.no_backward, args.backward_dtypes.split(","))
    if ops and not tasks:
        p.error(f"no op_db entry (with samples in {dtypes}) named {sorted(ops)}")
    results = _load(args.json) if args.json and args.resume else {}
    redo = {"fail", "error"} if args.retry_failed or args.retry_fallbacks else set()

    def rerun(r: dict) -> bool:
        return r["status"] in redo or (args.retry_fallbacks and r["status"] == "pass" and not r["native"])
    tasks = [t for t in tasks if _key(t) not in results or rerun(results[_key(t)])]
    _sweep(tasks, results, args)
    print(format_summary({k: r for k, r in results.items()}))
    if args.failures:
        print(format_failures(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
