#!/usr/bin/env bash
# Runs delaycomm with the front ends CI does not install (docs/ecosystem.md). Not part of CI.
#   scripts/ecosystem-check.sh [BASE_VENV] [--deepspeed-staleness | --trainer-staleness | CHECK_ARGS...]
# BASE_VENV: a venv with torch and delaycomm (default: .venv); CHECK_ARGS go to check.py (--only NAME, --keep DIR). Makes (once) .venv-ecosystem: BASE_VENV's packages
# plus accelerate, transformers, pytorch-ignite, lightning and deepspeed from the registry, with torch held at
# BASE_VENV's version (pip would otherwise pull another torch build for them).
#
# By default: examples/ecosystem/check.py, every recipe (accelerate, transformers Trainer, ignite, Lightning,
# DeepSpeed ZeRO-2 and -3, torchrun restarts) on delaycomm and on gloo, 2 ranks on CPU; prints one table (front
# end, version, delaycomm's calls, ranks' parameters equal, equal to gloo's, verdict) and exits 1 if a check fails.
#
# --deepspeed-staleness: instead, delaycomm's staleness on DeepSpeed (docs/staleness.md, "Which reductions go
# stale"): ZeRO stages 0-3, each under bsp and under ssp:2 with the same delay, fraction and seed, as a user runs them
# (deepspeed.init_distributed(dist_backend="delaycomm"), only DELAYCOMM_* set, step_ms=auto); prints, per stage,
# rank 0's reduction counters (calls, delayed, stale, kept fresh), final losses and why reductions were kept fresh
# (each distinct one-time warning's reason). About 20 minutes on 2 cores.
#
# --trainer-staleness: instead, transformers' Trainer (examples/ecosystem/trainer_job.py) under ssp:2 with
# stale_policy=apply, 60 steps, with TrainingArguments' default ddp_find_unused_parameters, with False, and with the
# default and ddp_static_graph=True (the recipes in docs/ecosystem.md); prints rank 0's counters and why reductions
# were kept fresh. A few minutes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
base=$root/.venv
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  base=$1
  shift
fi
mode=recipes
if [ "${1:-}" = --deepspeed-staleness ]; then
  mode=staleness
  shift
elif [ "${1:-}" = --trainer-staleness ]; then
  mode=trainer
  shift
fi
venv=$root/.venv-ecosystem
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  basesite=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # addsitedir also reads BASE_VENV's own .pth files (its editable delaycomm, its own base venv).
  echo "import site; site.addsitedir('$basesite')" > "$site/_base_venv.pth"
  constraints=$(mktemp)
  "$base/bin/python" -c 'import torch; print(f"torch=={torch.__version__}")' > "$constraints"
  nice "$venv/bin/python" -m pip install -q -c "$constraints" accelerate transformers pytorch-ignite lightning deepspeed
  rm -f "$constraints"
fi
py=$venv/bin/python

if [ "$mode" = recipes ]; then
  exec nice "$py" examples/ecosystem/check.py "$@"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The distinct reasons of the one-time "kept fresh" warnings in a job's output, one line each.
kept_fresh_reasons() {
  grep -o "staleness on group .* kept fresh (delayed as under bsp, never stale): .*\. Reductions kept fresh" "$1" |
    sed -e "s/^staleness on group '[^']*': /    kept fresh: /" -e 's/ kept fresh (delayed as under bsp, never stale)//' \
      -e 's/\. Reductions kept fresh$//' | sort -u || true
}

