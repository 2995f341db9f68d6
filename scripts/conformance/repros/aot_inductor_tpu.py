"""Repro: Diffusers' test_compile_works_with_aot fails on tpu (an accelerator-only test,
skipped on CPU by the upstream suite; the same call works on CPU).

Cause: the test AOT-compiles with Inductor (torch._inductor.aoti_compile_and_package),
and Inductor has no code generator for a PrivateUse1 "tpu" device
("InductorError: AssertionError: Device tpu not supported"). torch_tpu's compile path
is the "tpu" TorchDynamo backend (torch.compile(backend="tpu")); AOTInductor packages
are CUDA/CPU/XPU artifacts. Not a numerics bug.
Exit 0 on cpu (needs a C++ compiler), 1 on tpu:  python repros/aot_inductor_tpu.py [cpu|tpu]
"""
import os
import sys
import tempfile

import torch

dev = sys.argv[1] if len(sys.argv) > 1 else "tpu"
model = torch.nn.Linear(4, 4).to(dev)
x = torch.randn(2, 4, device=dev)
try:
    with torch.no_grad():
        ep = torch.export.export(model, (x,))
        path = os.path.join(tempfile.mkdtemp(), "m.pt2")
        torch._inductor.aoti_compile_and_package(ep, package_path=path)
        out = torch._inductor.package.load_package(path)(x)
        assert torch.allclose(out.cpu(), model(x).cpu(), atol=1e-5)
except Exception as e:  # noqa: BLE001
    print(f"{dev}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    sys.exit(1)
print(f"{dev}: ok")
