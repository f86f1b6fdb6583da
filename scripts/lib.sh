# Shared by the scripts (sourced, not run): the project's settings from pyproject.toml, and stage timing.

# pyproject KEY: a setting of pyproject.toml. KEY is one of
#   torch-cpu, torch-cuda   [tool.delaycomm.ci]: the torch releases CI builds and tests against
#   requirements            everything scripts/setup.sh installs besides torch, one per line: the build tools
#                           ([tool.delaycomm] build-tools), the runtime dependencies and the `test` and `lint`
#                           extras
pyproject() {
  python3 - "$root/pyproject.toml" "$1" <<'PY'
import re
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    sys.exit("scripts: reading pyproject.toml needs Python >= 3.11 as python3 (tomllib)")

with open(sys.argv[1], "rb") as f:
    doc = tomllib.load(f)
key = sys.argv[2]
if key in ("torch-cpu", "torch-cuda"):
    print(doc["tool"]["delaycomm"]["ci"][key])
elif key == "requirements":
    runtime = [r for r in doc["project"]["dependencies"] if not re.match(r"torch\b", r)]
    extras = doc["project"]["optional-dependencies"]
    build = doc["tool"]["delaycomm"]["build-tools"]
    print("\n".join(build + runtime + extras["test"] + extras["lint"]))
else:
    sys.exit(f"scripts: unknown pyproject key {key!r}")
PY
}

# stage NAME COMMAND...: run COMMAND as one stage of a script (in a subshell), then print its wall-clock and CPU
# seconds: the CPU time of every process it ran, and of nothing else (a background job of the script is not
# counted; on a machine shared with other work, CPU time is the figure that compares). The line also goes to
# $STAGE_LOG when set, for stage_summary (a background job appends its own line there).
stage() {
  local name=$1
  shift
  echo "# ---- $name"
  local t0 rc=0 cpu_file
  cpu_file=$(mktemp)
  t0=$(date +%s.%N)
  (
    rc=0
    "$@" || rc=$?
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($16 + $17) / hz }' "/proc/$BASHPID/stat" >"$cpu_file"
    exit $rc
  ) || rc=$?
  local line
  line=$(awk -v n="$name" -v t0="$t0" -v t1="$(date +%s.%N)" -v cpu="$(cat "$cpu_file")" \
    'BEGIN { printf "%-62s %7.1f s wall %7.1f s CPU", n, t1 - t0, cpu }')
  rm -f "$cpu_file"
  [ $rc = 0 ] || line="$line  FAILED (exit $rc)"
  echo "# ---- $line"
  if [ -n "${STAGE_LOG:-}" ]; then echo "$line" >>"$STAGE_LOG"; fi
  return $rc
}

# stage_summary: the table of the stages in $STAGE_LOG, and the load average (wall-clock figures depend on it).
stage_summary() {
  echo "# ---- stages (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
  if [ -n "${STAGE_LOG:-}" ] && [ -f "$STAGE_LOG" ]; then sed 's/^/#   /' "$STAGE_LOG"; fi
}

# unset_script_knobs: takes the scripts' own DELAYCOMM_* knobs out of the environment. delaycomm rejects every
# DELAYCOMM_* variable it does not know (a typo would otherwise be ignored), so the tests, tools and gates these
# scripts run must not see them: call this after the last use of a knob, before running Python.
unset_script_knobs() {
  unset DELAYCOMM_BUILD_ARGS DELAYCOMM_BUILD_DIR DELAYCOMM_CUDA_VENV DELAYCOMM_NO_BUILD DELAYCOMM_CUDA_CHECK \
    DELAYCOMM_TEST_WORKERS
}
