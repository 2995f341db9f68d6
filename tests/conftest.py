"""Test-wide settings.

Each test session gets its own, empty compilation cache directory, so that
tests counting compiles do not depend on what earlier runs left on disk
(tests of the disk cache itself use their own directories).
"""
import os
import tempfile

os.environ["TORCH_TPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torch_tpu_test_cache_")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
