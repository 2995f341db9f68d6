#!/usr/bin/env bash
# Runs torch_tpu on an NVIDIA GPU through the CUDA PJRT plugin
# (TORCH_TPU_PLUGIN=cuda, from the jax-cuda13-pjrt or xla-cuda13-pjrt wheel).
# Not part of CI (CI machines have no GPU). Builds against the machine's own
# torch, then runs the device-independent tests and the benchmarks.
#   PJRT_INCLUDE_DIR  folder holding pjrt_c_api.h when xla-cpu-pjrt is absent
#   OUT               where logs go (default /tmp/torch_tpu_gpu)
#   DEADLINE          seconds the whole script may take; the tests get the rest
#   WHEEL=1           also build a wheel for this machine's torch into $OUT/dist
#                     (it requires that torch version; install it with
#                     jax-cuda13-pjrt or xla-cuda13-pjrt for TORCH_TPU_PLUGIN=cuda)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/torch_tpu_gpu}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export TORCH_TPU_PLUGIN=cuda PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export TORCH_TPU_CACHE_DIR="$OUT/cache"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)" | tee -a "$OUT/env.txt"

start=$(date +%s)
CMAKE_ARGS="${PJRT_INCLUDE_DIR:+-DPJRT_INCLUDE_DIR=$PJRT_INCLUDE_DIR} -DTORCH_TPU_BUILD_TESTS=OFF" \
TORCH_TPU_BUILD_DIR="$PWD/build-gpu" MAX_JOBS=16 \
  "$PY" -m pip install -q --no-build-isolation --no-deps --no-index -e . > "$OUT/build.log" 2>&1
rc=$?
echo "build rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/env.txt"
if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit $rc; fi
if [ "${WHEEL:-0}" = 1 ]; then
  # The same build, as a wheel (setup.py: no C++ tests, rpath to the installed torch).
  CMAKE_ARGS="${PJRT_INCLUDE_DIR:+-DPJRT_INCLUDE_DIR=$PJRT_INCLUDE_DIR}" \
  TORCH_TPU_BUILD_DIR="$PWD/build-gpu-wheel" CMAKE_BUILD_PARALLEL_LEVEL=16 \
    "$PY" -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$OUT/dist" . \
    >> "$OUT/build.log" 2>&1 && ls "$OUT/dist" | sed 's/^/wheel: /' | tee -a "$OUT/env.txt"
fi

"$PY" - <<'PY' 2>&1 | tee "$OUT/smoke.txt"
import time, torch
x = torch.randn(256, 256, device="tpu")
print("platform", torch.tpu.get_platform(), "devices", torch.tpu.device_count())
ref = (x.cpu() @ x.cpu().T).softmax(-1)
print("matmul+softmax max err", ((x @ x.T).softmax(-1).cpu() - ref).abs().max().item())
for dtype, n in ((torch.bfloat16, 8192), (torch.float32, 4096)):
    a = torch.randn(n, n, device="tpu", dtype=dtype); b = torch.randn(n, n, device="tpu", dtype=dtype)
    (a @ b); torch.tpu.synchronize()
    t = time.perf_counter(); reps = 10
    for _ in range(reps): c = a @ b
    torch.tpu.synchronize(); dt = (time.perf_counter() - t) / reps
    print(f"{dtype} {n}^3 matmul: {2 * n**3 / dt / 1e12:.1f} TFLOP/s ({dt * 1e3:.2f} ms)")
    if torch.cuda.is_available():
        a, b = a.cpu().cuda(), b.cpu().cuda(); a @ b; torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps): c = a @ b
        torch.cuda.synchronize(); dt = (time.perf_counter() - t) / reps
        print(f"  PyTorch CUDA eager: {2 * n**3 / dt / 1e12:.1f} TFLOP/s")
PY

timeout 60 "$PY" benchmarks/op_overhead.py 2>&1 | tee "$OUT/op_overhead.txt"
timeout "${LLAMA_TIMEOUT:-150}" "$PY" benchmarks/llama_modes.py --baseline cuda --hidden 1024 --seq 512 --batch 8 2>&1 \
  | tee "$OUT/llama_modes.txt"

# The tests run last, for whatever time is left before DEADLINE (seconds
# after the start of this script); -v lists each result as it comes.
left=$(( ${DEADLINE:-900} - ($(date +%s) - start) - 15 ))
echo "pytest gets ${left} s" | tee -a "$OUT/env.txt"
timeout "$left" "$PY" -m pytest -v -p no:cacheprovider --timeout=120 \
  ${GPU_TESTS:-tests/test_smoke.py tests/test_autograd.py tests/test_errors.py tests/tensor tests/ops tests/compile tests/runtime} \
  -n "${GPU_TEST_WORKERS:-4}" > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/env.txt"
grep -c " PASSED" "$OUT/pytest.log" | sed 's/^/passed: /'
grep -E " (FAILED|ERROR)" "$OUT/pytest.log" | sed 's/^/  /' | head -60
tail -5 "$OUT/pytest.log"

