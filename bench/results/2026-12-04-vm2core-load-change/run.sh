#!/usr/bin/env bash
# The load change during a replay: the shipped estimate (decayed) and a cumulative one, alternated.
set -u
OUT=${1:?OUT}
cd "$(dirname "$0")/../../.."
export PYTHONPYCACHEPREFIX=$PWD/build/pycache; unset PYTHONDONTWRITEBYTECODE
for round in 1 2; do
  for v in decayed cumulative; do
    pp=""; [ $v = cumulative ] && pp=${CUMULATIVE:?the cumulative build, pip install --target (README.md)}
    echo "### round $round $v $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp .venv/bin/python bench/roundtrip.py --calls 3000 --jobs A,B --replay-load 1 --load-at 1000 \
      --window 500 --out "$OUT/$v-$round" | tail -16
  done
done
