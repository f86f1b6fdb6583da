#!/usr/bin/env bash
# The engine's default path (update_stats off), main's build against the branch's, in alternating short processes
# (a round: one of each, the order swapped every round), so that the machine's load changes hit both alike.
#   bench/results/2026-12-03-vm2core-update-stats/engine_rounds.sh OUTDIR [ROUNDS]
set -euo pipefail
out=${1:?OUTDIR}
rounds=${2:-8}
mkdir -p "$out"
branch=$(cd "$(dirname "$0")/../../.." && pwd)
main=${MAIN:-/work/main}
label=${LABEL:-main}  # the name of the other build in the files (LABEL=base MAIN=<a checkout of 7e63820>)
export OMP_NUM_THREADS=1
one() {  # one(label venv round)
  (cd /tmp && "$2/.venv/bin/python" -W ignore "$branch/bench/update_stats_cost.py" --off-only --blocks 5 --calls 100 \
    --json "$out/rounds-$1-$3.json") >"$out/rounds-$1-$3.txt" 2>&1
}
for r in $(seq 1 "$rounds"); do
  echo "# $(date -u +%T) loadavg $(cat /proc/loadavg) round $r" | tee -a "$out/loadavg.txt"
  if (( r % 2 )); then one "$label" "$main" "$r"; one "branch-vs-$label" "$branch" "$r"; else one "branch-vs-$label" "$branch" "$r"; one "$label" "$main" "$r"; fi
done
python3 - "$out" "$rounds" "$label" <<'PY'
import json, statistics, sys
out, rounds, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for size in ("1024", "1048576"):
    for m in ("wall_s", "cpu_s"):
        r = [json.load(open(f"{out}/rounds-branch-vs-{label}-{i}.json"))["median"][f"{size}/off"][m]
             / json.load(open(f"{out}/rounds-{label}-{i}.json"))["median"][f"{size}/off"][m] for i in range(1, rounds + 1)]
        print(f"bucket {size:>8} {m}: branch/{label} per round median {statistics.median(r):.3f}, min {min(r):.3f}, max {max(r):.3f}")
PY
