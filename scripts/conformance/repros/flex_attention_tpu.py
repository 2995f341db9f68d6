"""Repro: test_flex_attention_with_grads fails on tpu (passes or is skipped on CPU).

Cause: PyTorch's FlexAttention accepts only CUDA, CPU, HPU and MPS tensors
(torch/nn/attention/flex_attention.py validates the device); under Transformers'
compiled path the call reaches Inductor's Pallas code generator for a "tpu" device,
which imports Google TorchTPU's private `torch_tpu._internal.pallas` module. Not a
torch_tpu numerics bug: FlexAttention on a PrivateUse1 device needs PyTorch support
(or a flex_attention higher-order-op lowering of our own).
Exit 0 on cpu, 1 on tpu:  python repros/flex_attention_tpu.py [cpu|tpu]
"""
import sys

import torch
from torch.nn.attention.flex_attention import flex_attention

dev = sys.argv[1] if len(sys.argv) > 1 else "tpu"
q, k, v = (torch.randn(1, 2, 16, 8, device=dev) for _ in range(3))
try:
    torch.compile(flex_attention)(q, k, v, score_mod=lambda s, b, h, i, j: torch.where(i >= j, s, -1e9))
except Exception as e:  # noqa: BLE001
    print(f"{dev}: {type(e).__name__}: {str(e).splitlines()[0]}")
    sys.exit(1)
print(f"{dev}: ok")
