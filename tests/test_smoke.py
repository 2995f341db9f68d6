"""End-to-end smoke checks: the demo's path, through the public API only."""
import subprocess
import sys

import torch

import torch_tpu


def test_one_liner_autoloads_without_importing_torch_tpu():
    code = "import torch; print(torch.randn(2, 3, device='tpu').sum().item())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    float(out.stdout.strip().splitlines()[-1])


def test_elementwise_chain_matches_cpu():
    x = torch.randn(16, 8)
    y = torch.randn(8)
    got = ((x.to("tpu") * 3 - y.to("tpu")).exp() / 2).cpu()
    torch.testing.assert_close(got, (x * 3 - y).exp() / 2)


def test_stats_keys():
    s = torch_tpu.debug.stats()
    for key in ("compiles", "cache_hits", "executions", "compile_seconds", "fallbacks"):
        assert key in s
    assert isinstance(s["fallbacks"], dict)


def test_demo_runs():
    out = subprocess.run([sys.executable, "demo/train_mlp.py"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "torch_tpu report" in out.stdout
    assert "accuracy: tpu 1.000" in out.stdout or "accuracy: tpu 0.9" in out.stdout
