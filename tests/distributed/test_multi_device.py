"""Several tpu devices in one process (TORCH_TPU_CPU_DEVICES=2): tensors on
tpu:1 live in PJRT buffers of device 1, and ops on them run there.

Runs in a subprocess: the pytest process may already have created its PJRT
client with one device.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CODE = r"""
import torch
import torch_tpu
from torch_tpu import _C

assert torch.tpu.device_count() == 2
torch_tpu.debug.reset_stats()
x = torch.arange(12.0).reshape(3, 4)
a = x.to("tpu:1")
assert a.device == torch.device("tpu", 1) and _C._buffer_device(a) == 1
b = (a @ a.T).relu() + 1                      # ops on tpu:1 run on device 1
assert b.device == torch.device("tpu", 1) and _C._buffer_device(b) == 1
torch.testing.assert_close(b.cpu(), (x @ x.T).relu() + 1)

c = torch.ones(3, device="tpu:0")
assert _C._buffer_device(c) == 0
d = c.to("tpu:1")                             # cross-device copy tpu:0 -> tpu:1
assert d.device.index == 1 and _C._buffer_device(d) == 1
e = b[:, :3].to("tpu:0")                      # a view, tpu:1 -> tpu:0
assert _C._buffer_device(e) == 0
torch.testing.assert_close(e.cpu(), b.cpu()[:, :3])
z = torch.empty(3, device="tpu:1")
z.copy_(c)                                    # copy_ across devices
assert _C._buffer_device(z) == 1 and z.cpu().tolist() == [1.0, 1.0, 1.0]

torch.tpu.set_device(1)                       # "tpu" now means tpu:1
assert torch.tpu.current_device() == 1
f = torch.randn(4, 4, device="tpu")
assert f.device == torch.device("tpu", 1) and _C._buffer_device(f) == 1
g = torch.nn.functional.softmax(f, dim=-1).sum(-1)
assert _C._buffer_device(g) == 1
torch.testing.assert_close(g.cpu(), torch.ones(4))
with torch.tpu.device(0):
    h = torch.zeros(2, device="tpu") + 5
    assert h.device.index == 0 and _C._buffer_device(h) == 0
assert torch.tpu.current_device() == 1

m = torch.nn.Linear(4, 2).to("tpu:1")         # modules, autograd, optimizers on tpu:1
opt = torch.optim.SGD(m.parameters(), lr=0.1)
m(torch.randn(3, 4, device="tpu:1")).sum().backward()
opt.step()
assert all(_C._buffer_device(p) == 1 and _C._buffer_device(p.grad) == 1 for p in m.parameters())
try:
    a + c
except RuntimeError as err:
    assert "same device" in str(err)
else:
    raise AssertionError("tpu:1 + tpu:0 did not raise")
pinned = torch.randn(6).pin_memory()           # host memory for async uploads (DDP asserts it)
assert pinned.is_pinned() and not torch.randn(2).is_pinned()
assert torch.empty(3, pin_memory=True).is_pinned()
torch.testing.assert_close(pinned.to("tpu:1", non_blocking=True).cpu(), pinned)
torch.tpu.synchronize(1)
assert not torch_tpu.debug.stats()["fallbacks"], torch_tpu.debug.stats()["fallbacks"]
print("ok")
"""


def test_two_devices_in_one_process():
    env = dict(os.environ, TORCH_TPU_CPU_DEVICES="2")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], capture_output=True,
                       text=True, timeout=180, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
