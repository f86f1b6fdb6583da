#!/usr/bin/env bash
# Side by side: main (7e63820) then this branch, per shape; the load before each run is in its record.
set -e
# Run from the repository root; MAIN and SEAM are the two virtual environments (a main checkout's and this branch's).
MAIN=${MAIN:-/work/main/.venv} SEAM=${SEAM:-.venv}
for shape in buckets metadata; do
  for who in main seam; do
    py=$MAIN/bin/python; [ $who = seam ] && py=$SEAM/bin/python
    OMP_NUM_THREADS=1 $py bench/big_profile.py --mib 63 --shape $shape --json bench/results/2026-12-03-vm2core-seam/$who-$shape.json > bench/results/2026-12-03-vm2core-seam/$who-$shape.txt 2>&1
  done
done
