"""Hugging Face tests: offline, tiny configs, random weights; skipped without transformers."""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(__file__))

try:
    import transformers  # noqa: F401
except ImportError:  # pragma: no cover - scripts/install.sh installs it
    collect_ignore_glob = ["test_*.py"]
    print("tests/hf: transformers is not installed; skipping (run scripts/install.sh)")
else:
    transformers.logging.set_verbosity_error()
