"""A first call with a new size: compiles and wall time, exact shapes vs
bounded dynamic shapes (TORCH_TPU_DYNAMIC_SHAPES=0 and auto, each in a child
process with its own empty disk cache), next to CPU eager's time for the same
call, plus the warm call (the cost of padding at the executable boundary).

The workload is a strict-eager MLP block over a (batch, seq, hidden) tensor
(linear, gelu, linear, residual add, softmax, mean): warmed with sequence
lengths 33 and 34 (under auto the first compiles static, the second the
bucket of sizes 33..36), then timed at new lengths inside that bucket, and at
one past it (the next bucket: 37..40).

    PYTHONPATH=python python3 benchmarks/new_shapes.py

CPU eager runs with one thread (NEW_SHAPES_CPU_THREADS to change it): on a
shared machine its multi-threaded times swing by 100x.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HIDDEN, BATCH = 64, 2
WARM = (33, 34)   # the 36-bucket (dynamic.cpp: 8 buckets per octave)
NEW = (35, 36)    # new sizes inside it
PAST = (37,)      # a size past it (bucket 40)


def block(x, w1, w2):
    import torch
    import torch.nn.functional as F
    h = F.gelu(F.linear(x, w1))
    y = F.linear(h, w2) + x
    return torch.softmax(y, -1).mean(-1)


def child():
    import torch
    import torch_tpu
    from torch_tpu import debug
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("NEW_SHAPES_CPU_THREADS", "1")))  # steady CPU times
    w1, w2 = torch.randn(4 * HIDDEN, HIDDEN) / 8, torch.randn(HIDDEN, 4 * HIDDEN) / 16
    dw1, dw2 = w1.to("tpu"), w2.to("tpu")

    def tpu_call(n):
        x = torch.randn(BATCH, n, HIDDEN)
        debug.reset_stats()
        t = time.perf_counter()
        out = block(x.to("tpu"), dw1, dw2).cpu()
        dt = time.perf_counter() - t
        s = debug.stats()
        err = (out - block(x, w1, w2)).abs().max().item()
        return {"n": n, "seconds": dt, "compiles": s["compiles"], "dynamic_hits": s["dynamic_hits"],
                "max_err": err}

    def cpu_call(n):  # the median of 5 (the first call of a size included)
        x = torch.randn(BATCH, n + 100, HIDDEN)[:, :n]  # a size CPU has not run either
        times = []
        for _ in range(5):
            t = time.perf_counter()
            block(x, w1, w2)
            times.append(time.perf_counter() - t)
        return sorted(times)[2]

    for n in WARM:
        tpu_call(n)
    rows = []
    for n in NEW + PAST:
        first = tpu_call(n)
        first["warm_seconds"] = sorted(tpu_call(n)["seconds"] for _ in range(3))[1]
        first["cpu_seconds"] = cpu_call(n)
        rows.append(first)
    print(json.dumps(rows))


def main():
    if "--child" in sys.argv:
        return child()
    print(f"MLP block, batch {BATCH}, hidden {HIDDEN}; warmed at seq {WARM}; new sizes {NEW}, past {PAST}")
    print(f"{'mode':>5} {'seq':>4} {'compiles':>8} {'first s':>8} {'cpu s':>8} {'ratio':>7} {'warm s':>8} {'max err':>8}")
    for mode in ("0", "auto"):
        env = dict(os.environ, TORCH_TPU_DYNAMIC_SHAPES=mode,
                   TORCH_TPU_CACHE_DIR=tempfile.mkdtemp(prefix="new_shapes_"))
        out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]
        for r in json.loads(out):
            print(f"{mode:>5} {r['n']:>4} {r['compiles']:>8} {r['seconds']:>8.4f} {r['cpu_seconds']:>8.4f} "
                  f"{r['seconds'] / r['cpu_seconds']:>6.1f}x {r['warm_seconds']:>8.4f} {r['max_err']:>8.1e}")


if __name__ == "__main__":
    main()
