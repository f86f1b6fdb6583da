"""A restarted attempt that shares the store with the attempt before it (torchrun's agent store, the default since
torch 2.4) never reads that attempt's keys: it agrees afresh, and its inner Gloo connects to live peers (real
processes, real Gloo, real torchrun; docs/ecosystem.md, "torchrun restarts")."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest

from tests.harness import run_cli, run_in_child, run_procs

pytestmark = [pytest.mark.multiproc]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _worker(rank, world, attempt, timeout_s):
    """One attempt's worker, as torchrun starts it: a process of its own, a client of the agent's store."""
    import torch
    import torch.distributed as dist

    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, False, timeout=timedelta(seconds=60))
    try:
        dist.init_process_group(
            "delaycomm", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
        )
    except Exception as e:  # noqa: BLE001 - the type is the point
        return f"{type(e).__name__}: {str(e)[:200]}"
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


def _restart_on_a_shared_store(rank, world):
    """The store outlives the attempts (the harness hosts it, as torchrun's agent does). Attempt 0: rank 0's worker
    creates the group, rank 1's dies before it does (rank 0's times out, its keys stay in the store). Attempt 1:
    both workers create the group over the same store, and reduce."""
    import torch.distributed as dist

    agent = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, False, timeout=timedelta(seconds=60))
    out = [run_in_child(_worker, rank, world, 0, 2) if rank == 0 else "absent"]
    agent.set(f"test/attempt0/{rank}", "1")
    agent.wait([f"test/attempt0/{r}" for r in range(world)])
    out.append(run_in_child(_worker, rank, world, 1, 15))
    return out


@pytest.mark.timeout(120)
def test_a_restarted_attempt_never_reads_the_previous_attempts_keys():
    # Before: attempt 0 left delaycomm's counter of arrivals odd, so attempt 1's ranks drew different generations
    # from it and waited on keys the other never wrote: both timed out after the group's timeout.
    res = run_procs(_restart_on_a_shared_store, 2, timeout=90)
    assert res[0][0].startswith("DistStoreError: "), res[0]
    assert res[0][1] == [3.0, 3.0, 3.0]
    assert res[1] == ["absent", [3.0, 3.0, 3.0]]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torchrun_restarts_on_the_shared_store(tmp_path):
    # Rank 1 fails on purpose at step 15 of the first attempt; torchrun restarts both ranks, which resume from the
    # checkpoint of step 10. Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 the second attempt shares the store with
    # the first: before, delaycomm's inner Gloo could read the first attempt's addresses and wait for the group's
    # timeout (30 min).
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_")}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    env["OMP_NUM_THREADS"] = "1"
    out = tmp_path / "out"
    argv = ["--standalone", "--nproc_per_node", "2", "--max-restarts", "1"]
    argv += [os.path.join(ROOT, "examples", "ecosystem", "restart_job.py"), "--backend", "delaycomm"]
    argv += ["--out", str(out), "--ckpt", str(tmp_path / "ckpt")]
    proc = run_cli(argv, module="torch.distributed.run", env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert (r["restarts"], r["resumed_from"], r["backend"]) == (1, 10, "delaycomm")
    assert ranks[0]["params"] == ranks[1]["params"]
    assert ranks[0]["delaycomm"]["calls"] > 0
