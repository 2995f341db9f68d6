#!/usr/bin/env bash
# Installs (scripts/install.sh), then runs the C++ unit tests (GoogleTest via
# ctest) and the Python tests (pytest).
#
# The OpInfo sweeps run in a pytest process of their own. In one process after
# the other ~1700 tests, the process died (2 of 2 runs, and in CI) with a
# segmentation fault inside libgcc's unwinder on the autograd thread: a C++
# exception thrown there searched an EH frame registered by the PJRT plugin's
# XLA:CPU JIT whose memory had been unmapped (core dump: the registered
# frame's page was gone). Each half passes alone; the root cause (which
# executable's JIT memory is released before its frame is deregistered) is
# still open. Extra pytest arguments apply to both processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1
ctest --test-dir build --output-on-failure
SWEEPS=(tests/ops/test_opinfo.py tests/ops/test_opinfo_grad.py)
"$PY" -m pytest tests -q -p no:cacheprovider "${SWEEPS[@]/#/--deselect=}" "$@"
"$PY" -m pytest "${SWEEPS[@]}" -q -p no:cacheprovider "$@"
