"""A Hugging Face kernel repository written for TorchTPU runs unchanged.

tests/kernels/jax_kernel_repo is a kernel-builder source repository
(build.toml: backends = ["tpu"], a [torch-noarch] build) whose package
imports ``jax_op`` from ``torch.tpu.pallas`` and runs a Pallas kernel. The
test lays out its build as the Hub has it (``build/torch-tpu/`` with
metadata.json: what kernel-builder's noarch build produces, the package
copied as is) and loads it through ``kernels``' own paths:
``get_local_kernel`` and ``LocalLayerRepository`` + ``kernelize(device="tpu")``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import torch_tpu

kernels = pytest.importorskip("kernels")  # kernels==0.17.2
pytest.importorskip("jax")  # jax==0.10.2

from kernels import (LocalLayerRepository, Mode, kernelize, use_kernel_forward_from_hub,  # noqa: E402
                     use_kernel_mapping)

SOURCE = Path(__file__).parent / "jax_kernel_repo"
NAME = "jax_silu_and_mul"


@pytest.fixture(scope="module")
def built_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository as the Hub serves it: build/torch-tpu/{package, metadata.json}."""
    repo = tmp_path_factory.mktemp("hub") / NAME
    variant = repo / "build" / "torch-tpu"
    shutil.copytree(SOURCE / "torch-ext" / NAME, variant)
    shutil.copy(SOURCE / "build.toml", repo / "build.toml")
    (variant / "metadata.json").write_text(json.dumps({
        "id": f"{NAME}_tpu", "name": NAME.replace("_", "-"), "version": 1, "license": "Apache-2.0",
        "python-depends": [], "backend": {"type": "tpu"},
    }))
    return repo


def _reference(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


def test_build_toml_is_a_tpu_noarch_build() -> None:
    import tomllib

    cfg = tomllib.loads((SOURCE / "build.toml").read_text())
    assert cfg["general"]["backends"] == ["tpu"] and "torch-noarch" in cfg


def test_get_local_kernel_runs_the_pallas_kernel(built_repo: Path) -> None:
    module = kernels.get_local_kernel(built_repo)
    x = torch.randn(4, 3, 16)
    out = module.silu_and_mul(x.to("tpu"))
    assert out.device.type == "tpu" and out.shape == (4, 3, 8)
    torch.testing.assert_close(out.cpu(), _reference(x), rtol=1e-5, atol=1e-5)


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _reference(x)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 32)
        self.act = SiluAndMul()
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def test_kernelize_swaps_in_the_jax_kernel_forward_and_backward(built_repo: Path) -> None:
    torch.manual_seed(0)
    ref = MLP()
    model = MLP().to("tpu")
    model.load_state_dict({k: v.to("tpu") for k, v in ref.state_dict().items()})
    repo = LocalLayerRepository(repo_path=built_repo, layer_name="SiluAndMul")
    with use_kernel_mapping({"SiluAndMul": {"tpu": {Mode.TRAINING: repo}}}):
        kernelize(model, device="tpu", mode=Mode.TRAINING)
    assert model.act.forward.__func__ is not SiluAndMul.forward  # the kernel's forward now
    before = torch_tpu.debug.stats()["native_ops"].get("jax_op", 0)
    x = torch.randn(5, 8)
    out = model(x.to("tpu"))
    assert torch_tpu.debug.stats()["native_ops"].get("jax_op", 0) == before + 1
    out.square().sum().backward()
    expected = ref(x)
    expected.square().sum().backward()
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.up.weight.grad.cpu(), ref.up.weight.grad, rtol=1e-4, atol=1e-5)
