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

# The architectures this check compiles for (one: each costs nvcc a pass over the .cu sources) and what the built
# module must then hold (cuobjdump's --list-elf and --list-ptx), which proves TORCH_CUDA_ARCH_LIST is obeyed.
arch_list=${TORCH_CUDA_ARCH_LIST:-9.0}
site() { "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

if [ "$what" != test ]; then
  DELAYCOMM_NO_BUILD=1 scripts/setup.sh "$venv" "$torch_version"
  site=$(site)
  # NOTE: no CPATH: CMakeLists.txt finds the CUDA headers that torch's wheels ship (site-packages/nvidia/*/include)
  # by itself, which the toolkit here (nvcc without the libraries' headers) lacks.
  export CUDACXX=$nvcc TORCH_CUDA_ARCH_LIST=$arch_list
  export CUDA_TOOLKIT_ROOT_DIR
  CUDA_TOOLKIT_ROOT_DIR=$(dirname "$(dirname "$nvcc")")
  echo "# the default CUDA architectures (no TORCH_CUDA_ARCH_LIST, no GPU): CMake's configure step only"
  default_dir=$root/build/cuda-default-arches
  rm -rf "$default_dir"
  (unset TORCH_CUDA_ARCH_LIST && "$venv/bin/cmake" -S "$root" -B "$default_dir" -G Ninja \
    -DPython_EXECUTABLE="$venv/bin/python" -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCUDA_nvrtc_LIBRARY="$site/nvidia/cu13/lib/libnvrtc.so.13") >"$default_dir.log" 2>&1 ||
    { cat "$default_dir.log"; exit 1; }
  rm -rf "$default_dir"
  grep -F "delaycomm: CUDA architectures 80-real;90-real;100-real;100-virtual (from the default list" \
    "$default_dir.log" || { cat "$default_dir.log"; echo "# unexpected default CUDA architectures" >&2; exit 1; }
  echo "# building delaycomm against torch $torch_version with $nvcc for TORCH_CUDA_ARCH_LIST=$arch_list (unoptimised: a compile check)"
  "$venv/bin/python" -m pip -q --disable-pip-version-check install --no-compile --no-build-isolation --no-deps \
    -Cbuild-dir="$root/build/torch-$torch_version" \
    -Ccmake.define.CMAKE_CUDA_COMPILER="$nvcc" \
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
  echo "# the CUDA architectures in the built module, against TORCH_CUDA_ARCH_LIST=$arch_list"
  site=$(site)
  "$venv/bin/python" -m pip -q --disable-pip-version-check install --no-compile 'nvidia-cuda-cuobjdump>=13,<14'
  cuobjdump=$(find "$site/nvidia" -name cuobjdump -type f | head -1)
  module=$(find "$site/delaycomm" -name '_C*.so' | head -1)
  "$venv/bin/python" - "$cuobjdump" "$module" "$arch_list" <<'PY'
import re, subprocess, sys
sys.path.insert(0, "build_backend")
import torch_info

cuobjdump, module, arch_list = sys.argv[1:]
expected = torch_info.parse_arch_list(arch_list)
listed = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", module], capture_output=True, text=True, check=True)
elf = sorted({m for m in re.findall(r"ELF file\s+\d+: .*\.sm_(\w+)\.cubin", listed.stdout)})
ptx = sorted({m for m in re.findall(r"PTX file\s+\d+: .*\.sm_(\w+)\.ptx", listed.stdout)})
want_elf = sorted(a.split("-")[0] for a in expected if a.endswith("-real"))
want_ptx = sorted(a.split("-")[0] for a in expected if a.endswith("-virtual"))
print(listed.stdout.strip())
assert (elf, ptx) == (want_elf, want_ptx), f"the module holds ELF {elf} and PTX {ptx}; expected ELF {want_elf}, PTX {want_ptx}"
print(f"# CUDA architectures OK: ELF sm_{', sm_'.join(elf)}; PTX {', '.join(ptx) or 'none'} (TORCH_CUDA_ARCH_LIST={arch_list})")
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
