import pytest

import torch_tpu


@pytest.fixture
def auto_dynamic_shapes():
    """TORCH_TPU_DYNAMIC_SHAPES=auto for one test, whatever the process runs under, as in a
    fresh process: the sizes earlier tests showed the policy are forgotten and their
    executables dropped, so the test's own warm-ups decide which dims are dynamic and what
    is compiled. (In CI, after other test files, the new-batch-size test compiled one more
    bitwise_or, and once 2 exact ops; never reproduced alone or in a local run of the suite.)"""
    before = torch_tpu._C._dynamic_shapes()
    torch_tpu.debug.clear_cache()
    torch_tpu.dynamic.forget_sizes()
    torch_tpu.dynamic.set_mode("auto")
    yield
    torch_tpu.dynamic.set_mode(before)
