"""torch.tpu.memory_stats() uses torch.cuda.memory_stats()'s key names, with
CUDA's meanings (no caching allocator: reserved = active = allocated)."""
import torch

# Names and meanings from torch.cuda.memory_stats()'s documentation.
CUDA_KEYS = {
    "allocation.all.current", "allocation.all.allocated", "allocation.all.freed",
    *(f"{name}.all.{stat}" for name in ("allocated_bytes", "reserved_bytes", "active_bytes",
                                        "requested_bytes") for stat in ("current", "peak")),
}


def test_keys_and_meanings():
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_stats()
    assert set(before) == CUDA_KEYS and list(before) == sorted(before)
    x = torch.empty(3000, device="tpu")
    s = torch.tpu.memory_stats()
    assert s["allocated_bytes.all.current"] == before["allocated_bytes.all.current"] + 12000
    assert s["allocation.all.current"] == before["allocation.all.current"] + 1
    assert s["allocation.all.current"] == s["allocation.all.allocated"] - s["allocation.all.freed"]
    for name in ("reserved_bytes", "active_bytes", "requested_bytes"):
        assert s[f"{name}.all.current"] == s["allocated_bytes.all.current"]
    del x
    s = torch.tpu.memory_stats()
    assert s["allocated_bytes.all.peak"] == before["allocated_bytes.all.current"] + 12000
    assert torch.accelerator.max_memory_allocated() == s["allocated_bytes.all.peak"]
    assert s["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
