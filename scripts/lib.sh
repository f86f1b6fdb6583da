# Shared by the scripts (sourced, not run): the project's settings from pyproject.toml, and stage timing.

# pyproject KEY: a setting of pyproject.toml. KEY is one of
#   torch-cpu, torch-cuda   [tool.delaycomm.ci]: the torch releases CI builds and tests against
#   requirements            everything scripts/setup.sh installs besides torch, one per line: the build
#                           requirements, the runtime dependencies and the `test` extra
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
    print("\n".join(doc["build-system"]["requires"] + runtime + doc["project"]["optional-dependencies"]["test"]))
else:
    sys.exit(f"scripts: unknown pyproject key {key!r}")
PY
}

# stage NAME COMMAND...: run COMMAND as one stage of a script, then print its wall-clock and CPU seconds (the CPU
# time of every process it ran; on a machine shared with other work, CPU time is the figure that compares).
_stage_lines=()
stage() {
  local name=$1
  shift
  echo "# ---- $name"
  local t0 c0 rc=0
  t0=$(date +%s.%N)
  c0=$(_children_cpu)
  "$@" || rc=$?
  local line
  line=$(awk -v n="$name" -v t0="$t0" -v t1="$(date +%s.%N)" -v c0="$c0" -v c1="$(_children_cpu)" \
    'BEGIN { printf "%-58s %7.1f s wall %7.1f s CPU", n, t1 - t0, c1 - c0 }')
  _stage_lines+=("$line")
  echo "# ---- $line$([ $rc = 0 ] || echo "  FAILED (exit $rc)")"
  return $rc
}

# stage_summary: the table of every stage so far (and the load average, which the wall-clock figures depend on).
stage_summary() {
  echo "# ---- stages (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
  printf '#   %s\n' "${_stage_lines[@]}"
}

# CPU seconds (user + system) of the waited-for children of the script's shell, from /proc (fields 16 and 17).
# NOTE: $$, not $BASHPID: this runs in a command substitution, whose own process has no children of note.
_children_cpu() {
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($16 + $17) / hz }' "/proc/$$/stat"
}
