"""Repro: GPT2ModelTest::test_eager_matches_sdpa_inference_0[0-7]_fp16_* fail on tpu.

The same 8 tests of every SDPA model class fail for this reason (llama, qwen3, qwen3_moe,
mistral, gemma3 text + vision2text, gpt2, bert, vit, clip vision). A "nan"/"inf" mean relative
difference in the message is not a NaN output: the test divides by |eager| + 1e-12, and 1e-12
is 0 in fp16, so exact zeros (padding positions, a few activations) give 0/0 or x/0.

Cause: not a numerics bug. Upstream's eager-vs-SDPA test (tests/test_modeling_common.py,
_test_eager_matches_sdpa_inference) looks up its tolerances by torch_device; only cpu/cuda
(and hpu/npu/xpu via cuda) have entries. Any other device, "tpu" included, gets atol=1e-7,
rtol=1e-4 for EVERY dtype, so fp16 results are compared at fp32 tolerances. CPU gets 5e-3.
This script makes the same fp16 eager-vs-SDPA comparison on both devices with the tolerance
each device gets in the test: it passes on cpu and fails on tpu, although the actual fp16
eager-vs-SDPA differences on tpu are of the same size as on CPU (printed).
Fix belongs upstream (a "tpu" row in the tolerance tables, or the cuda fallback as for hpu/npu).
"""
import sys

import torch
import torch.nn.functional as F

TOL = {"cpu": (5e-3, 5e-3), "tpu": (1e-7, 1e-4)}  # (atol, rtol) the upstream test uses for fp16


def diff(dev):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=g).half() for _ in range(3))
    q, k, v = q.to(dev), k.to(dev), v.to(dev)
    eager = ((q @ k.transpose(-1, -2)) / 8**0.5).softmax(-1) @ v
    sdpa = F.scaled_dot_product_attention(q, k, v)
    eager, sdpa = eager.float().cpu(), sdpa.float().cpu()
    atol, rtol = TOL[dev]
    return torch.allclose(sdpa, eager, atol=atol, rtol=rtol), (sdpa - eager).abs().max().item()


ok = True
for dev in ("cpu", "tpu"):
    close, mx = diff(dev)
    print(f"{dev}: allclose at the test's tolerance {TOL[dev]}: {close}; max |eager - sdpa| = {mx:.2e}")
    ok &= close
sys.exit(0 if ok else 1)
