#!/usr/bin/env bash
# The per-call gate's measurement, main and this branch alternating (main, seam, main, seam), side by side in one
# session: bench/percall.py with .ci/bench-gate.sh's settings (5 runs), each in its own checkout and venv. The load
# before and after each run is in percall-log.txt. Compare a pair with the gate's rule:
#   .venv/bin/python bench/percall.py --from-json percall-seam-1.json --compare percall-main-1.json --confirm 0
set -u
MAIN=${MAIN:-/work/main} SEAM=${SEAM:-/work/wt/seam} OUT=${OUT:-/tmp/pc}
ARGS=(--device cpu -b 8 -e 8 --paths sync,async_wait,future_then --calls 400 --blocks 30 --pin-cpu --progress off --runs 5)
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
for i in 1 2; do
  for who in main seam; do
    dir=$MAIN; [ $who = seam ] && dir=$SEAM
    cd "$dir"
    echo "== $who $i start $(date -u +%T) loadavg $(cat /proc/loadavg)" >> "$OUT/log.txt"
    s=$SECONDS
    .venv/bin/python bench/percall.py "${ARGS[@]}" --json "$OUT/$who-$i.json" > "$OUT/$who-$i.txt" 2>&1
    echo "== $who $i rc $? $((SECONDS-s)) s end loadavg $(cat /proc/loadavg)" >> "$OUT/log.txt"
  done
done
