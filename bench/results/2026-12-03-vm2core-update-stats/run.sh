#!/usr/bin/env bash
# Side by side in one run: main's build against the experiment branch's (README.md here says what each measures).
#   bench/results/2026-12-03-vm2core-update-stats/run.sh OUTDIR
set -euo pipefail
out=${1:?OUTDIR}
mkdir -p "$out"
branch=$(cd "$(dirname "$0")/../../.." && pwd)
main=${MAIN:-/work/main}
export OMP_NUM_THREADS=1
GATE=(--device cpu -b 8 -e 8 --paths sync,async_wait,future_then --calls 400 --blocks 30 --pin-cpu --progress off --runs 3)
log() { echo "# $(date -u +%T) loadavg $(cat /proc/loadavg) $*" | tee -a "$out/loadavg.txt"; }
for i in 1 2; do
  log "percall main $i"
  (cd "$main" && .venv/bin/python -m delaycomm.bench percall "${GATE[@]}" --json "$out/percall-main-$i.json") >"$out/percall-main-$i.txt" 2>&1
  log "percall branch $i"
  (cd "$branch" && .venv/bin/python bench/percall.py "${GATE[@]}" --json "$out/percall-branch-$i.json") >"$out/percall-branch-$i.txt" 2>&1
  log "engine main $i"
  (cd /tmp && "$main/.venv/bin/python" "$branch/bench/update_stats_cost.py" --off-only --json "$out/engine-main-$i.json") >"$out/engine-main-$i.txt" 2>&1
  log "engine branch $i"
  (cd /tmp && "$branch/.venv/bin/python" "$branch/bench/update_stats_cost.py" --json "$out/engine-branch-$i.json") >"$out/engine-branch-$i.txt" 2>&1
done
log "done"
