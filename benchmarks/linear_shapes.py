"""nn.Linear at a few row counts: F.linear(x, W) with W [32000, 1024] (an
LM head), float32, against PyTorch CPU eager in the same process and against
the same product with a contiguous [1024, 32000] weight on tpu.

On XLA:CPU a dot whose right operand is contracted along its minor dim
(`x @ W.t()`, what every nn.Linear does) went through Eigen's repacking of
the whole weight on every call; torch_tpu emits it as (W x^T)^T there
(csrc/lowering/linalg.cpp). Prints ms per call (median of 5) and ratios.

Then GPT-2's Conv1D at one row (a decode step: `addmm(b, x [1, k], W [k, n])`,
a contiguous weight), float32 and bfloat16, against CPU eager: XLA:CPU runs
one row as a naive loop, so torch_tpu emits it as the first row of two
(linalg.cpp: TwoRowDot). GPT-2 small's four shapes, in us per call.

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
    conv1d_one_row()


CONV1D = ((768, 2304), (768, 768), (768, 3072), (3072, 768))  # GPT-2 small: c_attn, attn c_proj, c_fc, mlp c_proj


@torch.no_grad()
def conv1d_one_row():
    print("\naddmm(b, x [1, k], W [k, n]) (GPT-2's Conv1D at a decode step); us per call (a .cpu() included)")
    print(f"{'dtype':>9} {'k x n':>11} {'tpu':>8} {'CPU eager':>10} {'tpu/CPU':>8} {'max err':>8}")
    for dtype in (torch.float32, torch.bfloat16):
        for k, n in CONV1D:
            x, w, b = torch.randn(1, k).to(dtype), torch.randn(k, n).to(dtype), torch.randn(n).to(dtype)
            # a model's weights: parameters, which never turn dynamic (a plain tensor's
            # signature would go bounded-dynamic across these shapes)
            dx, dw, db = x.to("tpu"), torch.nn.Parameter(w.to("tpu")), torch.nn.Parameter(b.to("tpu"))
            tpu = median_ms(lambda: torch.addmm(db, dx, dw).cpu(), repeats=9) * 1000
            cpu = median_ms(lambda: torch.addmm(b, x, w), repeats=9) * 1000
            err = (torch.addmm(db, dx, dw).cpu().float() - torch.addmm(b, x, w).float()).abs().max().item()
            print(f"{str(dtype)[6:]:>9} {f'{k}x{n}':>11} {tpu:>8.0f} {cpu:>10.0f} {tpu / cpu:>7.2f}x {err:>8.1e}")


if __name__ == "__main__":
    main()
