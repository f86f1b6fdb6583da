#!/usr/bin/env bash
# The whole test suite from nothing, as CI runs it (.ci/run): set-up, lint, the tests and the benchmark suite as a
# smoke test, and the performance gate; with --cuda also (where nvcc is present) the proof that the CUDA sources
# compile against a CUDA build of torch. Each stage prints its wall-clock and CPU seconds; docs/ci.md says what
# each costs and why.
#
# The gate runs last, on a quiet machine. With --cuda, the CUDA check (its venv with a 5.5 GB torch, the build,
# the import and its few tests) runs in the background, at low priority, while the CPU build and the tests run.
#   scripts/test.sh [--slow] [--cuda]
#   --slow                        also run the tests marked slow (pytest -m slow: torchrun runs of the acceptance
#                                 scripts, long soak tests); the default run deselects them, and docs/ci.md lists
#                                 each one and the default-run test that covers its feature
#   --cuda                        also run the CUDA compile check (scripts/cuda-check.sh; about 230 CPU seconds,
#                                 which a 2-core machine cannot hide: docs/ci.md, "The CUDA compile check");
#                                 DELAYCOMM_CUDA_CHECK=1 does the same
#   DELAYCOMM_TEST_WORKERS=N      pytest workers of the test stage (default 4; 0: one process)
set -euo pipefail
slow=0 cuda=${DELAYCOMM_CUDA_CHECK:-0}
for arg in "$@"; do
  case "$arg" in
    --slow) slow=1 ;;
    --cuda) cuda=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument '$arg'; expected --slow or --cuda" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/lib.sh
py="$root/.venv/bin/python"
export OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=1
# Python's bytecode cache, kept in build/ (never beside the sources). Where PYTHONDONTWRITEBYTECODE is set (this
# project's machines set it), no cache is written, and every interpreter compiles torch's sources again: `import
# torch` takes 6 s of CPU instead of under 2 s. The test stage starts many interpreters (docs/ci.md, "Stages").
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$root/build/pycache"
torch_cpu=$(pyproject torch-cpu)
mkdir -p build

export STAGE_LOG="$root/build/stages.txt"
: >"$STAGE_LOG"
rm -f build/cuda-check.status
cuda_pid=
finish() {
  local rc=$?
  if [ -n "$cuda_pid" ] && kill -0 "$cuda_pid" 2>/dev/null; then
    kill -- "-$cuda_pid" 2>/dev/null || true  # the background job's process group (a failed stage ended the run)
  fi
  stage_summary
  return $rc
}
trap finish EXIT
if [ "$cuda" = 1 ] && ! command -v "${CUDACXX:-nvcc}" >/dev/null; then
  echo "# CUDA compile check skipped: no nvcc on PATH"
elif [ "$cuda" = 1 ]; then
  echo "# CUDA compile check: venv, build, import and tests started in the background (log: build/cuda-check.log)"
  # NOTE: the second half (import the CUDA build, run a few CPU tests against it) follows the build in the
  # background too: it needs nothing of the foreground's, and at nice 10 it takes what the test workers leave.
  # NOTE: setsid makes the job a session of its own, for the kill in finish(). Where the kernel groups the
  # scheduling by session (sched_autogroup, on by default), a session gets an equal share of the CPU whatever its
  # processes' nice: the job at nice 10 took half of the 2 cores, more than the set-up's build (docs/ci.md, "The
  # background job's priority"). The session's own nice (its autogroup's) makes it yield.
  setsid nice -n 10 bash -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null || true; . scripts/lib.sh; rc=0
    stage "CUDA compile check: venv and build (background, nice 10)" scripts/cuda-check.sh prepare || rc=$?
    if [ $rc = 0 ]; then
      stage "CUDA compile check: import and CPU tests (background, nice 10)" scripts/cuda-check.sh test || rc=$?
    fi
    echo $rc >build/cuda-check.status' >build/cuda-check.log 2>&1 &
  cuda_pid=$!
fi
# The background job's outcome, once it has one (its log goes to this log then).
cuda_prepared() {
  while [ ! -s build/cuda-check.status ] && kill -0 "$cuda_pid" 2>/dev/null; do sleep 1; done
  sleep 1  # the status is written just before the job exits
  cat build/cuda-check.log
  [ -s build/cuda-check.status ] || { echo "the background job ended without a status" >&2; return 1; }
  return "$(cat build/cuda-check.status)"
}

stage "set-up: venv, torch $torch_cpu, build" scripts/setup.sh
# Lint and format (pyproject.toml's [tool.ruff], .clang-format; the versions pinned by the `lint` extra): the tree
# passes all three, and scripts/lint.sh --fix makes a change pass them. Then no function over 110 lines, and the
# docs' links, result files and README length (docs/ci.md, "Lint"), which need a person to fix.
lint() {
  "$root/.venv/bin/ruff" check --no-cache "$root" &&
    "$root/.venv/bin/ruff" format --check --no-cache "$root" &&
    git ls-files -z 'csrc/*.cpp' 'csrc/*.hpp' 'csrc/*.h' 'csrc/*.cu' 'csrc/*.cuh' |
    xargs -0 "$root/.venv/bin/clang-format" --dry-run --Werror &&
    "$py" scripts/function_length.py &&
    "$py" scripts/check_docs.py
}
stage "lint: ruff, clang-format, function length, docs" lint
# One pytest run for the tests and the benchmark suite (benchmarking disabled: it keeps the suite from rotting), on
# four workers on two cores (pytest-xdist): most tests wait on ranks, sleeps or timeouts (docs/ci.md, "Stages").
# --dist loadfile: a file's tests stay on one worker, so a module's fixtures (a measured baseline, a group of
# ranks) run once; --no-loadscope-reorder: the files go out in the collection's order, the slowest first
# (tests/conftest.py, SLOWEST_FIRST). DELAYCOMM_TEST_WORKERS=0 runs them in one process.
# The tests marked slow run with --slow only (docs/ci.md, "The default run and --slow").
workers=${DELAYCOMM_TEST_WORKERS:-4}
unset_script_knobs
if [ $slow = 1 ]; then
  selection=() what="all tests, slow ones included"
else
  selection=(-m "not slow") what="without the slow ones"
fi
stage "tests and benchmark smoke ($what)" \
  "$py" -m pytest tests bench -q -p no:cacheprovider --benchmark-disable --durations=20 \
  -n "$workers" --dist loadfile --no-loadscope-reorder "${selection[@]}"

if [ -n "$cuda_pid" ]; then
  stage "CUDA compile check: waiting for the background job" cuda_prepared
  wait "$cuda_pid"
fi
if [ -x .ci/bench-gate.sh ]; then
  stage "performance gate against the committed baseline" .ci/bench-gate.sh "$py"
fi
