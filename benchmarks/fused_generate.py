"""Fused eager against strict eager, warm: is recording a chain cheaper than
the dispatches it saves?

1. A repeat greedy ``generate()`` of a tiny Llama (2 layers, hidden 64,
   eager attention, DynamicCache, 8 new tokens after a 35-token prompt):
   PyTorch CPU eager (1 thread), torch_tpu strict eager and fused eager
   (``torch_tpu.fused()``), timed in round-robin rounds after warm-up calls
   (nothing compiles inside the timed rounds); tokens must be equal.
2. Per op: a chain of 600 elementwise ops on 4x4 tensors (the work is
   nothing, the cost is the host's), strict vs fused vs CPU eager.

    python benchmarks/fused_generate.py [--rounds 15]

Prints medians and the ratios fused/strict and each/CPU eager.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import torch_tpu
from torch_tpu import debug

from _tiny_llama import greedy_pair


def rounds(fns: dict, n: int) -> dict:
    """Median seconds of each function over `n` round-robin rounds."""
    times = {k: [] for k in fns}
    for _ in range(n):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def generate_case(n: int) -> None:
    cpu, dev = greedy_pair(attn_implementation="eager")
    ids = torch.randint(2, 256, (1, 35), generator=torch.Generator().manual_seed(1))
    dev_ids = ids.to("tpu")

    def gen(model, x, fused=False):
        mode = torch_tpu.fused() if fused else contextlib.nullcontext()
        with torch.no_grad(), mode:
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False)
            return out.cpu()

    expected = gen(cpu, ids)
    fns = {"CPU eager": lambda: gen(cpu, ids), "strict eager": lambda: gen(dev, dev_ids),
           "fused eager": lambda: gen(dev, dev_ids, True)}
    for k, fn in fns.items():
        for _ in range(3):
            got = fn()
        assert torch.equal(got, expected), f"{k}: tokens differ from CPU eager's"
    debug.reset_stats()
    t = rounds(fns, n)
    assert debug.stats()["compiles"] == 0, "a compile landed inside the timed rounds"
    print("tiny Llama, warm greedy generate() of 8 tokens (median of", n, "rounds)")
    for k, v in t.items():
        print(f"  {k:13s}: {v * 1e3:7.1f} ms  ({v / t['CPU eager']:.2f}x CPU eager)")
    print(f"  fused / strict: {t['fused eager'] / t['strict eager']:.2f}")


def per_op_case(n: int) -> None:
    def chain(x, w):
        for _ in range(200):
            x = (x * 0.5 + w).relu()
        return x

    x, w = torch.randn(4, 4), torch.randn(4)
    dx, dw = x.to("tpu"), w.to("tpu")

    def tpu(fused):
        with torch_tpu.fused() if fused else contextlib.nullcontext():
            return chain(dx, dw).cpu()

    fns = {"CPU eager": lambda: chain(x, w), "strict eager": lambda: tpu(False), "fused eager": lambda: tpu(True)}
    for fn in fns.values():
        for _ in range(3):
            fn()
    torch.testing.assert_close(tpu(True), chain(x, w))
    t = rounds(fns, n)
    print("per op: 600 elementwise ops on 4x4 tensors, then .cpu() (median of", n, "rounds)")
    for k, v in t.items():
        print(f"  {k:13s}: {v / 600 * 1e6:6.2f} us/op  ({v / t['CPU eager']:.2f}x CPU eager)")
    print(f"  fused / strict: {t['fused eager'] / t['strict eager']:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(1)
    generate_case(args.rounds)
    per_op_case(args.rounds)


if __name__ == "__main__":
    main()