if [ "$mode" = trainer ]; then
  echo "# delaycomm ecosystem check: transformers Trainer on CPU, 2 ranks, 60 steps"
  versions=$("$py" -c 'import torch, transformers, delaycomm
print(f"torch {torch.__version__}, transformers {transformers.__version__}, delaycomm {delaycomm.__version__}")' \
    2>/dev/null | tail -1)
  echo "# $versions; $(nproc) cores"
  echo "# DELAYCOMM_DELAY=exp:p99=30ms DELAYCOMM_DELAY_FRACTION=0.3 DELAYCOMM_STALENESS=ssp:2 DELAYCOMM_STALE_POLICY=apply"
  for run in default false default:static; do
    unused=${run%%:*} extra=() label="ddp_find_unused_parameters=$unused"
    if [ "$run" != "$unused" ]; then
      extra=(--static-graph) label="$label ddp_static_graph=True"
    fi
    dir=$out/trainer-${run/:/-}
    env -u DELAYCOMM_STATS OMP_NUM_THREADS=1 DELAYCOMM_DELAY=exp:p99=30ms DELAYCOMM_DELAY_FRACTION=0.3 \
      DELAYCOMM_STALENESS=ssp:2 DELAYCOMM_STALE_POLICY=apply \
      timeout 600 "$py" -m torch.distributed.run --standalone --nproc_per_node 2 \
      examples/ecosystem/trainer_job.py --steps 60 --find-unused-parameters "$unused" "${extra[@]}" --out "$dir" \
      > "$out/log" 2>&1 || {
      echo "$label: FAILED"
      tail -30 "$out/log"
      continue
    }
    "$py" - "$dir/rank0.json" "$label" <<'PY'
import json
import sys

d = json.load(open(sys.argv[1]))["delaycomm"]
print(
    f"{sys.argv[2]:56s} | delaycomm calls {d['calls']} delayed {d['delayed_calls']} "
    f"stale {d['stale_calls']} kept_fresh {d['kept_fresh_calls']} | ops {d['ops']}"
)
PY
    kept_fresh_reasons "$out/log"
  done
  exit 0
fi

echo "# delaycomm ecosystem check: DeepSpeed ZeRO on CPU, 2 ranks, 60 steps"
versions=$(DS_ACCELERATOR=cpu "$py" -c 'import torch, deepspeed, delaycomm
print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, delaycomm {delaycomm.__version__}")' 2>/dev/null |
  tail -1)
echo "# $versions; $(nproc) cores"
echo "# DELAYCOMM_DELAY=exp:p99=30ms DELAYCOMM_DELAY_FRACTION=0.3 DELAYCOMM_STALENESS=bsp | ssp:2"
# Each stage with DeepSpeed's default buckets (a small model's gradients are reduced after the backward pass) and
# with reduce_bucket_size=256 elements (reduced in the backward pass, from DeepSpeed's gradient hooks).
for run in 0:default 0:256 1:default 1:256 2:default 2:256 3:default 3:256; do
  stage=${run%%:*} bucket=${run#*:}
  extra=()
  [ "$bucket" = default ] || extra=(--reduce-bucket-size "$bucket")
  for staleness in bsp ssp:2; do
    dir=$out/${staleness/:/}-$bucket
    env -u DELAYCOMM_STATS DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 DELAYCOMM_DELAY=exp:p99=30ms \
      DELAYCOMM_DELAY_FRACTION=0.3 DELAYCOMM_STALENESS=$staleness \
      timeout 600 "$py" -m torch.distributed.run --standalone --nproc_per_node 2 \
      tests/stale/scripts/deepspeed_job.py --stage "$stage" --out "$dir" "${extra[@]}" > "$out/log" 2>&1 || {
      echo "zero$stage $staleness: FAILED"
      tail -30 "$out/log"
      continue
    }
    "$py" - "$dir/zero$stage.rank0.json" "$stage" "$staleness" "buckets=$bucket" <<'PY'
import json
import sys

doc = json.load(open(sys.argv[1]))
losses = doc["losses"]
final = sum(losses[-10:]) / 10
totals = {}
for group in doc["stats"].values():
    for op, o in group["ops"].items():
        t = totals.setdefault(op, [0, 0, 0, 0])
        for i, k in enumerate(("calls", "delayed_calls", "stale_calls", "kept_fresh_calls")):
            t[i] += o.get(k, 0)
parts = [f"{op}: calls {c} delayed {d} stale {s} kept_fresh {f}" for op, (c, d, s, f) in sorted(totals.items())]
print(f"zero{sys.argv[2]} {sys.argv[3]:6s} {sys.argv[4]:>14s} final loss {final:.4f} | " + " | ".join(parts))
PY
    kept_fresh_reasons "$out/log"
  done
done
