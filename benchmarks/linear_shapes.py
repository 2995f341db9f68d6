"""nn.Linear at a few row counts: F.linear(x, W) with W [32000, 1024] (an
LM head), float32, against PyTorch CPU eager in the same process and against
the same product with a contiguous [1024, 32000] weight on tpu.

On XLA:CPU a dot whose right operand is contracted along its minor dim
(`x @ W.t()`, what every nn.Linear does) went through Eigen's repacking of
the whole weight on every call; torch_tpu emits it as (W x^T)^T there
(csrc/lowering/linalg.cpp). Prints ms per call (median of 5) and ratios.

    python benchmarks/linear_shapes.py
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401  (registers the tpu device)

ROWS = (1, 2, 3, 4, 8, 16, 34)


def median_ms(fn, repeats=5):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1000


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = torch.randn(32000, 1024)
    w_tpu, wt_tpu = w.to("tpu"), w.t().contiguous().to("tpu")
    print("F.linear(x [m, 1024], W [32000, 1024]), float32; ms per call (a .cpu() of the result included)")
    print(f"{'m':>3} {'tpu linear':>11} {'tpu x@Wt':>9} {'CPU eager':>10} {'linear/CPU':>11} {'max err':>8}")
    for m in ROWS:
        x = torch.randn(m, 1024)
        x_tpu = x.to("tpu")
        linear = median_ms(lambda: F.linear(x_tpu, w_tpu).cpu())
        contiguous = median_ms(lambda: (x_tpu @ wt_tpu).cpu())
        cpu = median_ms(lambda: F.linear(x, w))
        err = (F.linear(x_tpu, w_tpu).cpu() - F.linear(x, w)).abs().max().item()
        print(f"{m:>3} {linear:>11.1f} {contiguous:>9.1f} {cpu:>10.1f} {linear / cpu:>10.2f}x {err:>8.1e}")


if __name__ == "__main__":
    main()
