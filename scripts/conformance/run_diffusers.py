#!/usr/bin/env python
"""Run the upstream Diffusers test suites, unmodified, on "tpu" and on CPU.

Same runner as ``run_transformers.py`` (imported, not copied): each test module
runs in its own pytest process, once with ``DIFFUSERS_TEST_DEVICE=tpu``
(+ ``DIFFUSERS_TEST_BACKEND=torch_tpu`` and ``DIFFUSERS_TEST_DEVICE_SPEC`` =
``device_spec_tpu.py``, which diffusers' ``tests/testing_utils.py`` reads with
the same attribute names as transformers') and once on CPU
(``DIFFUSERS_TEST_DEVICE=cpu``, torch_tpu's autoload turned off), offline. The
test sources are NOT part of this repository: ``--src`` is a source tree of the
Diffusers release (see README.md, "Diffusers conformance"); its ``src/`` goes
first on ``PYTHONPATH`` unless ``--installed-diffusers``. tpu failures of
CPU-passing tests are matched against ``known_failures_diffusers.txt``.

    python scripts/conformance/run_diffusers.py --src /tmp/diffusers-src \\
        --report /tmp/conformance/diffusers --test-timeout 120
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_transformers as rt  # noqa: E402

# The models, schedulers and pipelines of the conformance issue.
DEFAULT_MODULES = [
    "tests/models/unets/test_models_unet_2d_condition.py",
    "tests/models/autoencoders/test_models_autoencoder_kl.py",
    "tests/models/transformers/test_models_dit_transformer2d.py",
    "tests/schedulers/test_scheduler_ddpm.py",
    "tests/schedulers/test_scheduler_ddim.py",
    "tests/schedulers/test_scheduler_euler.py",
    "tests/pipelines/ddpm/test_ddpm.py",
    "tests/pipelines/stable_diffusion/test_stable_diffusion.py",
    "tests/pipelines/dit/test_dit.py",
]

rt.SUITES["diffusers"] = {
    "package": "diffusers",
    "title": "Diffusers",
    "default_modules": DEFAULT_MODULES,
    "known_failures": rt.HERE / "known_failures_diffusers.txt",
}

if __name__ == "__main__":
    sys.exit(rt.main(suite="diffusers", description=__doc__))
