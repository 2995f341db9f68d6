#!/usr/bin/env bash
# Installs (scripts/install.sh), then runs the demo: a tiny Llama-style model
# saved with save_pretrained, loaded with device_map="tpu", generating the
# same greedy tokens as CPU (DynamicCache and StaticCache), with timings and
# torch_tpu.debug.report(). demo/train_mlp.py is a second, training demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
"${PYTHON:-python3}" demo/hf_generate.py "$@"
