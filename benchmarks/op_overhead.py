"""Per-op overhead of a cached eager op, and one-op compile latency.

Prints, from one run:
  - the time of `a + b` on 128x128 float32 on "tpu" (cached executable, async
    dispatch; synchronized at the end) vs PyTorch CPU eager, and their ratio;
  - of the tpu time, the launch floor: the same executable with the same
    parameters launched by the runtime alone (PJRT execute and scalar
    uploads; no dispatcher, no planning, no cache lookup), and the rest, which
    is torch_tpu's host cost per op;
  - the compile latency of a one-op module (first call of a new signature
    minus a cached call).
"""
import os
import time

# The compile latency needs real compiles: no executables from the disk cache.
os.environ.setdefault("TORCH_TPU_CACHE_DIR", "")

import torch  # noqa: E402

import torch_tpu  # noqa: E402


def per_call(fn, n: int, sync, rounds: int = 10) -> float:
    """Seconds per call: the best of `rounds` rounds of n / rounds calls (the
    minimum is the figure least moved by other load on the host)."""
    fn()
    sync()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n // rounds):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / (n // rounds))
    return best


def main() -> None:
    n = 5000
    a_cpu, b_cpu = torch.randn(128, 128), torch.randn(128, 128)
    a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
    cpu = per_call(lambda: a_cpu + b_cpu, n, lambda: None)
    compiles = torch_tpu.debug.stats()["compiles"]
    tpu = per_call(lambda: a + b, n, torch.tpu.synchronize)
    # per_call's warm-up call compiles; a compile inside the timed rounds
    # would make the figure a compile time, not a per-op cost.
    timed_compiles = torch_tpu.debug.stats()["compiles"] - compiles - 1
    if timed_compiles > 0:
        raise RuntimeError(f"op_overhead: {timed_compiles} compiles inside the timed loop")
    print(f"a + b, 128x128 float32, {n} calls, best of 10 rounds")
    print(f"  PyTorch CPU eager : {cpu * 1e6:8.1f} us/op")
    print(f"  torch_tpu (cached): {tpu * 1e6:8.1f} us/op")
    print(f"  ratio tpu/cpu     : {tpu / cpu:8.2f}x")
    floor = min(torch_tpu._C._launch_floor(lambda: a + b, n // 10) for _ in range(10))
    print(f"  of which launch floor (PJRT execute): {floor * 1e6:6.1f} us "
          f"({floor / cpu:.2f}x CPU eager)")
    print(f"  of which dispatch + plan + key + launcher: {(tpu - floor) * 1e6:6.1f} us")

    # Compile latency, with exact shapes (under the default dynamic shapes
    # the third shape would reuse the second's bounded executable and
    # compile nothing).
    with torch_tpu.dynamic.dynamic_shapes("0"):
        total, compile_s = one_op_compile_latency()
    print("one-op module (x * x), new signature, median of 5")
    print(f"  first call        : {total * 1e3:8.2f} ms")
    print(f"  of which compile  : {compile_s * 1e3:8.2f} ms")


def one_op_compile_latency() -> tuple[float, float]:
    """(first call, compile seconds) of `x * x` at a new shape, median of 5."""
    samples = []
    for k in range(5):
        x = torch.randn(64 + k, 33, device="tpu")
        torch.tpu.synchronize()
        before = torch_tpu.debug.stats()["compile_seconds"]
        start = time.perf_counter()
        (x * x).cpu()
        total = time.perf_counter() - start
        samples.append((total, torch_tpu.debug.stats()["compile_seconds"] - before))
    samples.sort()
    return samples[len(samples) // 2]


if __name__ == "__main__":
    main()
