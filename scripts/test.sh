#!/usr/bin/env bash
# Installs (scripts/install.sh), then runs the C++ unit tests (GoogleTest via
# ctest) and the Python tests (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1
ctest --test-dir build --output-on-failure
"$PY" -m pytest tests -q -p no:cacheprovider "$@"
