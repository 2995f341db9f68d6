#!/usr/bin/env bash
# Checks that torch_tpu installs with one command on a fresh machine (only
# Python and the system compilers), in fresh virtual environments under $OUT:
#   1. `pip install .` from a clean copy of the checkout (HEAD, committed files);
#   2. `python -m build --wheel` from that copy, then the wheel installed with
#      pip in another fresh venv;
# each followed by a smoke test run outside the source tree: the extension
# loads libtorch through its rpath (before torch is imported), ops on tpu
# equal CPU's, the plugin comes from the venv's xla-cpu-pjrt.
# Not part of CI (two full builds: about 10 min each on 2 cores).
#   OUT     working folder (default /tmp/torch_tpu_wheel_check; emptied)
#   PYTHON  the interpreter the venvs are made from (default python3)
#   JOBS    build parallelism (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/torch_tpu_wheel_check}"
PY="${PYTHON:-python3}"
export CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-2}" PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
rm -rf "$OUT"; mkdir -p "$OUT/src"
git archive --format=tar HEAD | tar -x -C "$OUT/src"
cp -r "$OUT/src" "$OUT/src-wheel"  # each way from its own clean copy

smoke() {  # $1: a venv
  (cd "$OUT" && TORCH_TPU_CACHE_DIR="" "$1/bin/python" - <<'PY')
import ctypes, glob, os, subprocess, sys, sysconfig
site = sysconfig.get_paths()["purelib"]
so = glob.glob(os.path.join(site, "torch_tpu", "_C*.so"))
assert len(so) == 1, so
rpath = subprocess.run(["readelf", "-d", so[0]], capture_output=True, text=True).stdout
print("rpath:", [l.split("[")[1].rstrip("]") for l in rpath.splitlines() if "PATH" in l])
ctypes.CDLL(so[0])  # resolves libtorch through the rpath: torch not imported yet
import torch, torch_tpu
assert torch_tpu.__file__.startswith(site), torch_tpu.__file__
x = torch.randn(8, 8)
w = torch.randn(8, 8, requires_grad=True)
wt = w.detach().to("tpu").requires_grad_()
loss = (x.to("tpu") @ wt).softmax(-1).sum(0).pow(2).sum()
loss.backward()
ref = (x @ w).softmax(-1).sum(0).pow(2).sum()
ref.backward()
torch.testing.assert_close(loss.cpu(), ref)
torch.testing.assert_close(wt.grad.cpu(), w.grad)
fallbacks = torch_tpu.debug.stats()["fallbacks"]
assert not fallbacks, fallbacks
plugin = torch_tpu._plugin.resolve()
assert plugin.startswith(site), plugin
print("smoke ok: torch", torch.__version__, "platform", torch.tpu.get_platform(), "plugin", plugin)
PY
}

step() { echo "== $1 ($(date +%T))"; }

step "1. pip install . in a fresh venv"
"$PY" -m venv "$OUT/venv-pip"
start=$(date +%s)
"$OUT/venv-pip/bin/pip" install -q "$OUT/src" > "$OUT/pip-install.log" 2>&1 \
  || { tail -40 "$OUT/pip-install.log"; exit 1; }
echo "pip install . took $(( $(date +%s) - start )) s"
"$OUT/venv-pip/bin/pip" list 2>/dev/null | grep -iE "^(torch|xla)" || true
smoke "$OUT/venv-pip"

step "2. python -m build --wheel, installed in another fresh venv"
"$PY" -m venv "$OUT/venv-build"
"$OUT/venv-build/bin/pip" install -q build==1.6.1 > "$OUT/build-tool.log" 2>&1
start=$(date +%s)
"$OUT/venv-build/bin/python" -m build --wheel --outdir "$OUT/dist" "$OUT/src-wheel" \
  > "$OUT/build-wheel.log" 2>&1 || { tail -40 "$OUT/build-wheel.log"; exit 1; }
echo "python -m build --wheel took $(( $(date +%s) - start )) s: $(ls "$OUT/dist")"
"$PY" -m venv "$OUT/venv-wheel"
"$OUT/venv-wheel/bin/pip" install -q "$OUT"/dist/*.whl > "$OUT/wheel-install.log" 2>&1 \
  || { tail -40 "$OUT/wheel-install.log"; exit 1; }
smoke "$OUT/venv-wheel"
step "all passed"
