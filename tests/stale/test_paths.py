"""Which reductions go stale, on the ecosystem's paths, as a user gets it (docs/staleness.md, "Which reductions go
stale"): unmodified training jobs (tests/stale/scripts/paths_job.py) started as torchrun starts them (the two-rank
paths in ranks forked that way in the default run; under torchrun itself, and the four-rank meshes, with
scripts/test.sh --slow: tests/harness/user_job.py), configured only through DELAYCOMM_* (step_ms=auto), each path
run under bsp and under ssp:2 with stale_policy=apply, same delay, fraction and seed. For every path and rank, from
the stats each path's own process group left:

- the delay the user asked for is all there: the number of delayed calls under ssp matches bsp's within sampling
  noise, and on a gradient path they show up as stale (stale_calls) or delayed-but-on-time, elsewhere as delayed
  and kept fresh (kept_fresh_calls: never stale);
- the final loss is within 25% of bsp's;
- under apply, the gradients DDP delivered plus what flush() delivered equal every rank's contributions exactly
  (float64; to the hook's rounding for the fp16 and bf16 compress hooks).

Several paths run in sequence in one job, each on a process group of its own, so a torchrun run pays the start
of torch a few times only. FSDP2 on a 1-D mesh is tests/stale/test_fsdp.py's.
"""

from __future__ import annotations

import collections
import math
from pathlib import Path

import pytest

from tests.harness.user_job import LAUNCHERS, run_user_job

pytestmark = [pytest.mark.multiproc]

JOB = Path(__file__).resolve().parent / "scripts" / "paths_job.py"
STEPS = 40
# What a user sets to try staleness: a delay on 30% of the calls. Nothing else.
USER_ENV = {"DELAYCOMM_DELAY": "exp:p99=30ms", "DELAYCOMM_DELAY_FRACTION": "0.3"}
FRACTION = 0.3

# Paths whose gradient reductions go stale, and paths whose reductions are never gradients.
GRADIENT_PATHS = {
    "join",
    "ddp",
    "tiny",
    "static",
    "nosync",
    "view",
    "fp16",
    "bf16",
    "compiled",
    "fsdp2",
    "hsdp",
    "tp_fsdp2",
}
FRESH_PATHS = {"metric", "tp", "unused"}


def _run(
    launcher: str, paths: list[str], staleness: str, tmp_path: Path, nproc: int = 2, timeout: float = 400
) -> tuple:
    import torch

    out = tmp_path / staleness.replace(":", "")
    env = {**USER_ENV, "DELAYCOMM_STALENESS": staleness, "DELAYCOMM_STALE_POLICY": "apply"}
    args = ["--paths", ",".join(paths), "--steps", str(STEPS), "--out", str(out)]
    proc = run_user_job(launcher, JOB, args, env, tmp_path, nproc=nproc, timeout=timeout)
    results = collections.defaultdict(dict)
    for p in out.glob("*.pt"):
        path, rank = p.stem.split(".rank")
        results[path][int(rank)] = torch.load(p, weights_only=False)
    assert sorted(results) == sorted(paths), sorted(results)
    return results, proc


def _ops(result: dict) -> dict[str, dict[str, int]]:
    """Per reduction op, the counters summed over the path's groups."""
    total: dict[str, dict[str, int]] = collections.defaultdict(lambda: collections.Counter())
    for st in result["stats"]:
        for op, o in st["ops"].items():
            if op in ("allreduce", "_reduce_scatter_base"):
                for k in ("calls", "delayed_calls", "stale_calls", "kept_fresh_calls"):
                    total[op][k] += o[k]
    return total


def _close_in_count(a: int, b: int, n: int) -> bool:
    """Two Binomial(n, FRACTION) draws agree within 4.5 standard deviations of their difference (plus 2)."""
    return abs(a - b) <= 4.5 * math.sqrt(2 * n * FRACTION * (1 - FRACTION)) + 2


