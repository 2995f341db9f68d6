"""Model-level tests: offline, tiny configs, random weights; skipped without transformers."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import transformers  # noqa: F401
except ImportError:  # pragma: no cover - scripts/install.sh installs it
    collect_ignore_glob = ["test_transformers_*.py"]
    print("tests/models: transformers is not installed; skipping (run scripts/install.sh)")
else:
    transformers.logging.set_verbosity_error()
