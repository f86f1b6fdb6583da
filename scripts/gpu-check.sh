#!/usr/bin/env bash
# GPU runner check of delay injection: build with the CUDA sources, run the GPU tests, measure the sleep kernel's
# precision (and the CPU figures on this machine). Writes results under ${OUT:-out}/.
#   scripts/gpu-check.sh
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
t0=$(date +%s)
if ! python3 -m pip install -q --no-build-isolation --no-deps -t /tmp/dcpkg \
    -C cmake.define.CMAKE_CUDA_COMPILER="$nvcc" -C build.tool-args=-k0 . > "$out/build.log" 2>&1; then
  grep -E "error:" "$out/build.log" | head -40
  exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=/tmp/dcpkg TORCH_DEVICE_BACKEND_AUTOLOAD=0
python3 -c "from delaycomm import _C; print('cuda_compiled', _C.cuda_compiled)"
python3 -m pytest -q -p no:cacheprovider --rootdir=. -o addopts="" tests/delay/test_gpu.py 2>&1 | tail -20
python3 bench/delay_precision.py --gpu --json "$out/precision.json" --samples 200 && \
  python3 -c "import json; d=json.load(open('$out/precision.json')); d.pop('argv'); print(json.dumps(d, indent=1))" \
  | grep -vE '^\s+[0-9.]+,?$' | head -150
