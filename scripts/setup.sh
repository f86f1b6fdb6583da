#!/usr/bin/env bash
# Creates (or reuses) a virtual environment with torch and the tools, and builds delaycomm into it.
#   scripts/setup.sh [VENV [TORCH_VERSION]]      defaults: .venv, and torch-cpu of pyproject.toml
# What it installs besides torch is pyproject.toml's list (the build tools of [tool.delaycomm], the dependencies,
# the `test` and `lint` extras: the linters are small wheels, and CI lints in the same venv).
#   DELAYCOMM_NO_BUILD=1     install only
#   DELAYCOMM_BUILD_DIR=DIR  the build directory (default build/torch-VERSION)
#   DELAYCOMM_BUILD_ARGS     more arguments for `pip install` of delaycomm (e.g. -Ccmake.define.X=Y)
# NOTE: built with --no-build-isolation: the build tools are installed here already, and an incremental build keeps
# its build directory (docs/install.md says how users install: plain `pip install .` works too).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
venv=${1:-$root/.venv}
torch_version=${2:-$(pyproject torch-cpu)}
py=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  echo "# creating $venv" >&2
  "$py" -m venv "$venv"
fi
# --no-compile: no .pyc for all of torch up front; Python writes them for what is imported, when it is (scripts/test.sh
# keeps them in build/pycache, also where PYTHONDONTWRITEBYTECODE is set).
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
mapfile -t requirements < <(pyproject requirements)
echo "# installing torch==$torch_version and ${#requirements[@]} build, test and lint requirements (pyproject.toml)" >&2
"${pip[@]}" install --no-compile "torch==$torch_version" "${requirements[@]}"
if [ "${DELAYCOMM_NO_BUILD:-0}" = 1 ]; then
  exit 0
fi
echo "# building delaycomm against torch $torch_version" >&2
build_dir=${DELAYCOMM_BUILD_DIR:-$root/build/torch-$torch_version}
# shellcheck disable=SC2086 # DELAYCOMM_BUILD_ARGS is a list of arguments
"${pip[@]}" install --no-compile --no-build-isolation --no-deps -Cbuild-dir="$build_dir" \
  ${DELAYCOMM_BUILD_ARGS:-} "$root"
