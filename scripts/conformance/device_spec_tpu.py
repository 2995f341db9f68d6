"""Transformers device spec for torch_tpu (TRANSFORMERS_TEST_DEVICE_SPEC).

Read by ``transformers.testing_utils``: ``DEVICE_NAME`` becomes
``torch_device`` in the upstream tests and the ``*_FN`` entries fill the
``BACKEND_*`` dispatch tables (``backend_manual_seed``, ``backend_empty_cache``,
``backend_device_count``). ``transformers.testing_utils`` imports this file
by its bare module name, so ``run_transformers.py`` copies it into the
directory the tests run from. Diffusers' ``tests/testing_utils.py`` reads the
same names from ``DIFFUSERS_TEST_DEVICE_SPEC`` (``run_diffusers.py``).
"""

import torch
import torch_tpu  # noqa: F401  (idempotent; torch's autoload normally did it already)

DEVICE_NAME = "tpu"

MANUAL_SEED_FN = torch.tpu.manual_seed
EMPTY_CACHE_FN = torch.tpu.empty_cache
DEVICE_COUNT_FN = torch.tpu.device_count
