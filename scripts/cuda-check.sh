#!/usr/bin/env bash
# Proves the CUDA sources compile: builds delaycomm against torch 2.14.1 (CUDA 13) with nvcc, imports the CUDA
# build and runs CPU tests against it. Nothing CUDA runs here (no GPU); the GPU machine runs bench/gpu_check.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
nvcc=${CUDACXX:-$(command -v nvcc || true)}
if [ -z "$nvcc" ]; then
  echo "# CUDA compile check skipped: no nvcc on PATH"
  exit 0
fi
venv=${DELAYCOMM_CUDA_VENV:-$root/.venv-cuda}
export CUDACXX=$nvcc TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_CUDA_COMPILER=$nvcc -DCMAKE_CUDA_ARCHITECTURES=90"
DELAYCOMM_NO_BUILD=1 "$root/scripts/setup.sh" "$venv" 2.14.1
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# torch's CUDA headers include the CUDA runtime's and NCCL's, which the wheels ship under site-packages/nvidia.
export CPATH="$site/nvidia/cu13/include:$site/nvidia/nccl/include${CPATH:+:$CPATH}"
export CUDA_TOOLKIT_ROOT_DIR=$(dirname "$(dirname "$nvcc")")
"$venv/bin/python" -m pip -q install --no-build-isolation --no-deps -Cbuild-dir="$root/build/torch-2.14.1" \
  -Ccmake.define.CUDA_nvrtc_LIBRARY="$site/nvidia/cu13/lib/libnvrtc.so.13" "$root"
"$venv/bin/python" - <<'PY'
import torch, delaycomm
assert torch.version.cuda, "expected a CUDA build of torch"
assert delaycomm._C.cuda_compiled, "delaycomm was built without its CUDA sources"
print(f"# CUDA build OK: torch {torch.__version__} (CUDA {torch.version.cuda}), delaycomm CUDA sources compiled")
PY
echo "# CPU tests against the CUDA build"
OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_registration.py \
  tests/test_config.py "tests/test_collectives.py::test_every_collective_matches_gloo_bitwise[2]" tests/gpu
