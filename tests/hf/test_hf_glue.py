"""Import-time glue: device detection, safetensors onto "tpu", lazy hooks, from_pretrained(device_map="tpu")."""
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (scripts/install.sh installs it)")
safetensors_torch = pytest.importorskip("safetensors.torch")

import torch_tpu  # noqa: E402
from _models import build, prompt  # noqa: E402


def _run(code: str, **env: str) -> str:
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True).stdout


def test_is_torch_tpu_available():
    from transformers.utils import is_torch_tpu_available

    assert is_torch_tpu_available()
    from transformers import TrainingArguments

    assert TrainingArguments(output_dir="/tmp/unused", report_to=[]).device.type == "tpu"


def test_import_torch_does_not_import_hf():
    out = _run("import sys, torch; print(sorted(m for m in ('transformers', 'safetensors', 'accelerate') if m in sys.modules))")
    assert out.strip() == "[]"


def test_patch_applies_when_safetensors_imported_first():
    code = (
        "import safetensors, safetensors.torch as st, torch\n"
        "import torch_tpu\n"
        "print(getattr(st.safe_open, '_torch_tpu_wrapped', False), getattr(safetensors.safe_open, '_torch_tpu_wrapped', False))"
    )
    assert _run(code, TORCH_DEVICE_BACKEND_AUTOLOAD="0").split() == ["True", "True"]


@pytest.mark.parametrize("device", ["tpu", "tpu:0", torch.device("tpu")])
def test_safetensors_to_tpu(tmp_path, device):
    from safetensors import safe_open

    tensors = {"a": torch.randn(3, 4), "b": torch.arange(6, dtype=torch.int64).reshape(2, 3),
               "h": torch.randn(5).to(torch.bfloat16), "e": torch.zeros(0, 2)}
    path = str(tmp_path / "t.safetensors")
    safetensors_torch.save_file(tensors, path)
    loaded = safetensors_torch.load_file(path, device=device)
    assert set(loaded) == set(tensors)
    for k, v in loaded.items():
        assert v.device.type == "tpu" and v.dtype == tensors[k].dtype
        torch.testing.assert_close(v.cpu(), tensors[k], rtol=0, atol=0)
    with safe_open(path, framework="pt", device=device) as f:
        assert sorted(f.keys()) == sorted(tensors)
        t = f.get_tensor("a")
        s = f.get_slice("a")[1:3]
        assert t.device.type == "tpu" and s.device.type == "tpu"
        torch.testing.assert_close(s.cpu(), tensors["a"][1:3], rtol=0, atol=0)
    # other devices are untouched: the original Rust object comes back
    with safe_open(path, framework="pt", device="cpu") as f:
        assert type(f).__module__ != "torch_tpu.hf"
        assert f.get_tensor("a").device.type == "cpu"


def test_from_pretrained_device_map_tpu(tmp_path):
    from transformers import AutoModelForCausalLM

    cpu, _ = build("llama")
    cpu.save_pretrained(tmp_path)  # safetensors
    assert (tmp_path / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="tpu")
    assert model.device.type == "tpu"
    assert all(p.device.type == "tpu" for p in model.parameters())
    ids = prompt()
    with torch.no_grad():
        ref = cpu(ids).logits
        out = model(ids.to("tpu")).logits.cpu()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for (k, a), (_, b) in zip(sorted(cpu.state_dict().items()), sorted(model.state_dict().items())):
        torch.testing.assert_close(b.cpu(), a, rtol=0, atol=0, msg=k)


def test_from_pretrained_bfloat16(tmp_path):
    from transformers import AutoModelForCausalLM

    cpu, _ = build("llama")
    cpu.to(torch.bfloat16).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="tpu", dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16 and model.device.type == "tpu"
    ids = prompt()
    with torch.no_grad():
        ref = cpu(ids).logits.float()
        out = model(ids.to("tpu")).logits.float().cpu()
    torch.testing.assert_close(out, ref, rtol=5e-2, atol=5e-2)
