"""Repro: Diffusers' test_pipeline_with_accelerator_device_map fails on tpu with the
v0.40.0 source tree's diffusers (passes on CPU, and on tpu with diffusers 0.42.1).

Cause: diffusers <= 0.40 detects the accelerator with a fixed list
(diffusers.utils.torch_utils.get_device(): cuda, npu, xpu, mps, mlu, neuron, else cpu),
so for a PrivateUse1 device SUPPORTED_DEVICE_MAP is ["balanced", "cpu", "cpu"] and
DiffusionPipeline.from_pretrained(..., device_map="tpu") raises
"NotImplementedError: tpu not supported". Diffusers 0.42.1 asks torch.accelerator
(TorchDeviceBackend._detect_device_type), which answers "tpu". Not a torch_tpu bug.
Exit 0 on cpu, 1 on tpu with the v0.40.0 tree:
  PYTHONPATH=/tmp/diffusers-src/src python repros/diffusers_device_map_get_device.py [cpu|tpu]
"""
import sys

import torch  # noqa: F401  (autoloads torch_tpu unless TORCH_DEVICE_BACKEND_AUTOLOAD=0)
import diffusers
from diffusers.pipelines.pipeline_utils import SUPPORTED_DEVICE_MAP

dev = sys.argv[1] if len(sys.argv) > 1 else "tpu"
if dev not in SUPPORTED_DEVICE_MAP:
    print(f"{dev}: diffusers {diffusers.__version__}: device_map={dev!r} not supported; "
          f"SUPPORTED_DEVICE_MAP={SUPPORTED_DEVICE_MAP}")
    sys.exit(1)
print(f"{dev}: ok (diffusers {diffusers.__version__}, SUPPORTED_DEVICE_MAP={SUPPORTED_DEVICE_MAP})")
