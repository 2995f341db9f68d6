"""Repro: Diffusers' test_layerwise_casting_* fail on tpu (pass on CPU).

Cause: torch_tpu has no float8 dtypes (torch.float8_e4m3fn / float8_e5m2):
csrc/aten/device.cpp ToElementType maps only bool, int/uint, f16, bf16, f32, f64,
so storing weights in float8 (ModelMixin.enable_layerwise_casting(storage_dtype=
torch.float8_e4m3fn, ...), as the upstream tests do) raises
"dtype Float8_e4m3fn has no native tpu representation". StableHLO has f8E4M3FN and
f8E5M2; support needs the element types in the HLO builder, PJRT buffer types and
the copy/convert paths (not a numerics bug).
Exit 0 on cpu, 1 on tpu:  python repros/float8_storage_dtype_tpu.py [cpu|tpu]
"""
import sys

import torch

dev = sys.argv[1] if len(sys.argv) > 1 else "tpu"
w = torch.randn(4, 4, device=dev)
try:
    stored = w.to(torch.float8_e4m3fn)           # storage dtype
    back = stored.to(torch.float32)              # compute dtype
    ref = w.cpu().to(torch.float8_e4m3fn).to(torch.float32)
    assert torch.equal(back.cpu(), ref), "float8 round trip differs from CPU"
except Exception as e:  # noqa: BLE001
    print(f"{dev}: {type(e).__name__}: {str(e).splitlines()[0]}")
    sys.exit(1)
print(f"{dev}: ok")
