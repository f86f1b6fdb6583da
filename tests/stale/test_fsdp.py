"""Staleness under FSDP2 as a user gets it: unmodified FSDP2 scripts started as torchrun starts them
(examples/train_fsdp2.py, and PyTorch Lightning's ModelParallelStrategy when Lightning is installed; in ranks forked
that way in the default run, under torchrun itself with scripts/test.sh --slow: tests/harness/user_job.py),
configured only through DELAYCOMM_* (step_ms=auto, the scope keys of docs/staleness.md, stale_policy=ema).

Asserts, from every rank's stats file, that FSDP2's reduce-scatters went stale (>= 5% of contributions late, the
bound held, step_ms calibrated on an FSDP2 parameter group's stream), and that training still works: the final
loss (mean of rank 0's last 10 steps) under ssp:2 + ema is within 10% of BSP's with the same seeds (torch seeds 0
and 1 + rank in the script, DELAYCOMM_SEED at its default, 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.user_job import LAUNCHERS
from tests.stale.test_acceptance import USER_ENV, _check_staleness, _job, _stats

pytestmark = [pytest.mark.multiproc]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_fsdp2.py"


def _final_loss(path: Path) -> float:
    losses = [float(line) for line in path.read_text().split()]
    assert len(losses) == 200, len(losses)
    return sum(losses[-10:]) / 10


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_unmodified_fsdp2_example_goes_stale_and_trains_like_bsp(tmp_path, launcher):
    runs = {}
    for staleness in ("bsp", "ssp:2"):
        d = tmp_path / staleness.replace(":", "")
        d.mkdir()
        proc = _job(
            launcher, EXAMPLE, ["--loss-log", str(d / "loss.txt")], {**USER_ENV, "DELAYCOMM_STALENESS": staleness}, d
        )
        runs[staleness] = (proc, d)

    proc, d = runs["ssp:2"]
    docs = _stats(d)
    assert len(docs) == 2, f"expected a stats file per rank, got {len(docs)}"
    st = _check_staleness(docs, bound=2)
    # Calibrated on one of FSDP2's parameter groups (a new reduce-scatter input every step: the owner names it).
    assert st["step_key"].startswith("'FSDP2 params "), st
    assert "reduce_scatter" in st["step_key"], st
    for doc in docs:
        rs = doc["ops"]["_reduce_scatter_base"]
        # 200 steps x 2 parameter groups (the root holds none), and one per stream left pending for flush.
        assert 400 <= rs["calls"] <= 402, rs
        assert doc["staleness"]["keys"] == 2, doc["staleness"]
    assert "median of 5 intervals of 'FSDP2 params " in proc.stdout, proc.stdout[-3000:]

    bsp_docs = _stats(runs["bsp"][1])
    assert all(doc["staleness"]["fresh"] + doc["staleness"]["stale"] == 0 for doc in bsp_docs)

    bsp, ssp = _final_loss(runs["bsp"][1] / "loss.txt"), _final_loss(d / "loss.txt")
    assert bsp < 0.5, f"BSP did not train: final loss {bsp}"
    print(f"final loss (mean of the last 10 steps): bsp {bsp:.4f}, ssp:2 + ema {ssp:.4f}")
    assert abs(ssp - bsp) <= 0.1 * bsp, f"ssp:2 + ema final loss {ssp:.4f} vs BSP {bsp:.4f}"


LIGHTNING_JOB = Path(__file__).resolve().parent / "scripts" / "lightning_fsdp2.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lightning_model_parallel_strategy_goes_stale(tmp_path):
    # PyTorch Lightning is optional (pip install lightning); its FSDPStrategy is FSDP1 and needs a GPU, so the CPU
    # test runs FSDP2 through ModelParallelStrategy (fully_shard in configure_model).
    pytest.importorskip("lightning", reason="PyTorch Lightning is not installed (optional: pip install lightning)")
    _job("torchrun", LIGHTNING_JOB, [], USER_ENV, tmp_path)
    # The default group's file per rank (the mesh's size-1 tensor-parallel groups write their own, with nothing).
    docs = [d for d in _stats(tmp_path) if d["ops"].get("_reduce_scatter_base", {}).get("calls", 0) > 0]
    assert len(docs) == 2, f"expected the data-parallel group's stats from each rank, got {len(docs)}"
    st = _check_staleness(docs, bound=2)
    assert st["step_key"].startswith("'FSDP2 params "), st
