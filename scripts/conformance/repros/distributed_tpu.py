"""Repro: test_fsdp2_* (skipped on tpu) and test_tp_* (fail on tpu) pass on CPU.

Cause: these tests start 2 processes, one accelerator device each, and a
torch.distributed process group on that device type. On CPU they get gloo and
os.cpu_count() "devices". torch_tpu has 1 device per process by default
(TORCH_TPU_CPU_DEVICES=N gives N XLA:CPU devices) and no torch.distributed
backend for "tpu" tensors yet, so set_device(1) fails and gloo rejects tpu
tensors. Exit 0 on cpu, 1 on tpu:  python repros/distributed_tpu.py [cpu|tpu]
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist

dev = sys.argv[1] if len(sys.argv) > 1 else "tpu"
init = "file://" + os.path.join(tempfile.mkdtemp(), "pg")
dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
try:
    t = torch.ones(4, device=dev)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.ones(4))
except Exception as e:  # noqa: BLE001
    print(f"{dev}: {type(e).__name__}: {str(e).splitlines()[0]}")
    sys.exit(1)
finally:
    dist.destroy_process_group()
print(f"{dev}: ok")
