#!/usr/bin/env bash
# Installs everything torch_tpu needs on a fresh Debian machine, then builds
# and installs torch_tpu itself (editable). Idempotent: a second run only
# rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in cmake ninja-build ccache g++ libgtest-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
# torch is pinned: any range would pull a multi-GB CUDA build.
"$PY" -m pip install -q torch==2.13.0 xla-cpu-pjrt numpy pytest expecttest pytest-xdist==3.6.1 execnet==2.1.1
# Hugging Face stack (tests/hf, demo/hf_generate.py); exact pins resolved
# against torch==2.13.0 (none of them pulls another torch).
"$PY" -m pip install -q torch==2.13.0 transformers==5.24.0 accelerate==1.15.0 \
  safetensors==0.8.0 tokenizers==0.23.3 huggingface_hub==2.4.0
"$PY" -m pip install -q torch==2.13.0 diffusers==0.42.1 pillow==13.0.0 importlib_metadata==10.2.0 zipp==4.1.2 lazy-importer==0.1.0
# Hugging Face kernels (tests/hf/test_kernels.py): its deps do not touch torch.
"$PY" -m pip install -q torch==2.13.0 kernels==0.17.2
# JAX (optional for users; tests/kernels): torch_tpu.pallas.jax_op exports
# JAX functions and Pallas kernels to StableHLO. Needs no torch.
"$PY" -m pip install -q jax==0.10.2 jaxlib==0.10.2
# tokamax (optional): torch_tpu.hub_kernels.moe's grouped matmuls use
# tokamax.ragged_dot on tpu (its Mosaic kernel); on XLA:CPU it lowers to a
# dense masked dot (tokens x experts), so the kernel keeps its own tiles
# there (tests/kernels/test_moe_experts.py checks both equal). 0.0.12 is the
# newest usable release (0.1.0 is an empty placeholder); pinning jax/jaxlib
# keeps it from moving them.
"$PY" -m pip install -q jax==0.10.2 jaxlib==0.10.2 tokamax==0.0.12
# Build against the installed torch: no isolated build env (it would
# download another torch).
"$PY" -m pip install -q --no-build-isolation --no-deps -e .
