"""Each torch.compile test starts with Dynamo's caches and our graph stats reset."""
import pytest
import torch

from torch_tpu import compile as tpu_compile


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    tpu_compile.reset_stats()
    yield
    torch._dynamo.reset()
