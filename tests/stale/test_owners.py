"""A stale contribution lands only on the gradient it came from, on the training patterns people use
(docs/staleness.md, "Which reductions go stale" and "The runtime check"): unmodified jobs
(tests/stale/scripts/owners_job.py) in ranks started as torchrun starts them (tests/harness/user_job.py), configured
only through DELAYCOMM_* (step_ms=auto), under ssp:2 with stale_policy=apply, each path on a process group of its own.
For every path and rank, from what the job wrote:

- per parameter, what the optimizers consumed in all (with flush(into_grad=True) and one last step) equals the mean
  of every rank's own gradients: a contribution that moved between parameters, landed on a gradient that was used
  differently, or was lost, breaks it (float64, to 1e-9 relative);
- the delay the user asked for is all there: every reduction op was delayed on about DELAYCOMM_DELAY_FRACTION of its
  calls (within 4.5 standard deviations), whether it went stale or was kept fresh;
- on the paths whose gradients can go stale, some did; on the others, none did, and the warning says why.
"""

from __future__ import annotations

import collections
import math
from pathlib import Path

import pytest

from tests.harness.user_job import LAUNCHERS, run_user_job

pytestmark = [pytest.mark.multiproc]

JOB = Path(__file__).resolve().parent / "scripts" / "owners_job.py"
STEPS = 30
FRACTION = 0.3
USER_ENV = {
    "DELAYCOMM_DELAY": "exp:p99=30ms",
    "DELAYCOMM_DELAY_FRACTION": str(FRACTION),
    "DELAYCOMM_STALENESS": "ssp:2",
    "DELAYCOMM_STALE_POLICY": "apply",
}
# Paths whose gradient reductions go stale (some of them), and paths that must keep every gradient fresh.
STALE = {
    "ckpt_ddp",
    "ckpt_reentrant_ddp",
    "ckpt_fsdp1",
    "ckpt_reentrant_fsdp1",
    "ckpt_fsdp2",
    "ckpt_reentrant_fsdp2",
    "gan",  # G's buckets; D's are kept fresh (reduced three times per iteration)
    "two_ddp",
    "two_ddp_hook",
    "counters",
    "two_opt",
    "hybrid_fsdp1",
    "orig_fsdp1_noshard",
    "orig_fsdp1_full",
    "orig_fsdp1_grad_op",
    "orig_fsdp1_hybrid",
}
FRESH = {"two_bwd", "cautograd"}
NOT_CONSUMED = "reduced again before an optimizer step consumed all of its parameters' previous gradient"


def run(paths: list[str], tmp_path: Path, nproc: int = 2, launcher: str = "forked", timeout: float = 400):
    import torch

    out = tmp_path / "out"
    args = ["--paths", ",".join(paths), "--steps", str(STEPS), "--out", str(out)]
    proc = run_user_job(launcher, JOB, args, USER_ENV, tmp_path, nproc=nproc, timeout=timeout)
    results = collections.defaultdict(dict)
    for p in out.glob("*.pt"):
        path, rank = p.stem.split(".rank")
        results[path][int(rank)] = torch.load(p, weights_only=False)
    assert sorted(results) == sorted(paths), sorted(results)
    return results, proc


def _ops(res: dict) -> dict[str, collections.Counter]:
    total: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for st in res["stats"]:
        for op, o in st["ops"].items():
            for k in ("calls", "delayed_calls", "stale_calls", "kept_fresh_calls"):
                total[op][k] += o[k]
    return total


def check_path(path: str, ranks: dict) -> None:
    world = len(ranks)
    for rank, res in ranks.items():
        ops = _ops(res)
        summary = f"{path} rank {rank}: " + "; ".join(f"{op} {dict(c)}" for op, c in ops.items() if c["calls"])
        print(summary)
        # The delay is all there: each op delayed on about FRACTION of its calls, stale or fresh.
        for c in ops.values():
            n = c["calls"]
            if n >= 20:
                bound = 4.5 * math.sqrt(n * FRACTION * (1 - FRACTION)) + 2
                assert abs(c["delayed_calls"] - FRACTION * n) <= bound, summary
        stale = sum(c["stale_calls"] for c in ops.values())
        if path in STALE:
            assert stale > 0, f"nothing went stale: {summary}"
        if path in FRESH:
            assert stale == 0 and ops["allreduce"]["kept_fresh_calls"] > 0, summary
        # Per parameter: consumed in all == the mean of every rank's own gradients.
        for i, got in enumerate(res["consumed"]):
            want = sum(ranks[r]["contributed"][i] for r in ranks) / world
            err = float((got - want).abs().max() / want.abs().max())
            assert err <= 1e-9, f"{path} rank {rank} parameter {i}: relative error {err:.3e}"
        assert res["unapplied"] == [], res["unapplied"]
        if path.startswith("orig_fsdp1_"):
            # Its flushes (before each checkpoint and at the end) had something pending: flush(into_grad=True)
            # put it into the original parameters' .grad, and the conservation above checked it.
            assert res["flushed_streams"] > 0, f"{path} rank {rank}: nothing was pending at any flush"


