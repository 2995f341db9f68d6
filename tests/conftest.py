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
