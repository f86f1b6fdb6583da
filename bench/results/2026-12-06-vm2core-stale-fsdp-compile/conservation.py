"""Per-parameter conservation of tests/stale/scripts/owners_job.py's paths, as tests/stale/test_owners.py runs them
(ranks forked as torchrun starts them, DELAYCOMM_* only: ssp:2, stale_policy=apply, exp:p99=30ms on 30% of the
calls; float64, 30 steps). Prints, per path and rank, the largest relative error over the parameters of (what the
optimizers consumed) against (the mean of every rank's own gradients), the reduction counters, and how many streams
the flushes found pending.

    .venv/bin/python bench/results/2026-12-06-vm2core-stale-fsdp-compile/conservation.py PATHS NPROC OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from tests.stale import test_owners

    paths, nproc, out = sys.argv[1].split(","), int(sys.argv[2]), Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    results, _ = test_owners.run(paths, out, nproc=nproc)
    for path in paths:
        ranks = results[path]
        for rank, res in sorted(ranks.items()):
            errors = []
            for i, got in enumerate(res["consumed"]):
                want = sum(ranks[r]["contributed"][i] for r in ranks) / len(ranks)
                errors.append(float((got - want).abs().max() / want.abs().max()))
            ops = {op: dict(c) for op, c in test_owners._ops(res).items() if c["calls"]}
            pending = res["flushed_streams"]
            print(f"{path} rank {rank}: max per-parameter error {max(errors):.3e} flushed {pending} {ops}")


if __name__ == "__main__":
    main()
