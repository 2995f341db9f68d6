"""Fixtures of the kernel tests."""
from __future__ import annotations

import pytest


@pytest.fixture(params=["tiles", "tokamax"])
def grouped(request: pytest.FixtureRequest) -> str:
    """Each grouped matmul of the MoE kernels (torch_tpu.hub_kernels.moe):
    torch_tpu's tiles, tokamax.ragged_dot_general (skipped without tokamax)."""
    pytest.importorskip("jax")
    if request.param == "tokamax":
        pytest.importorskip("tokamax")  # scripts/install.sh pins tokamax==0.0.12
    from torch_tpu.hub_kernels import moe

    moe.use_grouped_matmul(request.param)
    yield request.param
    moe.use_grouped_matmul("auto")
