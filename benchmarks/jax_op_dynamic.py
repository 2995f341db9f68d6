"""A decode loop whose jax_op attention reads a KV cache growing by one token
per step: compiles and ms/step with exact shapes (TORCH_TPU_DYNAMIC_SHAPES=0:
one export and compile per step) against bounded dynamic dims (auto: one
compile per size bucket), in one run, each from a cold in-memory cache.

Run: python3 benchmarks/jax_op_dynamic.py [--steps 64] [--start 8]
(the disk cache is off here, so that every compile is counted).
"""
from __future__ import annotations

import argparse
import os
import time

os.environ["TORCH_TPU_CACHE_DIR"] = ""  # count compiles, not disk loads

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import torch_tpu  # noqa: E402
from torch_tpu.pallas import jax_op  # noqa: E402


def _attention(q, k, v):  # noqa: ANN001, ANN202
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


def _op(name: str):  # noqa: ANN202  (a fresh op per mode: nothing shared)
    def attn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return _attention(q, k, v)
    return jax_op(f"bench_jax_dyn::{name}", attn)


def decode(attn, steps: int, start: int, heads: int, dim: int) -> tuple:  # noqa: ANN001
    """Runs the loop; returns ((jax_op compiles, all compiles), ms per step, last output)."""
    torch_tpu.debug.clear_cache()
    torch_tpu.dynamic.forget_sizes()
    torch_tpu.debug.reset_stats()
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, heads, start, dim, generator=g).to("tpu")
    v = torch.randn(1, heads, start, dim, generator=g).to("tpu")
    q = torch.randn(1, heads, 1, dim, generator=g).to("tpu")
    t0 = time.perf_counter()
    out = None
    for _ in range(steps):
        out = attn(q, k, v)
        k = torch.cat([k, out], dim=2)  # the cache grows by one token per step
        v = torch.cat([v, out * 0.5], dim=2)
        q = out
    out = out.cpu()
    ms = (time.perf_counter() - t0) * 1e3 / steps
    s = torch_tpu.debug.stats()
    # compiles_by_op counts strict eager's ops (and jax_op's bounded compiles);
    # the rest of the loop's compiles are jax_op's.
    others = sum(n for op, n in s["compiles_by_op"].items() if op != "jax_op")
    return (s["compiles"] - others, s["compiles"]), ms, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--start", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    a = ap.parse_args()
    with torch_tpu.dynamic.dynamic_shapes("0"):
        c0, ms0, out0 = decode(_op("exact"), a.steps, a.start, a.heads, a.dim)
    with torch_tpu.dynamic.dynamic_shapes("auto"):
        c1, ms1, out1 = decode(_op("dynamic"), a.steps, a.start, a.heads, a.dim)
    diff = (out0 - out1).abs().max().item()
    print(f"decode {a.steps} steps, KV cache {a.start}..{a.start + a.steps}, {a.heads} heads x {a.dim}")
    for name, (jc, total), ms in (("exact shapes   ", c0, ms0), ("bounded dynamic", c1, ms1)):
        print(f"  {name}  jax_op compiles {jc:4d} (loop {total:4d})   {ms:8.1f} ms/step")
    print(f"  ratio            jax_op compiles {c0[0] / max(c1[0], 1):.1f}x fewer, "
          f"{ms0 / ms1:.2f}x faster per step; max |exact - dynamic| = {diff:.2e}")


if __name__ == "__main__":
    main()
