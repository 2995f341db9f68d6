"""torch.compile(backend="tpu") with a dynamic sequence dim against exact shapes: modules
built per prompt length and warm call times.

For a small attention block (its sequence dim torch._dynamo.mark_dynamic), at
each length: whether the call built a module (compile.stats()), the
executables compiled during it, and the median warm call time of the
bounded-dynamic module (padded to the bucket) against the same function
compiled with dynamic=False at that exact shape.

    python benchmarks/compile_symbolic.py
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

import torch_tpu
import torch_tpu.compile as tpu_compile


def attention(x, wq, wk, wv, wo):  # noqa: ANN001, ANN201
    b, s, h = x.shape
    def heads(t):  # noqa: ANN001, ANN202
        return t.view(b, s, 4, h // 4).transpose(1, 2)
    q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
    att = ((q @ k.transpose(-1, -2)) / math.sqrt(h // 4)).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(b, s, h) @ wo
    return F.layer_norm(y + x, (h,))


def _time(fn, *args, reps: int = 60) -> float:  # noqa: ANN001
    for _ in range(3):
        fn(*args).cpu()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args).cpu()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _compiles() -> int:
    s = torch_tpu.debug.stats()
    return s["compiles"] + s.get("disk_hits", 0)


def run(name: str, fn, make, lengths) -> None:  # noqa: ANN001
    inputs = {n: make(n) for n in lengths}
    for args in inputs.values():
        torch._dynamo.mark_dynamic(args[0], 1)
    dyn = torch.compile(fn, backend="tpu")
    rows = []
    for n in lengths:  # one dynamic=True function over every length
        before_m, before_c = tpu_compile.stats()["bucket_modules"], _compiles()
        t0 = time.perf_counter()
        dyn(*inputs[n]).cpu()
        first = time.perf_counter() - t0
        rows.append([n, tpu_compile.stats()["bucket_modules"] - before_m, _compiles() - before_c, first,
                     _time(dyn, *inputs[n])])
    for row in rows:  # the same function compiled for each exact shape
        torch._dynamo.reset()
        x = inputs[row[0]][0].clone()  # no dynamic mark
        row.append(_time(torch.compile(fn, backend="tpu", dynamic=False), x, *inputs[row[0]][1:]))
    torch._dynamo.reset()
    print(f"{name}: length, modules built, executables compiled, first call ms, "
          f"warm ms bounded, warm ms exact-shape, ratio")
    for n, built, compiled, first, t_dyn, t_exact in rows:
        print(f"  {n:4d}  {built}  {compiled}  {first * 1e3:8.1f}  {t_dyn * 1e3:7.3f}  "
              f"{t_exact * 1e3:7.3f}  {t_dyn / t_exact:5.2f}x")
    s = tpu_compile.stats()
    print(f"  exact-shape graphs: {s['exact_shape_graphs']} {tpu_compile.symbolic_fallbacks()}")


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    torch_tpu.dynamic.set_mode("0")  # eager ops around the graphs: exact
    torch.manual_seed(0)
    ws = [(torch.randn(64, 64) / 8).to("tpu") for _ in range(4)]
    run("attention block [1, n, 64]", attention, lambda n: [torch.randn(1, n, 64).to("tpu")] + ws,
        (17, 18, 33, 35, 36, 65, 70, 72))


if __name__ == "__main__":
    main()
