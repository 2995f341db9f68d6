"""Test-wide settings.

Each test session gets its own, empty compilation cache directory, and
PyTorch's cache directory (whose AOTAutograd cache holds the graphs that
torch.compile traced) next to it, so that tests counting compiles do not
depend on what earlier runs left on disk (tests of the caches themselves use
their own directories).
"""
import os
import tempfile

os.environ["TORCH_TPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torch_tpu_test_cache_")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(os.environ["TORCH_TPU_CACHE_DIR"], "torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture
def auto_dynamic_shapes():
    """TORCH_TPU_DYNAMIC_SHAPES=auto for one test, whatever the process runs under, as in a
    fresh process: the sizes earlier tests showed the policy are forgotten and their
    executables dropped, so the test's own warm-ups decide which dims are dynamic and what
    is compiled. (In CI, after other test files, the new-batch-size test compiled one more
    bitwise_or, and once 2 exact ops; never reproduced alone or in a local run of the suite.)"""
    import torch_tpu  # noqa: PLC0415 (after the cache directory above is set)

    before = torch_tpu._C._dynamic_shapes()
    torch_tpu.debug.clear_cache()
    torch_tpu.dynamic.forget_sizes()
    torch_tpu.dynamic.set_mode("auto")
    yield
    torch_tpu.dynamic.set_mode(before)
