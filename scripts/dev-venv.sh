#!/usr/bin/env bash
# Developer helper: a virtual environment for a second checkout (git worktree) that reuses the dependencies of
# an existing one (so no second torch install), with this checkout installed editable.
#   scripts/dev-venv.sh /path/to/main/.venv
set -euo pipefail
base=${1:?usage: scripts/dev-venv.sh BASE_VENV}
here=$(cd "$(dirname "$0")/.." && pwd)
python3 -m venv "$here/.venv"
site=$("$here/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
basesite=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$basesite" > "$site/_base_venv.pth"
ln -sf "$base/bin/cmake" "$base/bin/ninja" "$here/.venv/bin/"
# Run tools as modules of this venv: .venv/bin/python -m pytest, .venv/bin/python -m torch.distributed.run
cd "$here" && "$here/.venv/bin/python" -m pip install -q --no-build-isolation --no-deps -e .
