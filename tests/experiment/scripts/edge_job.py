"""A user's job for the tests of how ``python -m delaycomm.experiment run`` ends
(tests/experiment/test_experiment_ends.py).

What it does is the case its seed (``DELAYCOMM_SEED``) picks in ``EDGE_CASES`` (comma-separated, one per seed), so
that one ``run --seeds N`` meets every case in turn; it imports torch only where the case needs it:

- ``ok``: reports ``loss=1`` (rank 0) and exits 0;
- ``raise``: creates a Gloo process group, then raises (torch prefixes the traceback's lines with ``[rankN]: ``);
- ``exit3``: exits with code 3, raising nothing;
- ``hang``: starts a ``sleep`` in its own process group, writes its pid and the sleep's to ``$EDGE_PIDS/rank<r>``,
  and waits (for the test's signal).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

case = os.environ["EDGE_CASES"].split(",")[int(os.environ["DELAYCOMM_SEED"])]
rank = int(os.environ.get("RANK", "0"))
if case == "ok":
    if rank == 0:
        print("DELAYCOMM_METRIC loss=1", flush=True)
elif case == "raise":
    import torch.distributed as dist

    dist.init_process_group("gloo")
    raise RuntimeError(f"the job broke on purpose after init_process_group on rank {rank}")
elif case == "exit3":
    sys.exit(3)
elif case == "hang":
    child = subprocess.Popen(["sleep", "600"])  # in this rank's process group
    path = os.path.join(os.environ["EDGE_PIDS"], f"rank{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}\n")
    os.replace(path + ".tmp", path)
    time.sleep(600)
else:
    raise ValueError(f"edge_job.py: unknown case {case!r}")
