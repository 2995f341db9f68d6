"""Errors users can act on, and the device keeps working after them;
runtime scalars never recompile."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tpu


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=full_env)


def _device_works() -> None:
    x = torch.arange(4.0, device="tpu")
    assert torch.equal((x * 2 + 1).cpu(), torch.arange(4.0) * 2 + 1)


def test_bad_plugin_path_raises_and_process_survives():
    out = _run("""
        import torch
        try:
            torch.zeros(2, device="tpu")
        except RuntimeError as e:
            print("CAUGHT:", e)
        else:
            print("NO ERROR")
        print("available:", torch.tpu.is_available(), torch.tpu.device_count())
        print("cpu still works:", torch.ones(2).sum().item())
        """, TORCH_TPU_PLUGIN="/nonexistent/plugin.so")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    caught = [l for l in lines if l.startswith("CAUGHT:")]
    assert caught and "/nonexistent/plugin.so" in caught[0], out.stdout
    assert "available: False 0" in lines
    assert lines[-1] == "cpu still works: 2.0"


def test_probe_bad_plugin():
    with pytest.raises(RuntimeError, match="/bad"):
        torch_tpu._C._probe_plugin("/bad")
    _device_works()


def test_shape_mismatch_like_cpu():
    a, b = torch.ones(3, 4), torch.ones(5, 4)
    with pytest.raises(RuntimeError) as cpu_err:
        a + b
    with pytest.raises(RuntimeError) as tpu_err:
        a.to("tpu") + b.to("tpu")
    assert "must match the size" in str(cpu_err.value)
    assert "size" in str(tpu_err.value) or "broadcast" in str(tpu_err.value)
    with pytest.raises(RuntimeError):
        a.to("tpu") @ b.to("tpu")
    with pytest.raises(RuntimeError):
        a.to("tpu").view(5, 5)
    _device_works()


def test_two_devices_in_one_op():
    t, c = torch.ones(3, device="tpu"), torch.ones(3)
    with pytest.raises(RuntimeError, match="device"):
        t + c
    with pytest.raises(RuntimeError, match="device"):
        c + t
    with pytest.raises(RuntimeError, match="device"):
        t.add_(c)
    with pytest.raises(RuntimeError, match="device"):
        torch.mm(torch.ones(2, 2, device="tpu"), torch.ones(2, 2))
    # A 0-d CPU tensor is allowed, as with CUDA.
    assert torch.equal((t + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))
    _device_works()


def test_index_out_of_range():
    x = torch.arange(5.0, device="tpu")
    with pytest.raises((IndexError, RuntimeError)):
        x[7].item()
    _device_works()


def test_launch_blocking():
    out = _run("""
        import torch
        x = torch.arange(12.0, device="tpu").reshape(3, 4)
        y = (x * 2 + 1).t() @ x
        ref = (torch.arange(12.0).reshape(3, 4) * 2 + 1).t() @ torch.arange(12.0).reshape(3, 4)
        assert torch.equal(y.cpu(), ref)
        x[:, 1] = 0
        assert x.sum().item() == 66 - (1 + 5 + 9)
        try:
            torch.ones(2, 3, device="tpu") + torch.ones(4, 3, device="tpu")
        except RuntimeError:
            pass
        print("OK", y.sum().item())
        """, TORCH_TPU_LAUNCH_BLOCKING="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("OK")


def _compiles() -> int:
    return torch_tpu.debug.stats()["compiles"]


@pytest.mark.parametrize("case", ["add_scalar", "mul_", "full", "alpha", "div_int", "where"])
def test_changing_scalar_does_not_recompile(case):
    x = torch.randn(4, 5).to("tpu")
    y = torch.randn(4, 5).to("tpu")
    xc, yc = x.cpu(), y.cpu()
    values = [1.0, 2.0, -0.5, 3.25, 1e-3]
    counts, results, expected = [], [], []
    for s in values:
        if case == "add_scalar":
            results.append(x + s)
            expected.append(xc + s)
        elif case == "mul_":
            z = x.clone()
            z.mul_(s)
            results.append(z)
            expected.append(xc * s)
        elif case == "full":
            results.append(torch.full((3, 2), s, device="tpu"))
            expected.append(torch.full((3, 2), s))
        elif case == "alpha":
            results.append(x.add(y, alpha=s))
            expected.append(xc.add(yc, alpha=s))
        elif case == "div_int":
            i = int(s * 4) or 1
            results.append(torch.arange(10, device="tpu") // i)
            expected.append(torch.arange(10) // i)
        elif case == "where":
            results.append(torch.where(x > 0, x, s))
            expected.append(torch.where(xc > 0, xc, s))
        counts.append(_compiles())
    assert counts[1:] == [counts[0]] * (len(counts) - 1), counts
    for got, want in zip(results, expected):
        torch.testing.assert_close(got.cpu(), want)


def test_overlapping_writes_raise_like_cpu():
    for device in ("cpu", "tpu"):
        x = torch.zeros(5, device=device)
        with pytest.raises(RuntimeError, match="single memory location"):
            x.expand(3, 5).add_(torch.arange(15.0).view(3, 5).to(device))
        with pytest.raises(RuntimeError, match="single memory location"):
            torch.mul(torch.ones(3, 5, device=device), 2, out=x.expand(3, 5))
        y = torch.arange(6.0, device=device)
        with pytest.raises(RuntimeError, match="single memory location"):
            y[1:].copy_(y[:-1])
        with pytest.raises(RuntimeError, match="single memory location"):
            x.expand(3, 5).copy_(torch.ones(3, 5))
        # Fills are idempotent: allowed on expanded tensors; full overlap copies too.
        x.expand(3, 5).fill_(2.0)
        y.copy_(y)
        y[:3].copy_(y[3:])
        assert torch.equal(x.cpu(), torch.full((5,), 2.0))
        assert torch.equal(y.cpu(), torch.tensor([3.0, 4.0, 5.0, 3.0, 4.0, 5.0]))
    _device_works()


def test_index_out_of_range_raises_at_sync_not_clamped():
    """XLA clamps gather indices; torch_tpu raises IndexError instead."""
    w = torch.randn(10, 4, device="tpu")
    out = torch.nn.functional.embedding(torch.tensor([1, 10], device="tpu"), w)
    with pytest.raises(IndexError, match="out of range"):
        out.cpu()
    with pytest.raises(IndexError, match="out of range"):
        torch.index_select(w, 0, torch.tensor([-1], device="tpu")).sum().item()
    x = torch.zeros(5, device="tpu")
    x.scatter_(0, torch.tensor([7], device="tpu"), 1.0)
    with pytest.raises(IndexError, match="out of range"):
        torch.tpu.synchronize()
    # The device keeps working, and in-range indices are fine.
    got = torch.nn.functional.embedding(torch.tensor([1, 9], device="tpu"), w)
    torch.testing.assert_close(got.cpu(), w.cpu()[[1, 9]])


@pytest.mark.parametrize("spatial", [False, True])
def test_nll_loss_target_out_of_bounds_raises(spatial):
    """A one-hot lowering would silently give 0 for a bad class; CPU raises."""
    logits = torch.randn(2, 5, 3) if spatial else torch.randn(2, 5)
    bad = torch.tensor([[0, 5, 1], [1, 1, 1]]) if spatial else torch.tensor([0, 5])
    with pytest.raises((IndexError, RuntimeError)):
        torch.nn.functional.cross_entropy(logits, bad)  # CPU raises too
    with pytest.raises(IndexError, match="out of bounds"):
        torch.nn.functional.cross_entropy(logits.to("tpu"), bad.to("tpu")).item()
    # ignore_index is not out of bounds, and the device keeps working.
    ok = bad.clone()
    ok[bad == 5] = -100
    torch.testing.assert_close(
        torch.nn.functional.cross_entropy(logits.to("tpu"), ok.to("tpu")).cpu(),
        torch.nn.functional.cross_entropy(logits, ok))


def test_import_torch_tpu_before_torch():
    code = "import torch_tpu, torch; print(torch.ones(2, device='tpu').sum().item())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("2.0")


@pytest.mark.parametrize("op", [
    lambda a, b: torch.mm(a, b),
    lambda a, b: a @ b,
    lambda a, b: torch.nn.functional.linear(a, b.t()),
    lambda a, b: torch.addmm(torch.zeros(3, 5, device=a.device), a, b),
    lambda a, b: torch.mv(a, b[:, 0]),
], ids=["mm", "matmul", "linear", "addmm", "mv"])
def test_products_of_mixed_dtypes_raise_like_cpu(op):
    """PyTorch never promotes between a product's operands (f32 @ f16 raises);
    a tpu product used to compute it in f32."""
    a, b = torch.randn(3, 4), torch.randn(4, 5, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="dtype"):
        op(a, b)
    with pytest.raises(RuntimeError, match="same dtype"):
        op(a.to("tpu"), b.to("tpu"))
    torch.testing.assert_close(op(a.to("tpu"), b.float().to("tpu")).cpu(), op(a, b.float()))
    _device_works()
