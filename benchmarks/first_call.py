"""First-call wall time of a 40-op model whose every op is new (so every op
compiles), with the compiles on the dispatching thread
(TORCH_TPU_COMPILE_THREADS=0) and on a pool of 1 and 2 background threads
(runtime/compile_pool.h: Python keeps dispatching while XLA compiles), next
to PyTorch CPU eager running the same call.

Each configuration runs in a fresh process with the disk cache off
(TORCH_TPU_CACHE_DIR=""), so nothing comes from an earlier run, and the
compile-burst log off; the time is
from the first op to the result on the host (`.cpu()`), for CPU eager too
(its first call in a fresh process). `--runs N` repeats
each configuration N times (fresh processes, interleaved) and reports the
median.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def model(x, torch):
    """40 distinct ops (distinct op or shape each: every one is a new signature)."""
    y = x.sin()
    y = y.cos() + x
    y = (y * 1.5).tanh()
    y = y.exp().log1p()
    y = y.sqrt().sigmoid()
    y = y.abs().neg()
    y = y.clamp(-0.7, 0.3)
    z = y @ x.t()
    z = z.softmax(-1).cumsum(0)
    z = z.sum(0, keepdim=True) - z
    z = z.amax(1)
    w = z.reshape(8, 8).transpose(0, 1).contiguous()
    w = torch.cat([w, w * 2], 0)
    w = w.pow(2).mean(1)
    t = x.erf().atan2(x + 2)
    t = t.remainder(3.0).max(1).values
    t = t.sort().values.flip(0)
    t = t.square().rsqrt()
    t = torch.where(t > 0.5, t, -t)
    k = torch.nn.functional.silu(torch.nn.functional.gelu(x)).relu()
    k = k[:, :16].mean(0)
    out = w.sum() + t.sum() + k.sum() + t.norm()
    return out


def child():
    import torch
    import torch_tpu  # noqa: F401

    device = sys.argv[sys.argv.index("--_child") + 1]
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    if device == "tpu":
        x = x.to("tpu")
        torch.tpu.synchronize()
        torch_tpu.debug.reset_stats()
    cpu0 = time.process_time()
    t = time.perf_counter()
    out = model(x, torch)
    dispatched = time.perf_counter() - t  # every op has returned (results may be queued)
    value = out.cpu().item()
    seconds = time.perf_counter() - t
    cpu_seconds = time.process_time() - cpu0
    stats = torch_tpu.debug.stats() if device == "tpu" else {}
    print("RESULT " + json.dumps({"seconds": seconds, "dispatch": dispatched,
                                  "cpu": cpu_seconds, "value": value,
                                  "compiles": stats.get("compiles", 0),
                                  "compile_seconds": stats.get("compile_seconds", 0.0)}),
          flush=True)


def run_child(device, threads):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR="", TORCH_TPU_COMPILE_LOG_SECONDS="0")
    if threads is not None:
        env["TORCH_TPU_COMPILE_THREADS"] = str(threads)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", device],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("the child failed:\n" + proc.stderr[-4000:])
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per configuration")
    args = ap.parse_args()
    configs = [("cpu", None), ("tpu", 0), ("tpu", 1), ("tpu", 2)]
    samples = {c: [] for c in configs}
    for _ in range(args.runs):
        for c in configs:
            samples[c].append(run_child(*c))
    cpu = statistics.median(s["seconds"] for s in samples[("cpu", None)])
    base = statistics.median(s["seconds"] for s in samples[("tpu", 0)])
    ref = samples[("cpu", None)][0]["value"]
    print(f"40-op model, first call (median of {args.runs} fresh processes, disk cache off)")
    print(f"{'configuration':<28}{'first call ms':>14}{'/ CPU':>9}{'/ 0 threads':>13}"
          f"{'dispatch ms':>13}{'process CPU ms':>16}{'compiles':>10}{'compile ms':>12}")
    for c in configs:
        med = statistics.median(s["seconds"] for s in samples[c])
        name = "PyTorch CPU eager" if c[0] == "cpu" else f"tpu, COMPILE_THREADS={c[1]}"
        comp = samples[c][0]["compiles"]
        comp_ms = statistics.median(s["compile_seconds"] for s in samples[c]) * 1e3
        disp = statistics.median(s["dispatch"] for s in samples[c]) * 1e3
        proc_cpu = statistics.median(s["cpu"] for s in samples[c]) * 1e3
        print(f"{name:<28}{med * 1e3:>14.1f}{med / cpu:>9.1f}{med / base:>13.2f}{disp:>13.1f}"
              f"{proc_cpu:>16.1f}{comp:>10}{comp_ms:>12.1f}")
        for s in samples[c]:
            if abs(s["value"] - ref) > 1e-3 * max(1.0, abs(ref)):
                raise SystemExit(f"{name}: value {s['value']} differs from CPU's {ref}")
    print(f"(load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          "'dispatch': until the model's last op returned; 'compile ms': summed over compiles)")


if __name__ == "__main__":
    if "--_child" in sys.argv:
        child()
    else:
        main()
