#!/usr/bin/env bash
# Creates (or reuses) a virtual environment with torch and the tools, and builds delaycomm into it.
#   scripts/setup.sh [VENV [TORCH_VERSION]]      defaults: .venv 2.13.0
# NOTE: delaycomm compiles against the installed torch, so it is built with --no-build-isolation (an isolated
# build environment would pull a multi-GB CUDA torch from the index).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv}
torch_version=${2:-2.13.0}
py=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  echo "# creating $venv" >&2
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  echo "# installing torch==$torch_version" >&2
  "${pip[@]}" install "torch==$torch_version"
fi
echo "# installing build and test requirements" >&2
"${pip[@]}" install "numpy>=1.24" "scikit-build-core>=0.10" "cmake>=4.0" ninja pybind11 \
  "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100" "pytest-benchmark>=4" "scipy>=1.10" \
  "scikit-learn>=1.3" "matplotlib>=3.7" "tqdm>=4.60"
if [ "${DELAYCOMM_NO_BUILD:-0}" = 1 ]; then
  exit 0
fi
echo "# building delaycomm against torch $torch_version" >&2
build_dir=${DELAYCOMM_BUILD_DIR:-$root/build/torch-$torch_version}
"${pip[@]}" install --no-build-isolation --no-deps -Cbuild-dir="$build_dir" "$root"
