"""Staleness as a user gets it: unmodified DDP scripts started as torchrun starts them (tests/harness/user_job.py:
the example under torchrun itself; the other scripts in ranks forked that way in the default run, and under
torchrun with scripts/test.sh --slow), configured only through DELAYCOMM_*.

Nothing here pins step_ms, a key or average: step_ms=auto must calibrate on the job as it runs (docs/staleness.md),
whether the script's buckets are recognised in the backward pass (plain DDP), it does a metric all_reduce before
training, or it uses delaycomm.ddp_hook. Each run asserts from the stats file (DELAYCOMM_STATS) that late
contributions happened (>= 5% of all), that the staleness bound held, and with stale_policy=apply that the outputs
plus flush() add up to every contribution, for the AVG buckets and a SUM metric (kept fresh).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.harness.user_job import LAUNCHERS, run_user_job

pytestmark = [pytest.mark.multiproc]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
JOB = Path(__file__).resolve().parent / "scripts" / "ddp_job.py"

# What a user sets to try staleness: a delay on 30% of the calls, bounded staleness. Nothing else.
USER_ENV = {
    "DELAYCOMM_DELAY": "exp:p99=30ms",
    "DELAYCOMM_DELAY_FRACTION": "0.3",
    "DELAYCOMM_STALENESS": "ssp:2",
}


def _job(launcher: str, script: Path, args: list[str], env: dict[str, str], tmp_path: Path, timeout: float = 240):
    """``script`` on 2 ranks (tests/harness/user_job.py: torchrun, or ranks forked as torchrun starts them), with
    ``env`` and a stats file (DELAYCOMM_STATS) under ``tmp_path``."""
    env = {**env, "DELAYCOMM_STATS": str(tmp_path / "stats.json")}
    return run_user_job(launcher, script, args, env, tmp_path, timeout=timeout)


def _stats(tmp_path: Path) -> list[dict]:
    """Every stats document the run left (one per rank and group, or one shared file)."""
    docs = []
    for p in sorted(tmp_path.rglob("*.json")):
        doc = json.loads(p.read_text())
        docs.extend(doc["groups"].values() if "groups" in doc else [doc])
    assert docs, f"no stats file under {tmp_path}: {list(tmp_path.iterdir())}"
    return docs


def _check_staleness(docs: list[dict], bound: int | None) -> dict:
    for st in (d["staleness"] for d in docs):
        total = st["fresh"] + st["stale"] + st["dropped"]
        assert total > 0, f"the staleness engine saw no all-reduce: {st}"
        late = st["stale"] + st["dropped"]
        assert late >= 0.05 * total, (
            f"only {late} of {total} contributions were late: staleness did not engage with the defaults "
            f"(step_source {st.get('step_source')!r}, step_key {st.get('step_key')!r})"
        )
        assert st["step_source"] == "calibrated" and st["step_ms"] > 0, st
        if bound is not None:
            assert st["staleness"]["max"] <= bound, st
    return docs[0]["staleness"]


# NOTE: the one test here that runs torchrun itself in the default run (the others run their script in ranks
# forked as torchrun starts them; their torchrun runs are under scripts/test.sh --slow, docs/ci.md).
@pytest.mark.timeout(300)
def test_unmodified_ddp_example_goes_stale_with_the_defaults(tmp_path):
    proc = _job("torchrun", EXAMPLE, [], USER_ENV, tmp_path)
    st = _check_staleness(_stats(tmp_path), bound=2)
    # The report names the agreed step and the stream it was measured on.
    assert "step_ms=auto: median of 5 intervals of 'DDP #0 bucket #0 (params" in proc.stdout, proc.stdout[-3000:]
    assert st["step_key"].startswith("'DDP #0 bucket #0 (params"), st


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("hook", [False, True], ids=["reducer", "ddp_hook"])
def test_metric_all_reduce_before_training_does_not_stop_calibration(tmp_path, hook, launcher):
    args = ["--metric-first"] + (["--hook"] if hook else [])
    _job(launcher, JOB, args, USER_ENV, tmp_path)
    st = _check_staleness(_stats(tmp_path), bound=2)
    # DDP's first bucket (the metric before it is kept fresh), through the hook or the reducer's own
    assert st["step_key"].startswith("'DDP #0 bucket #0 (comm hook, params" if hook else "'DDP #0 bucket #0 (params"), (
        st
    )


def _sum(ts):
    import torch

    out = torch.zeros_like(ts[0], dtype=torch.float64)
    for t in ts:
        out += t.double()
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("staleness, bound", [("ssp:2", 2), ("asp", None)])
def test_apply_outputs_plus_flush_equal_contributions_avg_and_sum(tmp_path, staleness, bound, launcher):
    import torch

    env = {**USER_ENV, "DELAYCOMM_STALENESS": staleness, "DELAYCOMM_STALE_POLICY": "apply"}
    rec = tmp_path / "rec"
    _job(launcher, JOB, ["--metric-first", "--hook", "--record", str(rec)], env, tmp_path)
    _check_staleness(_stats(tmp_path), bound=bound)
    ranks = [torch.load(rec / f"rank{r}.pt") for r in range(2)]
    world = ranks[0]["world"]

    # A persistent buffer SUM-all-reduced every step outside a backward pass: not a gradient, kept fresh, so every
    # output is exact and flush delivers nothing for it (docs/staleness.md, "Which reductions go stale").
    sum_in = _sum([t for r in ranks for t in r["sum_in"]])
    for r in ranks:
        flushed = [t for t in r["flushed"].values() if t.numel() == 8]
        got = _sum(r["sum_out"] + flushed)
        torch.testing.assert_close(got, sum_in, rtol=1e-5, atol=1e-4)

    # AVG stream (DDP buckets through ddp_hook): sum of outputs + flush == sum of contributions / N. The first call
    # of a bucket is DDP's pre-rebuild bucket (possibly another layout) and is never deferred: compare it alone.
    for r in ranks:
        calls = r["buckets"]
        indices = sorted({i for i, _, _ in calls})
        assert indices == [0], f"expected one bucket, got {indices}"
        _, _, first_out = calls[0]
        rest = calls[1:]
        torch.testing.assert_close(
            first_out.double(), _sum([p["buckets"][0][1] for p in ranks]) / world, rtol=1e-5, atol=1e-6
        )
        contributions = _sum([c for p in ranks for _, c, _ in p["buckets"][1:]]) / world
        flushed = [t for t in r["flushed"].values() if t.numel() != 8]  # the bucket's stream (the metric: fresh)
        got = _sum([o for _, _, o in rest] + flushed)
        torch.testing.assert_close(got, contributions, rtol=1e-5, atol=1e-4)


@pytest.mark.timeout(300)
def test_a_profile_replayed_under_ssp_goes_stale_with_at_most_one_late_rank_per_step(tmp_path):
    # A profile's defaults (docs/profile.md, "Replay"): every call draws from it (delay_fraction=1) and one rank
    # per call carries the draw (delay_carrier=one); the staleness engine takes its lateness from the same
    # schedule, so at most one of a step's two contributions is late, where every rank drawing would make both
    # late on many steps. Half of the calls near 3 ms, half near 30 ms, for every size.
    base = 1.02
    buckets = [[math.floor(math.log(3e6) / math.log(base)), 50], [math.floor(math.log(30e6) / math.log(base)), 50]]
    cls = [
        {"bytes": n, "count": 100, "zeros": 0, "min_ns": 3e6, "max_ns": 31e6, "buckets": buckets} for n in (4, 1 << 20)
    ]
    prof = tmp_path / "profile.json"
    prof.write_text(
        json.dumps(
            {
                "format": "delaycomm-profile",
                "version": 1,
                "histogram": {"base": base, "unit": "ns"},
                "metadata": {"world_size": 2},
                "ops": {"allreduce": cls},
            }
        )
    )
    env = {"DELAYCOMM_DELAY": f"profile:{prof}", "DELAYCOMM_STALENESS": "ssp:2"}
    (tmp_path / "run").mkdir()
    _job("forked", JOB, ["--steps", "120"], env, tmp_path / "run")
    docs = _stats(tmp_path / "run")
    _check_staleness(docs, bound=2)
    for st in (d["staleness"] for d in docs):
        late = st["stale"] + st["dropped"]
        assert late <= (st["fresh"] + late) / 2, f"more than one late contribution per step: {st}"
