#!/usr/bin/env bash
# The whole test suite from nothing: set-up, the tests, the benchmark suite as a smoke test, and (where nvcc is
# present) proof that the CUDA sources compile against a CUDA build of torch, with the CPU tests run against it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
py="$root/.venv/bin/python"
export OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=1

echo "# tests (torch 2.13.0, CPU build)"
"$py" -m pytest tests -q -p no:cacheprovider

if [ -d bench ] && ls bench/test_*.py >/dev/null 2>&1; then
  echo "# benchmark suite, benchmarking disabled (keeps it from rotting)"
  "$py" -m pytest bench -q -p no:cacheprovider --benchmark-disable
fi
if [ -x .ci/bench-gate.sh ]; then
  echo "# performance gate against the committed baseline"
  .ci/bench-gate.sh "$py"
fi

if [ "${DELAYCOMM_SKIP_CUDA_CHECK:-0}" != 1 ]; then
  "$root/scripts/cuda-check.sh"
fi
