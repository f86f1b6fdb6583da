#!/usr/bin/env bash
# The demo: set-up, then torchrun on 2 CPU ranks training a small model with backend="delaycomm".
#   scripts/demo.sh [extra DELAYCOMM_* settings are read from the environment]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" >&2
cd "$root"
exec "$root/.venv/bin/python" -m torch.distributed.run --standalone --nproc_per_node 2 examples/train_ddp.py "$@"
