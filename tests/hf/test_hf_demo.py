"""The README's main demo (scripts/demo.sh runs demo/hf_generate.py) works."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_hf_generate_demo(tmp_path):
    out = subprocess.run([sys.executable, "demo/hf_generate.py", "--new-tokens", "6",
                          "--dir", str(tmp_path / "model")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("equal to CPU: True") == 2
    assert "CPU fallbacks       none" in out.stdout
    assert "OK: tpu tokens equal CPU's" in out.stdout
    assert (tmp_path / "model" / "model.safetensors").exists()
