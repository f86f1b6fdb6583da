#!/usr/bin/env bash
# The GPU check, prepared to run once on a GPU machine (one GPU: NCCL at world size 1) in under 6 minutes:
#   1. builds delaycomm with its CUDA sources against the machine's python3 (torch + CUDA 13),
#   2. runs the GPU tests (tests/gpu, tests/delay/test_gpu.py, the CUDA cases of tests/kernels),
#   3. the fused-kernel bandwidth benchmark (vs device copy and unfused torch ops, 64 MiB-1 GiB, fp32 and bf16),
#   4. the sleep-kernel precision benchmark,
#   5. the all-reduce sweep with NCCL at world size 1, allreduce:tree vs auto, capturing NCCL's INFO/TUNING lines,
# and writes everything to $OUT (default ./out): one gpu_check.json and a short summary.txt. Exits non-zero when
# any GPU test fails or any step breaks (the summary says which).
#
#   bench/gpu_check.sh              on the GPU machine
#   bench/gpu_check.sh --dry-run    here, without a GPU: checks the script, the tools' flags and the CPU parts
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/out}
mkdir -p "$out"
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
py=${PYTHON:-python3}
status=0
steps=()
step() {  # step NAME COMMAND...: runs, logs to $out/NAME.log, records the exit code
  local name=$1; shift
  local t0=$(date +%s)
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  steps+=("$name:$rc:$(( $(date +%s) - t0 ))")
  [ $rc -ne 0 ] && status=1
  echo "# $name: exit $rc ($(( $(date +%s) - t0 )) s)"
  return $rc
}

"$py" - > "$out/environment.json" <<'PY'
import json, platform, subprocess, torch
env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
       "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
       "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None}
try:
    env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20).stdout.strip() or None
except Exception:  # noqa: BLE001
    env["driver"] = None
print(json.dumps(env))
PY
cat "$out/environment.json"

if [ $dry = 0 ]; then
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  step build "$py" -m pip install -q --no-build-isolation --no-deps -t /tmp/dcpkg \
    -Ccmake.define.CMAKE_CUDA_COMPILER="$nvcc" -Cbuild-dir=/tmp/dcbuild . || { echo "build failed"; exit 1; }
  export PYTHONPATH=/tmp/dcpkg${PYTHONPATH:+:$PYTHONPATH}
  gpu_tests=(tests/gpu tests/delay/test_gpu.py tests/kernels -m gpu)
  sizes=(--sizes 64M,256M,1G)
else
  gpu_tests=(tests/gpu tests/delay/test_gpu.py --co)
  sizes=(--sizes 1M --iters 2 --rounds 1)
fi
export TORCH_DEVICE_BACKEND_AUTOLOAD=0 PYTHONUNBUFFERED=1

step gpu_tests "$py" -m pytest -q -p no:cacheprovider -o addopts="" "${gpu_tests[@]}"
kdev=cuda; [ $dry = 1 ] && kdev=cpu
step kernels_fp32_bf16 "$py" bench/kernel_bandwidth.py --device $kdev "${sizes[@]}" --dtypes float32,bfloat16 \
  --stale 1 --json "$out/kernels.json"
if [ $dry = 0 ]; then
  step delay_precision "$py" bench/delay_precision.py --gpu --samples 200 --json "$out/delay_precision.json"
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING step allreduce_sweep "$py" -m delaycomm.bench --device cuda \
    --nproc 1 -b 8 -e 256M -f 4 -n 20 -w 5 -r 3 --nccl-algo allreduce:tree --nccl-algo auto \
    --json "$out/allreduce_sweep.json" --plot "$out/allreduce_sweep.png" --progress off
  grep -hE "NCCL INFO.*(Algo|algorithm|TUNING|Tree|Ring|NCCL_ALGO|NCCL_BUFFSIZE)" "$out/allreduce_sweep.log" \
    | sort | uniq -c | sort -rn | head -40 > "$out/nccl_algo_lines.txt"
else
  step delay_precision "$py" bench/delay_precision.py --help
  step allreduce_sweep "$py" -m delaycomm.bench --device cpu --nproc 2 -b 8 -e 64K -f 64 -n 3 -w 1 -r 1 \
    --json "$out/allreduce_sweep.json" --progress off
fi

"$py" - "$out" "${steps[@]}" <<'PY'
import json, os, sys
out, steps = sys.argv[1], sys.argv[2:]
record = {"environment": json.load(open(os.path.join(out, "environment.json"))), "steps": {}}
for s in steps:
    name, rc, secs = s.rsplit(":", 2)
    record["steps"][name] = {"exit": int(rc), "seconds": int(secs)}
for name in ("kernels", "delay_precision", "allreduce_sweep"):
    p = os.path.join(out, f"{name}.json")
    if os.path.exists(p):
        record[name] = json.load(open(p))
nccl = os.path.join(out, "nccl_algo_lines.txt")
if os.path.exists(nccl):
    record["nccl_algo_lines"] = open(nccl).read().splitlines()
json.dump(record, open(os.path.join(out, "gpu_check.json"), "w"), indent=1, default=str)
lines = [f"# gpu_check {record['environment']}"]
lines += [f"{k:<20} exit {v['exit']}  {v['seconds']} s" for k, v in record["steps"].items()]
for name in ("gpu_tests", "kernels_fp32_bf16", "delay_precision", "allreduce_sweep"):
    log = os.path.join(out, f"{name}.log")
    if os.path.exists(log):
        tail = [l for l in open(log).read().splitlines() if l.strip()][-12:]
        lines += [f"--- {name} (last lines)"] + tail
open(os.path.join(out, "summary.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines[: 2 + len(record["steps"])]))
PY
exit $status
