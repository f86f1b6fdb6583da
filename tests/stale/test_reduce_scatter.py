"""Stale reduce-scatter (FSDP2's reduction) against the independent NumPy model of tests/stale/test_engine.py.

Ranks are threads over one store (tests/harness), each with the real DelayBackend over a real Gloo group. The
reductions are issued as FSDP2 issues them: ``reduce_scatter_single`` inside the owner scope that delaycomm opens
around FSDP's reduction of one parameter group (``delaycomm._owners.reduction_scope``), whose name keys the stream
(docs/staleness.md, "Keys for reduce-scatter"). A recognised stream defers nothing on its first PROBATION steps (its
runtime check: docs/staleness.md, "The runtime check"). The blend is elementwise, so rank r's output at step t is
shard r of the all-reduce model's result; flush() delivers each rank its shard of what is still pending.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

import delaycomm
from delaycomm import _C
from delaycomm._owners import reduction_scope
from tests.harness import run_threads
from tests.stale.test_engine import STEP_MS, reference

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.filterwarnings("ignore:delaycomm. the stale.fresh ratio:RuntimeWarning"),
]

SHARD = 19  # elements of each rank's output shard (odd: no vector-width coincidence)
SCOPE = "FSDP2 params 0-1 (layers.0.weight +1)"
PROBATION = 4  # StalenessOptions::probationCalls
SEED = 5
FRACTION = 0.4


def _grad(t: int, rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(100 * t + rank).standard_normal(n)


def _delays(world: int, steps: int, delay: str, key: int) -> list[list[int]]:
    # The shared schedule of the stream, computed as every rank computes it (same seed, fraction, stream).
    sched = _C.DelaySchedule(delay, FRACTION, SEED, [])
    stream = (1 << 32) | key
    return [[sched.delay_ns(r, stream, t) for r in range(world)] for t in range(steps)]


def _op(kind: str):
    if kind == "sum":
        return dist.ReduceOp.SUM, 1.0
    if kind == "avg":
        return dist.ReduceOp.AVG, None  # 1 / N
    return dist.ReduceOp.PREMUL_SUM(0.25), 0.25  # FSDP2 with a gradient divide factor of 4


def _run_stream(ctx, policy, staleness, steps, dtype, delay, kind):
    g = ctx.group(
        delay=delay,
        delay_fraction=FRACTION,
        seed=SEED,
        staleness=staleness,
        stale_policy=policy,
        step_ms=STEP_MS,
        max_pending=10_000,
    )
    op, _ = _op(kind)
    n = SHARD * ctx.world_size
    outs, ins = [], []
    for t in range(steps):
        inp = torch.from_numpy(_grad(t, ctx.rank, n)).to(dtype)
        ins.append(inp.double().numpy())
        out = torch.empty(SHARD, dtype=dtype)
        with reduction_scope(SCOPE):
            dist.reduce_scatter_single(out, inp, op=op, group=g)
        outs.append(out.double().numpy())
    flushed = {k: v.double().numpy() for k, v in delaycomm.flush(g).items()}
    st = delaycomm.stats(g)["staleness"]
    backend = g._get_backend(torch.device("cpu"))
    calls = delaycomm.stats(g)["ops"]["_reduce_scatter_base"]["calls"]
    return {"outs": outs, "flushed": flushed, "stats": st, "after": backend.stale_pending(), "calls": calls}


CASES = [
    # policy, staleness, world, dtype, op
    ("apply", "ssp:2", 2, torch.float32, "sum"),
    ("drop", "ssp:2", 2, torch.float32, "avg"),
    ("ema", "ssp:2", 2, torch.bfloat16, "avg"),
    ("ema", "asp", 2, torch.float32, "premul"),
    ("apply", "asp", 4, torch.bfloat16, "avg"),
    ("drop", "asp", 4, torch.bfloat16, "sum"),
    ("ema", "ssp:3", 4, torch.float32, "sum"),
    ("apply", "ssp:1", 4, torch.float32, "premul"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "policy, staleness, world, dtype, kind",
    CASES,
    ids=[f"{p}-{s}-{w}r-{str(d).split('.')[-1]}-{k}" for p, s, w, d, k in CASES],
)
def test_reduce_scatter_matches_numpy_model_on_every_rank(policy, staleness, world, dtype, kind):
    steps, delay = 30, "exp:p99=40ms"
    results = run_threads(lambda ctx: _run_stream(ctx, policy, staleness, steps, dtype, delay, kind), world, timeout=50)
    n = SHARD * world
    grads = [[torch.from_numpy(_grad(t, r, n)).to(dtype).double().numpy() for r in range(world)] for t in range(steps)]
    key = _C._stale_scope_key(SCOPE, n, dtype, True)
    mode, _, bound = staleness.partition(":")
    delays = _delays(world, steps, delay, key)
    if world == 2:  # the schedule has a step at which every rank is late (n_fresh = 0), for every policy
        assert any(all(d > 0 for d in row) for row in delays[PROBATION:]), (
            "no step with n_fresh = 0: choose another seed"
        )
    ref, pending = reference(
        world, grads, delays, policy, mode, int(bound or 0), 0.1, kind == "avg", first_deferrable=PROBATION
    )
    scale = _op(kind)[1] or 1.0
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    for rank, out in enumerate(results):
        shard = slice(rank * SHARD, (rank + 1) * SHARD)
        for t in range(steps):
            np.testing.assert_allclose(
                out["outs"][t],
                scale * ref[t][shard],
                rtol=tol,
                atol=tol * 4,
                err_msg=f"rank {rank} step {t} {policy} {staleness} {kind}",
            )
        assert out["after"] == (0, 0)
        # Exactly one reduce-scatter of the original size per step, and one per key for flush.
        assert out["calls"] == steps + len(out["flushed"]), out["calls"]
    late = results[0]["stats"]["stale"] + results[0]["stats"]["dropped"]
    assert late > 0, "the schedule made nothing late: the test would not exercise the engine"
    assert results[0]["stats"]["fresh"] + late <= steps * world
    if policy == "apply":
        # Conservation: what was not delivered by the last step comes out of flush, each rank its shard.
        for rank, out in enumerate(results):
            if pending:
                expect = scale * sum(pending) / (world if kind == "avg" else 1)
                np.testing.assert_allclose(
                    out["flushed"][key], expect[rank * SHARD : (rank + 1) * SHARD], rtol=tol, atol=tol * 4
                )
            else:
                assert out["flushed"] == {}


def _conservation(ctx, staleness, steps):
    g = ctx.group(
        delay="exp:p99=50ms",
        delay_fraction=0.5,
        seed=11,
        staleness=staleness,
        stale_policy="apply",
        step_ms=STEP_MS,
        max_pending=10_000,
    )
    n = SHARD * ctx.world_size
    total_in = torch.zeros(n, dtype=torch.float64)
    total_out = torch.zeros(SHARD, dtype=torch.float64)
    for t in range(steps):
        for r in range(ctx.world_size):
            total_in += torch.from_numpy(np.random.default_rng(7 * t + r).standard_normal(n))
        inp = torch.from_numpy(np.random.default_rng(7 * t + ctx.rank).standard_normal(n))
        out = torch.empty(SHARD, dtype=torch.float64)
        with reduction_scope(SCOPE):
            dist.reduce_scatter_single(out, inp, op=dist.ReduceOp.AVG, group=g)
        total_out += out
    for shard in delaycomm.flush(g).values():
        total_out += shard
    st = delaycomm.stats(g)["staleness"]
    mine = total_in[ctx.rank * SHARD : (ctx.rank + 1) * SHARD] / ctx.world_size
    return {
        "in": mine.numpy(),
        "out": total_out.numpy(),
        "stale": st["stale"],
        "max": st["staleness"]["max"],
        "keys": st["keys"],
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("staleness, bound", [("ssp:2", 2), ("asp", None)])
def test_apply_conserves_every_contribution_over_200_steps(staleness, bound):
    for out in run_threads(lambda ctx: _conservation(ctx, staleness, 200), 2, timeout=50):
        # Sum of every output shard + flush == this rank's shard of the sum of every contribution (AVG: / N).
        np.testing.assert_allclose(out["out"], out["in"], rtol=1e-12, atol=1e-9)
        assert out["stale"] > 10
        assert out["keys"] == 1, "the scope did not key the stream: a new input every step is one stream"
        if bound is not None:
            assert out["max"] <= bound


def _unscoped(ctx, steps):
    g = ctx.group(delay="exp:p99=40ms", delay_fraction=0.5, seed=3, staleness="ssp:2", step_ms=STEP_MS)
    for _ in range(steps):
        inp = torch.ones(2 * ctx.world_size)
        out = torch.empty(2)
        dist.reduce_scatter_single(out, inp, group=g)  # a new input every step, outside any FSDP2 scope
        assert out.tolist() == [float(ctx.world_size)] * 2
    st = delaycomm.stats(g)
    return st["staleness"]["stale"] + st["staleness"]["dropped"], st["staleness"]["keys"], st["ops"]


def test_reduce_scatter_outside_a_backward_pass_is_kept_fresh():
    # Not a gradient reduction (docs/staleness.md, "Which reductions go stale"): kept fresh, with its delay.
    for late, keys, ops in run_threads(lambda ctx: _unscoped(ctx, 12), 2, timeout=30):
        assert late == 0
        assert keys == 0
        rs = ops["_reduce_scatter_base"]
        assert rs["kept_fresh_calls"] == 12 and rs["stale_calls"] == 0, rs
        assert rs["delayed_calls"] > 0, rs


def _hsdp(ctx, delay_ops):
    opts = dict(
        delay="exp:p99=40ms", delay_fraction=1.0, seed=3, staleness="ssp:2", step_ms=STEP_MS, delay_ops=delay_ops
    )
    shard, replicas = ctx.group(**opts), ctx.group(**opts)  # HSDP's two stages: two groups, one scope
    out = torch.empty(2)
    with reduction_scope(SCOPE):
        dist.reduce_scatter_single(out, torch.ones(2 * ctx.world_size), group=shard)
        dist.all_reduce(out, group=replicas)
    return delaycomm.stats(replicas)["staleness"]["keys"], delaycomm.stats(replicas)["ops"]["allreduce"]


def test_hsdp_all_reduce_across_replicas_after_a_stale_reduce_scatter_is_kept_fresh():
    # One stage of a gradient's reduction goes stale, not both (docs/staleness.md, "HSDP").
    for keys, ar in run_threads(lambda ctx: _hsdp(ctx, "all"), 2, timeout=30):
        assert keys == 0, "HSDP's all-reduce across replicas went stale after its reduce-scatter"
        assert ar["kept_fresh_calls"] == 1 and ar["stale_calls"] == 0, ar


@pytest.mark.parametrize("delay_ops", ["_reduce_scatter_base", "allreduce"])
def test_hsdp_with_one_stage_delayed_makes_that_stage_stale(delay_ops):
    for keys, _ in run_threads(lambda ctx: _hsdp(ctx, delay_ops), 2, timeout=30):
        assert keys == (1 if delay_ops == "allreduce" else 0)  # the replicas' stream keyed by the scope


def _replicate_scope(ctx, steps):
    g = ctx.group(
        delay="exp:p99=40ms", delay_fraction=0.5, seed=3, staleness="ssp:2", stale_policy="apply", step_ms=STEP_MS
    )
    total = 0.0
    for _ in range(steps):
        t = torch.ones(3)
        with reduction_scope("FSDP2 params 0 (weight)"):
            dist.all_reduce(t, group=g)
        total += t.sum().item()
    total += sum(v.sum().item() for v in delaycomm.flush(g).values())
    st = delaycomm.stats(g)["staleness"]
    return total, st["stale"], st["keys"]


def test_all_reduce_alone_in_a_scope_is_keyed_by_the_scope():
    # FSDP2 without sharding (a replicate mesh) reduces with all_reduce alone: a new tensor each step, one stream.
    for total, stale, keys in run_threads(lambda ctx: _replicate_scope(ctx, 20), 2, timeout=30):
        assert keys == 1
        assert stale > 0
        assert total == pytest.approx(20 * 3 * 2)
