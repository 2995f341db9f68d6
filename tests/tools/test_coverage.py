"""The op-coverage tool lists native and fallback ops of a program."""
import json
import subprocess
import sys


def test_coverage_of_a_script(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import torch\n"
        "x = torch.randn(8, 8, device='tpu')\n"
        "y = (x @ x).relu().sum()\n"
        "z = torch.special.airy_ai(x)  # no native rule: CPU fallback\n"
        "print(y.item(), z.sum().item())\n")
    out_json = tmp_path / "table.json"
    out = subprocess.run([sys.executable, "-m", "torch_tpu.tools.coverage", "--json",
                          str(out_json), str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    table = json.loads(out_json.read_text())
    kinds = {r["op"]: r["native"] for r in table["ops"]}
    assert kinds["mm"] is True and kinds["relu"] is True
    assert kinds["special_airy_ai.out"] is False
    assert "FALLBACK" in out.stdout and "ops native" in out.stdout
    failing = subprocess.run([sys.executable, "-m", "torch_tpu.tools.coverage",
                              "--fail-on-fallback", str(script)], capture_output=True, text=True,
                             timeout=120)
    assert failing.returncode == 1