# The held-out paths of the default run; the rest run with scripts/test.sh --slow (below).
DEFAULT_PATHS = [
    "ckpt_reentrant_ddp",
    "ckpt_ddp",
    "ckpt_reentrant_fsdp1",
    "ckpt_reentrant_fsdp2",
    "gan",
    "two_ddp",
    "two_ddp_hook",
    "counters",
    "two_opt",
    "two_bwd",
    "orig_fsdp1_noshard",
    "orig_fsdp1_full",
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_stale_contributions_land_on_their_own_parameters(tmp_path, launcher):
    results, proc = run(DEFAULT_PATHS, tmp_path, launcher=launcher)
    print(proc.stdout)
    for path in DEFAULT_PATHS:
        check_path(path, results[path])
    for rank in range(2):
        # Checkpointed identical blocks: one stream per bucket (DDP's buckets are recognised by DDP module and index,
        # not by their order in a graph task), calibrated on one of them.
        st = results["ckpt_reentrant_ddp"][rank]["stats"][0]["staleness"]
        assert st["step_key"].startswith("'DDP #"), st
        # Two DDP modules of the same shape on one group: their buckets are separate streams.
        keys = results["two_ddp"][rank]["stats"][0]["staleness"]["keys"]
        assert keys >= 2 * 4, keys
        # Counters all-reduced in a parameter hook: exact every step, never stale.
        counters = results["counters"][rank]["counters"]
        assert len(counters) == STEPS and all(f == [3.0] * 3 and i == [3] for f, i in counters), counters[:3]
    # GAN: D's buckets are reduced again before D's step consumed them (fake batch), so they are kept fresh, and
    # the warning says so; G's go stale (checked above). Two backward passes per step: the same.
    assert NOT_CONSUMED in proc.stderr, proc.stderr[-3000:]
    # An int64 counter is not DDP's used-parameter map: no find_unused_parameters blame.
    assert "find_unused_parameters" not in proc.stderr, proc.stderr[-3000:]


# NOTE: slow (scripts/test.sh --slow; docs/ci.md): non-reentrant checkpointing under FSDP1 and FSDP2 and plain FSDP1
# FULL_SHARD (the default run has the reentrant forms, FSDP1 FULL_SHARD among them: the same owner scope, flushed
# into the same flat shards), and compiled autograd
# (compiling the step costs tens of CPU seconds; the rule it exercises, a reduction outside any parameter's gradient
# accumulation is kept fresh, is the default run's static_graph first iteration in tests/stale/test_paths.py).
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_non_reentrant_fsdp_checkpointing_plain_fsdp1_and_compiled_autograd(tmp_path):
    paths = ["ckpt_fsdp1", "ckpt_fsdp2", "fsdp1", "orig_fsdp1_grad_op", "cautograd"]
    results, proc = run(paths, tmp_path, timeout=800)
    for path in paths:
        check_path(path, results[path])
    for rank in range(2):
        # Compiled autograd engaged: backward() ran inside the compiled step, and Dynamo captured its graph.
        assert results["cautograd"][rank]["compiled_autograd_captures"] > 0, results["cautograd"][rank]
    assert "a compiled autograd graph" in proc.stderr, proc.stderr[-3000:]


# NOTE: slow (four ranks; docs/ci.md). The default run covers FSDP1's flat parameters going stale and flushing into
# .grad (ckpt_reentrant_fsdp1 above) and HYBRID_SHARD's rule, the all-reduce across replicas after a stale
# reduce-scatter kept fresh (tests/stale/test_reduce_scatter.py).
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fsdp1_hybrid_shard_one_stage_stale_and_flush_finds_it(tmp_path):
    # use_orig_params=True first: the second path's flushes also take part in the replicas' all-reduce for the
    # first path's flat parameters, whose model is gone by then.
    paths = ["orig_fsdp1_hybrid", "hybrid_fsdp1"]
    results, proc = run(paths, tmp_path, nproc=4, timeout=800)
    for path in paths:
        check_path(path, results[path])
    for res in (r for path in paths for r in results[path].values()):
        shard, replicas = (_ops({"stats": [st]}) for st in res["stats"][::-1])  # mesh dims: replicate, shard
        assert shard["_reduce_scatter_base"]["stale_calls"] > 0, dict(shard["_reduce_scatter_base"])
        assert replicas["allreduce"]["stale_calls"] == 0 and replicas["allreduce"]["kept_fresh_calls"] > 0, replicas
        assert res["flushed_streams"] > 0, res["flushed_streams"]  # flush() with no group found the shard group's
    assert "it is the all-reduce across replicas (HSDP, HYBRID_SHARD)" in proc.stderr, proc.stderr[-3000:]
