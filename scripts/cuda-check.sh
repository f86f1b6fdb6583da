#!/usr/bin/env bash
# Proves the CUDA sources compile: builds delaycomm against torch-cuda of pyproject.toml (a CUDA build of torch)
# with nvcc, imports the CUDA build and runs a few CPU tests against it. Nothing CUDA runs here (no GPU needed);
# the GPU machine runs bench/gpu_check.sh.
#   scripts/cuda-check.sh [prepare|test|all]   prepare: the venv and the build; test: import and tests (default all)
# scripts/test.sh runs `prepare` in the background while the CPU tests run, then `test`.
# NOTE: the build is not optimised (-DDELAYCOMM_OPTIMIZE=OFF): it proves that the .cu sources and the CUDA paths
# of the C++ compile, link and load against a CUDA torch; nothing here measures its speed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/lib.sh
what=${1:-all}
case "$what" in prepare | test | all) ;; *) echo "usage: scripts/cuda-check.sh [prepare|test|all]" >&2; exit 2 ;; esac
nvcc=${CUDACXX:-$(command -v nvcc || true)}
if [ -z "$nvcc" ]; then
  echo "# CUDA compile check skipped: no nvcc on PATH"
  exit 0
fi
venv=${DELAYCOMM_CUDA_VENV:-$root/.venv-cuda}
torch_version=$(pyproject torch-cuda)

if [ "$what" != test ]; then
  DELAYCOMM_NO_BUILD=1 scripts/setup.sh "$venv" "$torch_version"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # torch's CUDA headers include the CUDA runtime's and NCCL's, which the wheels ship under site-packages/nvidia.
  export CPATH="$site/nvidia/cu13/include:$site/nvidia/nccl/include${CPATH:+:$CPATH}"
  export CUDACXX=$nvcc TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  export CUDA_TOOLKIT_ROOT_DIR
  CUDA_TOOLKIT_ROOT_DIR=$(dirname "$(dirname "$nvcc")")
  echo "# building delaycomm against torch $torch_version with $nvcc (unoptimised: a compile check)"
  "$venv/bin/python" -m pip -q --disable-pip-version-check install --no-compile --no-build-isolation --no-deps \
    -Cbuild-dir="$root/build/torch-$torch_version" \
    -Ccmake.define.CMAKE_CUDA_COMPILER="$nvcc" -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 \
    -Ccmake.define.DELAYCOMM_OPTIMIZE=OFF \
    -Ccmake.define.CUDA_nvrtc_LIBRARY="$site/nvidia/cu13/lib/libnvrtc.so.13" "$root"
fi

if [ "$what" != prepare ]; then
  unset_script_knobs
  "$venv/bin/python" - <<'PY'
import torch, delaycomm
assert torch.version.cuda, "expected a CUDA build of torch"
assert delaycomm._C.cuda_compiled, "delaycomm was built without its CUDA sources"
print(f"# CUDA build OK: torch {torch.__version__} (CUDA {torch.version.cuda}), delaycomm CUDA sources compiled")
PY
  echo "# CPU tests against the CUDA build"
  # The backend end to end in a fresh process, every collective against Gloo, group destruction (it deadlocked
  # with this torch only), the options.
  OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/backend/test_registration.py::test_init_process_group_without_importing_delaycomm \
    tests/backend/test_api.py::test_dropping_a_group_right_after_a_collective_does_not_deadlock \
    tests/backend/test_collectives.py tests/backend/test_config.py
  # The GPU tests (marked `gpu`, tests/conftest.py; found as bench/gpu_check.sh finds them): they skip without a
  # GPU, but must collect and import against this build.
  mapfile -t gpu_test_files < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu\b' tests | sort)
  OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider -m gpu "${gpu_test_files[@]}"
fi
