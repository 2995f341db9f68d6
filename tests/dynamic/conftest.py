import pytest

import torch_tpu


@pytest.fixture
def auto_dynamic_shapes():
    """TORCH_TPU_DYNAMIC_SHAPES=auto for one test, whatever the process runs under, with the
    sizes earlier tests showed the policy forgotten (compiled executables stay): the test's
    own warm-ups decide which dims are dynamic. In CI, a batch size an earlier test had
    used compiled 2 exact ops in the new-batch-size test (not reproduced alone)."""
    before = torch_tpu._C._dynamic_shapes()
    torch_tpu.dynamic.forget_sizes()
    torch_tpu.dynamic.set_mode("auto")
    yield
    torch_tpu.dynamic.set_mode(before)
