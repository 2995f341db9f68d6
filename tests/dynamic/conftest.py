import pytest

import torch_tpu


@pytest.fixture
def auto_dynamic_shapes():
    """TORCH_TPU_DYNAMIC_SHAPES=auto for one test, whatever the process runs under."""
    before = torch_tpu._C._dynamic_shapes()
    torch_tpu.dynamic.set_mode("auto")
    yield
    torch_tpu.dynamic.set_mode(before)
