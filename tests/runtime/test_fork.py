"""fork() after the parent used the device: the child gets a clear error at
once (as a CUDA child does) instead of hanging on the plugin's missing
threads; the parent and DataLoader workers keep working."""
import os
import subprocess
import sys
import textwrap

import torch

# Each scenario runs in a fresh interpreter: the parent's own state (and the
# test runner's threads) stay out of the fork.
CHILD_TOUCHES_TPU = textwrap.dedent("""
    import os, sys, time
    import torch
    x = torch.ones(4, device="tpu")
    assert (x + 1).sum().item() == 8.0          # the parent used the device
    start = time.time()
    pid = os.fork()
    if pid == 0:
        try:
            (x * 2).cpu()
            os._exit(3)                         # must not succeed
        except RuntimeError as e:
            ok = "forked subprocess" in str(e) and "spawn" in str(e)
            os._exit(0 if ok else 4)
        os._exit(5)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), "seconds", round(time.time() - start, 1))
    print("parent", (x + 2).sum().item())       # the parent still works
""")

DATALOADER = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    w = torch.randn(3, 2, device="tpu")
    (w * 2).cpu()                               # the device is initialized before the fork
    data = TensorDataset(torch.arange(24, dtype=torch.float32).reshape(8, 3))
    total = 0.0
    for (batch,) in DataLoader(data, batch_size=2, num_workers=2, pin_memory=True):
        assert batch.is_pinned()
        total += (batch.to("tpu") @ w).sum().item()
    expected = (torch.arange(24, dtype=torch.float32).reshape(8, 3) @ w.cpu()).sum().item()
    print("total", abs(total - expected) < 1e-3)
""")


def run(code: str) -> str:
    env = dict(os.environ, TORCH_TPU_CACHE_DIR="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_forked_child_gets_a_clear_error_at_once():
    out = run(CHILD_TOUCHES_TPU)
    child = out.split("child ")[1].split()
    assert child[0] == "0", out  # RuntimeError naming fork and spawn
    assert float(child[2]) < 30, out  # at once, not a hang
    assert "parent 12.0" in out


def test_dataloader_workers_with_pinned_memory_still_work():
    assert "total True" in run(DATALOADER)


def test_not_in_bad_fork_in_the_parent():
    assert torch.tpu._is_in_bad_fork() is False