def _final_loss(result: dict) -> float:
    losses = result["losses"]
    return sum(losses[-10:]) / 10


def _summary(path: str, bsp: dict, ssp: dict) -> str:
    """Rank 0's counters and final losses, for the log (pytest -s)."""
    parts = [f"{path:9s}"]
    for op, s in _ops(ssp[0]).items():
        b = _ops(bsp[0])[op]
        parts.append(
            f"{op}: calls {s['calls']} delayed bsp {b['delayed_calls']} ssp {s['delayed_calls']} "
            f"stale {s['stale_calls']} kept_fresh {s['kept_fresh_calls']}"
        )
    if bsp[0]["losses"]:
        parts.append(f"loss bsp {_final_loss(bsp[0]):.4f} ssp {_final_loss(ssp[0]):.4f}")
    return " | ".join(parts)


def _check_path(path: str, bsp: dict, ssp: dict, world: int) -> None:
    print(_summary(path, bsp, ssp))
    for rank in range(world):
        b_ops, s_ops = _ops(bsp[rank]), _ops(ssp[rank])
        for op, s in s_ops.items():
            b = b_ops[op]
            where = f"{path} rank {rank} {op}: bsp {dict(b)}, ssp:2 {dict(s)}"
            assert b["delayed_calls"] > 0, where
            assert _close_in_count(s["delayed_calls"], b["delayed_calls"], b["calls"]), where
            assert s["stale_calls"] <= s["delayed_calls"], where
            if path in FRESH_PATHS:
                assert s["stale_calls"] == 0, where
                assert s["kept_fresh_calls"] > 0, where
        if path in GRADIENT_PATHS:
            stale = sum(s["stale_calls"] for s in s_ops.values())
            assert stale > 0, f"{path} rank {rank}: no reduction went stale: {dict(s_ops)}"
    if bsp[0]["losses"]:
        lb, ls = _final_loss(bsp[0]), _final_loss(ssp[0])
        assert math.isfinite(ls) and abs(ls - lb) <= 0.25 * lb, f"{path}: final loss bsp {lb:.4f}, ssp:2 {ls:.4f}"


def _check_conservation(path: str, ssp: dict, world: int, rtol: float) -> None:
    """Under apply: delivered + flushed == the mean of every rank's contributions (the sum for the metric)."""
    ranks = ssp
    for rank, res in ranks.items():
        if path == "join" and rank != world - 1:
            continue  # a joined rank receives nothing after it joined: the last rank to join received everything
        for i, got in enumerate(res["delivered"]):
            want = sum(ranks[r]["contributed"][i] for r in ranks)
            if path != "metric":
                want = want / world
            got = got + res["flushed"].get(i, 0)
            err = float((got - want).abs().max() / want.abs().max())
            assert err <= rtol, f"{path} rank {rank} parameter {i}: relative error {err:.3e} > {rtol}"


