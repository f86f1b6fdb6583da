#!/usr/bin/env bash
# Lint and format checks: ruff (lint + format) for Python, clang-format for C++/CUDA, with the configuration in
# pyproject.toml ([tool.ruff]) and .clang-format; the tools are the versions pinned by the `lint` extra. Then the
# house's own two (docs/ci.md, "Lint"): no function over 110 lines (scripts/function_length.py), and the docs'
# links, result files and README length (scripts/check_docs.py); --fix cannot fix those.
#   scripts/lint.sh [--fix] [VENV]     --fix: apply the fixes and the formatting instead of reporting them
# CI runs the same three checks (scripts/test.sh, its lint stage).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
fix=0
if [ "${1:-}" = --fix ]; then fix=1; shift; fi
venv=${1:-$root/.venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "scripts/lint.sh: no virtual environment at $venv (run scripts/setup.sh, or pass one)" >&2
  exit 2
fi
mapfile -t tools < <(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["lint"]))')
# scripts/setup.sh installs them; a venv made otherwise gets them here (a no-op when the pinned versions are there)
"$venv/bin/python" -m pip -q --disable-pip-version-check install "${tools[@]}"
bin="$venv/bin"
mapfile -t cxx < <(git ls-files 'csrc/*.cpp' 'csrc/*.hpp' 'csrc/*.h' 'csrc/*.cu' 'csrc/*.cuh')
status=0
if [ $fix = 1 ]; then
  "$bin/ruff" check --fix . || status=1
  "$bin/ruff" format .
  "$bin/clang-format" -i "${cxx[@]}"
else
  "$bin/ruff" check . || status=1
  "$bin/ruff" format --check . || status=1
  "$bin/clang-format" --dry-run --Werror "${cxx[@]}" || status=1
fi
python3 scripts/function_length.py || status=1
python3 scripts/check_docs.py || status=1
exit $status
