#!/usr/bin/env bash
# The timeline of docs/telemetry.md ("Timeline"): the demo (examples/train_ddp.py, unmodified) on 2 ranks under
# torchrun, 30 steps, exp:p99=20ms on 30% of the calls, ssp:2; each rank writes DELAYCOMM_TRACE, then
# `python -m delaycomm timeline` merges them and draws docs/telemetry-timeline.png.
#   bench/results/2026-12-06-vm2core-timeline/run.sh   (from the repository root, with .venv built)
set -euo pipefail
here=bench/results/2026-12-06-vm2core-timeline
py=${PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
DELAYCOMM_TRACE="$tmp/timeline-{rank}.json" DELAYCOMM_DELAY=exp:p99=20ms DELAYCOMM_DELAY_FRACTION=0.3 \
  DELAYCOMM_STALENESS=ssp:2 DELAYCOMM_SEED=7 OMP_NUM_THREADS=1 \
  "$py" -m torch.distributed.run --standalone --nproc_per_node 2 examples/train_ddp.py --steps 30 >"$here/run-output.txt" 2>&1
"$py" -m delaycomm timeline "$tmp"/timeline-0.json "$tmp"/timeline-1.json -o "$here/merged.json" \
  --png docs/telemetry-timeline.png | tee -a "$here/run-output.txt"
rm -rf "$tmp"
