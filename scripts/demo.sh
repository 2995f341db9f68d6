#!/usr/bin/env bash
# Installs (scripts/install.sh), then runs the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
"${PYTHON:-python3}" demo/train_mlp.py
