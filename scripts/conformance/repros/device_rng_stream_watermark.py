"""Repro: LogitsProcessorTest::test_watermarking_processor and
::test_synthidtext_watermark_processor_bias_uniformity_across_vocab_{0,1} fail on tpu.

Cause: not a bug. Both tests hard-code results of CPU's random stream. The watermark
processors draw from a seeded torch.Generator ON THE DEVICE (randperm for the green list,
randint for SynthID's 2**16-entry sampling table); tpu's generator is a different, unbiased
stream (threefry), so the green-list id (the test already special-cases xpu: 3 instead of 1)
and the exact fraction of ones in the seed-0 table differ. The table mean on tpu is 0.4963,
1.9 sigma from 0.5 for 65536 fair bits; the test allows 0.001 (0.5 sigma): it only passes
for a lucky table. Same checks, exit 0 on cpu and 1 on tpu:
    python repros/device_rng_stream_watermark.py [cpu|tpu]
"""
import sys

import torch
from transformers.generation.logits_process import WatermarkLogitsProcessor

dev = sys.argv[1] if len(sys.argv) > 1 else "tpu"
if dev == "tpu":
    import torch_tpu  # noqa: F401

# test_watermarking_processor: which token gets the green-list bias after token 10.
wm = WatermarkLogitsProcessor(vocab_size=20, device=dev)
ids = torch.full((1, 5), 10, device=dev)
scores = torch.zeros(1, 20, device=dev)
out = wm(input_ids=ids, scores=scores.clone())
green_ok = bool((out[0, 1] == wm.bias).item())  # the test expects id 1 (CPU's stream)

# SynthID: mean of the seed-0 sampling table (torch.randint(0, 2, (2**16,)) on the device).
g = torch.Generator(device=dev).manual_seed(0)
table_mean = torch.randint(0, 2, (2**16,), generator=g, device=dev).float().mean().item()
table_ok = abs(table_mean - 0.5) <= 0.001

print(f"{dev}: green-list id 1 biased: {green_ok}; seed-0 table mean {table_mean:.4f} "
      f"(test needs |mean - 0.5| <= 0.001: {table_ok})")
sys.exit(0 if green_ok and table_ok else 1)