DDP_PATHS = [
    "ddp",
    "tiny",
    "unused",
    "static",
    "nosync",
    "view",
    "fp16",
    "bf16",
    "powersgd",
    "join",
    "compiled",
    "metric",
    "tp",
]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_ddp_paths_metric_and_tp_two_ranks(tmp_path, launcher):
    bsp, _ = _run(launcher, DDP_PATHS, "bsp", tmp_path)
    ssp, proc = _run(launcher, DDP_PATHS, "ssp:2", tmp_path)
    for path in DDP_PATHS:
        _check_path(path, bsp[path], ssp[path], 2)
    for path in DDP_PATHS:
        if path in ("powersgd", "tp"):
            continue  # PowerSGD: lossy compression, nothing to conserve; tp: no data-parallel reduction
        _check_conservation(path, ssp[path], 2, rtol=2e-3 if path in ("fp16", "bf16") else 1e-9)

    # torch.compile: delaycomm adds no graph break (under bsp none of its hooks is installed, so Dynamo sees what it
    # sees on plain Gloo: tests/stale/test_compile.py, slow, compares with Gloo itself), and no Dynamo warning names
    # one of its native functions (pybind11 mangles their names). The compiled path went stale (_check_path).
    for rank in range(2):
        want, got = bsp["compiled"][rank]["graph_breaks"], ssp["compiled"][rank]["graph_breaks"]
        assert got == want, f"compiled rank {rank}: graph breaks under ssp:2 {got}, under bsp {want}"
    assert "pybind11" not in proc.stderr, proc.stderr[-4000:]
    # PowerSGD: the bucket's reduction goes stale before compression starts (step 10); from then on the hook's
    # reductions (its uncompressed tensors, the factors P and Q) are kept fresh, every step, on every rank.
    for rank in range(2):
        ar = _ops(ssp["powersgd"][rank])["allreduce"]
        assert ar["kept_fresh_calls"] >= 3 * (STEPS - 10), dict(ar)
        assert ar["stale_calls"] > 0, dict(ar)
    # join(): flush() delivered the same streams on every rank (the joined rank's shadow all-reduces are the same
    # streams as the active rank's buckets).
    assert ssp["join"][0]["flushed_numels"] == ssp["join"][1]["flushed_numels"]
    # find_unused_parameters: kept fresh (DDP drops late contributions to unused parameters), nothing lost.
    # A metric and TP's all-reduces: never stale. static_graph's first iteration, reduced from the backward pass's
    # final callback (as a compiled autograd graph reduces: tests/stale/test_owners.py, slow): kept fresh. Each
    # warned once, naming the op and why.
    for text in (
        "kept fresh (delayed as under bsp, never stale): it was issued outside a backward pass",
        "by an autograd node that is not a parameter's gradient accumulation",
        "it was issued in a backward pass outside any parameter's gradient accumulation",
        "find_unused_parameters=True",
        "a reduction of another size, e.g. PowerSGD's factors",
    ):
        assert text in proc.stderr, f"no warning {text!r}:\n{proc.stderr[-4000:]}"


# FSDP2 on a 1-D mesh is tests/stale/test_fsdp.py's (2 ranks).
MESH_PATHS = ["hsdp", "tp_fsdp2"]


# NOTE: slow (four ranks, twice; scripts/test.sh --slow). The default run covers HSDP's all-reduce across
# replicas kept fresh after a stale reduce-scatter (tests/stale/test_reduce_scatter.py), TP's all-reduces kept
# fresh (the tp path above) and FSDP2's reduce-scatters going stale (tests/stale/test_fsdp.py); docs/ci.md.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_hsdp_and_tp_fsdp2_four_ranks(tmp_path):
    bsp, _ = _run("torchrun", MESH_PATHS, "bsp", tmp_path, nproc=4)
    ssp, proc = _run("torchrun", MESH_PATHS, "ssp:2", tmp_path, nproc=4)
    for path in MESH_PATHS:
        _check_path(path, bsp[path], ssp[path], 4)
    for rank in range(4):
        # HSDP: the shard groups' reduce-scatters go stale, the all-reduce across replicas is kept fresh.
        hsdp = _ops(ssp["hsdp"][rank])
        assert hsdp["_reduce_scatter_base"]["stale_calls"] > 0, dict(hsdp["_reduce_scatter_base"])
        assert hsdp["allreduce"]["stale_calls"] == 0 and hsdp["allreduce"]["kept_fresh_calls"] > 0, hsdp
        # TP + FSDP2: FSDP2's reduce-scatters go stale, TP's all-reduces never.
        tp = _ops(ssp["tp_fsdp2"][rank])
        assert tp["_reduce_scatter_base"]["stale_calls"] > 0, dict(tp["_reduce_scatter_base"])
        assert tp["allreduce"]["stale_calls"] == 0 and tp["allreduce"]["kept_fresh_calls"] > 0, dict(tp["allreduce"])
    assert "it is the all-reduce across replicas (HSDP, HYBRID_SHARD)" in proc.stderr, proc.stderr[-4000:]
