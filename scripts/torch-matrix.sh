#!/usr/bin/env bash
# The torch range pyproject.toml claims, tried: builds delaycomm against each torch release given and runs a fast
# subset of the tests against it (docs/install.md, "Supported torch releases"). Run it outside CI (each release is a
# venv of its own, a torch install and a full build: minutes each), one release after the other.
#   scripts/torch-matrix.sh OUT_DIR VERSION...     e.g. scripts/torch-matrix.sh bench/results/DATE-matrix 2.13.0
# For each VERSION: OUT_DIR/torch-VERSION.log (the install, the build and the tests) and a line in OUT_DIR/summary.txt.
# The venv is build/matrix/VERSION, removed at the end (a CUDA torch with its libraries is GBs).
# NOTE: where pip serves a CUDA build of torch, delaycomm is built without its CUDA sources
# (DELAYCOMM_FORCE_CPU=ON): this is about torch's C++ API; scripts/cuda-check.sh compiles the CUDA sources.
# NOTE: where the machine's pip configuration caps the torch releases (a constraints file), lift it for the run
# (PIP_CONSTRAINT= scripts/torch-matrix.sh ...) to try one past it.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: scripts/torch-matrix.sh OUT_DIR VERSION...}
shift
[ $# -gt 0 ] || { echo "usage: scripts/torch-matrix.sh OUT_DIR VERSION..." >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
. scripts/lib.sh
# The subset: the backend end to end against Gloo (every collective, the options, registration through the entry
# point), the owners of stale reductions (FSDP/DDP internals of that torch), and the install checks.
tests=(tests/backend/test_collectives.py tests/backend/test_registration.py tests/stale/test_owners.py
  tests/install/test_build_backend.py)
rc_all=0
for version in "$@"; do
  venv=$root/build/matrix/$version
  log=$out/torch-$version.log
  rm -rf "$venv"
  {
    echo "# torch $version: $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench/results' || echo ' (with changes)')"
  } >"$log"
  status=ok
  if ! (export DELAYCOMM_BUILD_ARGS="-Ccmake.define.DELAYCOMM_FORCE_CPU=ON"
    stage "torch $version: venv, install, build" scripts/setup.sh "$venv" "$version") >>"$log" 2>&1; then
    status="build FAILED"
  else
    "$venv/bin/python" -c 'import torch, delaycomm, importlib.metadata as m
print("# torch", torch.__version__, "(CUDA", torch.version.cuda, ") delaycomm built for", delaycomm._built_for.TORCH_VERSION,
      "requires", [r for r in m.requires("delaycomm") if r.startswith("torch")])' >>"$log" 2>&1 || status="import FAILED"
    if [ "$status" = ok ]; then
      (unset_script_knobs && OMP_NUM_THREADS=1 stage "torch $version: tests" "$venv/bin/python" -m pytest -q \
        -p no:cacheprovider -n 2 --dist loadfile -m "not slow" "${tests[@]}") >>"$log" 2>&1 || status="tests FAILED"
    fi
    if [ "$status" = "tests FAILED" ]; then
      # Once more, the failed tests alone, in one process (a loaded machine times out multi-rank tests): both
      # results stay in the log and the summary.
      mapfile -t failed < <(sed -n 's/^FAILED \([^ ]*\).*/\1/p' "$log" | sort -u)
      first=$(grep -E '^[0-9]+ (passed|failed)|[0-9]+ failed' "$log" | tail -1)
      if (unset_script_knobs && OMP_NUM_THREADS=1 stage "torch $version: the failed tests again" \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider "${failed[@]}") >>"$log" 2>&1; then
        status="ok on the rerun of ${failed[*]} (first run: $first)"
      fi
    fi
  fi
  sed -i "/^WARNING: Location 'file:/d" "$log"  # pip's notes on this machine's local package folders
  line="torch $version: $status; $(grep -E '^[0-9]+ (passed|failed)|[0-9]+ passed' "$log" | tail -1)"
  echo "$line" | tee -a "$out/summary.txt"
  [ "$status" = ok ] || rc_all=1
  rm -rf "$venv"
done
exit $rc_all
