"""Every wait of the staleness engine (docs/staleness.md, "Waits"), on real ranks: the SSP gate, the step_ms=auto
agreement and flush's exchange end at once when the group is destroyed, follow ``group.set_timeout``, end as soon
as a member of the group dies (not at the group's timeout), and end in the same error on every rank, a rank that
arrives after the others gave up included.

The groups are created with a 30 s timeout wherever the point is that a wait does not last the timeout.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import timedelta

import pytest

from tests.harness import free_port, run_procs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))

from engine_waits import gate_seed

pytestmark = [pytest.mark.multiproc]

LONG = timedelta(seconds=30)  # the groups' timeout where a wait must end well before it
SHORT_S = 1.0  # the timeout set_timeout sets
# "At once", against the group's timeout of 30 s that these waits ran to before: a third of it. A loaded machine's
# scheduling delays (seconds at most, at a load of 10 on 2 cores) stay far below it; a wait to the timeout is far
# above (docs/ci.md, "Timing under load").
AT_ONCE_S = 10.0


def _first_line(e: BaseException) -> str:
    return str(e).split("Exception raised from")[0].strip()


def _outcome(fn) -> dict:
    """How fn() ended: the error's type and first line (or "ok"), when (monotonic and wall clock)."""
    t0 = time.monotonic()
    try:
        fn()
        kind, msg = "ok", ""
    except Exception as e:  # noqa: BLE001 - the type is part of what is checked
        kind, msg = type(e).__name__, _first_line(e)
    return {"kind": kind, "msg": msg, "elapsed": time.monotonic() - t0, "ended": time.monotonic(), "wall": time.time()}


def _stale_group(timeout=LONG, **options):
    import torch.distributed as dist

    import delaycomm

    cfg = delaycomm.DelayConfig(
        **{"delay": "exp:p99=5ms", "delay_fraction": 0.3, "seed": 1, "staleness": "ssp:2", **options}
    )
    return dist.new_group(backend="delaycomm", pg_options=cfg, timeout=timeout)


def _calls(group, n: int) -> None:
    import torch

    import delaycomm

    g = torch.zeros(8)
    for _ in range(n):
        delaycomm.stale_allreduce(g, key=0, group=group)


def _calibrate(group) -> None:
    """The 6th call of key 0: step_ms=auto's agreement (docs/staleness.md, "Calibration")."""
    _calls(group, 1)


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    """Runs fn on a thread of its own; the dict gets its _outcome()."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(_outcome(fn)))
    thread.start()
    return thread, result


def _ended(thread: threading.Thread, result: dict, since: float) -> dict:
    thread.join(40)
    return {**result, "alive": thread.is_alive(), "after_s": result.get("ended", 1e9) - since}


# ---------------------------------------------------------------------------------------------------------------
# destroy_process_group ends every wait at once


def _destroy_ranks(rank, world, seed):
    import torch
    import torch.distributed as dist

    import delaycomm

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    calibration, flush = _stale_group(), _stale_group()
    # The SSP gate: rank 1's contribution at key 0's second step is 20 s late (ssp:2, a 10 ms step).
    gate = _stale_group(delay="const:20s", delay_fraction=0.5, seed=seed, delay_ranks=[1], step_ms=10.0)
    _calls(calibration, 5)
    _calls(flush, 12)
    g = torch.ones(4)
    delaycomm.stale_allreduce(g, key=0, group=gate)  # step 0: nothing is late yet
    # Rank 0 waits in the agreement of step_ms=auto and in flush's exchange (rank 1 never makes the calibrating
    # call, nor calls flush); rank 1 waits at the gate, and rank 0 in Gloo for rank 1's reduction.
    waits = {"gate": _in_thread(lambda: delaycomm.stale_allreduce(g, key=0, group=gate))}
    if rank == 0:
        waits["calibration"] = _in_thread(lambda: _calibrate(calibration))
        waits["flush"] = _in_thread(lambda: delaycomm.flush(flush))
    time.sleep(1.5)
    out = {}
    if rank == 1:  # rank 1 destroys the gate's group first, so that its gate wait ends by destroy, not by a peer
        destroyed = time.monotonic()
        dist.destroy_process_group(gate)
        out["gate"] = _ended(*waits["gate"], destroyed)
        time.sleep(1.0)  # then rank 0 destroys the others under its waits
        dist.destroy_process_group(calibration)
        dist.destroy_process_group(flush)
        return out
    destroyed = time.monotonic()
    dist.destroy_process_group(calibration)
    dist.destroy_process_group(flush)
    out["calibration"] = _ended(*waits["calibration"], destroyed)
    out["flush"] = _ended(*waits["flush"], destroyed)
    time.sleep(0.5)
    dist.destroy_process_group(gate)
    out["gate"] = _ended(*waits["gate"], destroyed)
    return out


@pytest.mark.timeout(150)
def test_destroy_ends_the_calibration_flush_and_gate_waits_at_once():
    results = run_procs(_destroy_ranks, 2, gate_seed("const:20s"), timeout=140)
    for name, wording in (
        ("calibration", "while this rank waited to agree on step_ms=auto; nothing was agreed"),
        ("flush", "while this rank waited in flush for every rank's record; nothing was agreed"),
    ):
        r = results[0][name]
        assert not r["alive"] and r["kind"] == "DistBackendError", (name, r)
        assert f"the group was shut down (destroy_process_group or abort) {wording}" in r["msg"], (name, r)
        assert r["after_s"] < AT_ONCE_S, (name, r)  # before: at the group's timeout (30 s)
    late = results[1]["gate"]
    assert not late["alive"] and late["after_s"] < AT_ONCE_S, late
    assert late["kind"] == "DistBackendError", late
    assert "while this call waited at the ssp:2 gate; the reduction was not issued" in late["msg"], late
    # Rank 0 issued its reduction and waited in Gloo for rank 1's: destroy ends that too.
    assert not results[0]["gate"]["alive"] and results[0]["gate"]["kind"] != "ok", results[0]


# ---------------------------------------------------------------------------------------------------------------
# set_timeout: the waits that follow it are bounded by the new timeout; a rank that comes after the others gave up
# gets their verdict


def _set_timeout_ranks(rank, world, seed):
    import torch
    import torch.distributed as dist

    import delaycomm

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    calibration, flush = _stale_group(), _stale_group()
    # The gate: rank 1's contribution at key 0's second step is 3 s late: under ssp:1 with a 10 ms step, a gate
    # wait of ~3 s, within the 30 s the group was created with, beyond the timeout set since.
    gate = _stale_group(
        delay="const:3s", delay_fraction=0.5, seed=seed, delay_ranks=[1], staleness="ssp:1", step_ms=10.0
    )
    _calls(calibration, 5)
    _calls(flush, 12)
    g = torch.ones(4)
    delaycomm.stale_allreduce(g, key=0, group=gate)
    for group in (calibration, flush, gate):
        group.set_timeout(timedelta(seconds=SHORT_S))
    waits = {"gate": _in_thread(lambda: delaycomm.stale_allreduce(g, key=0, group=gate))}
    if rank == 1:
        time.sleep(SHORT_S + 1.0)  # past rank 0's deadlines
    waits["calibration"] = _in_thread(lambda: _calibrate(calibration))
    waits["flush"] = _in_thread(lambda: delaycomm.flush(flush))
    return {name: _ended(*wait, 0.0) for name, wait in waits.items()}


@pytest.mark.timeout(150)
def test_set_timeout_bounds_the_waits_after_it_and_a_late_rank_gets_the_same_verdict():
    results = run_procs(_set_timeout_ranks, 2, gate_seed("const:3s"), timeout=140)
    r0, r1 = results
    ms = int(SHORT_S * 1000)
    for name, wording in (
        ("calibration", f"rank(s) 1 did not reach the point of calibration within {ms} ms (the group's timeout"),
        ("flush", f"timed out after {ms} ms (the group's timeout): rank(s) 1 did not call flush"),
    ):
        assert r0[name]["kind"] == "DistBackendError" and wording in r0[name]["msg"], (name, r0[name])
        assert SHORT_S - 0.1 <= r0[name]["elapsed"] < SHORT_S + AT_ONCE_S, (name, r0[name])  # before: 30 s
        # Rank 1 comes after rank 0's deadline: the same error, at once (before: it went on with rank 0's record
        # and waited in Gloo, or in the store, for a rank that had given up).
        assert (r1[name]["kind"], r1[name]["msg"]) == (r0[name]["kind"], r0[name]["msg"]), (name, results)
        assert r1[name]["elapsed"] < AT_ONCE_S, (name, r1[name])
    for r in results:  # every rank computes the gate timeout from the schedule
        assert r["gate"]["kind"] == "DistBackendError", r["gate"]
        assert f"the ssp:1 gate timed out after {ms} ms (the group's timeout)" in r["gate"]["msg"], r["gate"]
        assert r["gate"]["elapsed"] < SHORT_S + AT_ONCE_S, r["gate"]
    assert r0["gate"]["msg"] == r1["gate"]["msg"], results


# ---------------------------------------------------------------------------------------------------------------
# A member that dies: the others' waits end at once, with the same error on every rank


def _die_in(seconds: float) -> None:
    """This process exits (code 3) in `seconds`, whatever its main thread does; the time goes to DEATH_FILE."""

    def die():
        time.sleep(seconds)
        with open(os.environ["DEATH_FILE"], "w") as f:
            f.write(repr(time.time()))
        os._exit(3)

    threading.Thread(target=die, daemon=True).start()


def _after_death(out: dict) -> dict:
    with open(os.environ["DEATH_FILE"]) as f:
        return {**out, "after_death_s": out["wall"] - float(f.read())}


def _member_death_ranks(rank, world, seed):
    """Rank 2 of 3 dies while ranks 0 and 1 wait out an SSP gate timeout (rank 2 is 60 s late; the timeout is 30 s)
    and rank 0 waits in the agreement of step_ms=auto (rank 2 does not make the calibrating call; rank 1 makes it
    later)."""
    import torch
    import torch.distributed as dist

    import delaycomm

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    calibration = _stale_group()
    gate = _stale_group(delay="const:60s", delay_fraction=0.5, seed=seed, delay_ranks=[2], step_ms=10.0)
    _calls(calibration, 5)
    g = torch.ones(4)
    delaycomm.stale_allreduce(g, key=0, group=gate)
    if rank == 2:
        _die_in(1.0)
        delaycomm.stale_allreduce(g, key=0, group=gate)  # waits out the gate timeout, and dies there

    def calibrate():
        if rank == 1:
            time.sleep(2.5)  # comes after rank 2's death: rank 0 must not wait for it, and it gets rank 0's verdict
        _calibrate(calibration)

    waits = {
        "calibration": _in_thread(calibrate),
        "gate": _in_thread(lambda: delaycomm.stale_allreduce(g, key=0, group=gate)),
    }
    out = {name: _after_death(_ended(*wait, 0.0)) for name, wait in waits.items()}
    _survivors_done(rank, (0, 1))  # rank 0 leaving first would be a second death in rank 1's verdict
    return out


def _survivors_done(rank: int, ranks: tuple[int, ...], timeout_s: float = 30.0) -> None:
    """Each of ``ranks`` says its waits ended (a file beside DEATH_FILE) and waits, bounded, for the others'."""
    base = os.environ["DEATH_FILE"]
    with open(f"{base}.done{rank}", "w"):
        pass
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(f"{base}.done{r}") for r in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_a_member_that_dies_ends_the_others_calibration_and_gate_waits_at_once(tmp_path):
    results = run_procs(
        _member_death_ranks,
        3,
        gate_seed("const:60s", late=2),
        timeout=100,
        expect_exit={2: 3},
        env={"DEATH_FILE": str(tmp_path / "d")},
    )
    for name in ("calibration", "gate"):
        survivors = [r[name] for r in results[:2]]
        for rank, r in enumerate(survivors):
            assert r["kind"] == "DistBackendError", (name, r)
            # Rank 1 learns it from rank 0 (the peer watch's hub), rank 0 from rank 2's connection.
            assert "rank(s) 2 left the group (its process ended" in r["msg"], (name, r)
            if name == "calibration" and rank == 1:  # it came 2.5 s in, and got rank 0's sealed verdict at once
                assert r["elapsed"] - 2.5 < AT_ONCE_S, r
            else:
                assert r["after_death_s"] < AT_ONCE_S, (name, r)  # before: at the group's timeout (30 s)
        assert survivors[0]["msg"] == survivors[1]["msg"], (name, survivors)  # the same error on every rank


def _store_host_death_ranks(rank, world, port):
    """Rank 0 hosts the store (tcp://, as env:// and mp.spawn do) and dies while rank 1 waits in flush."""
    import torch.distributed as dist

    import delaycomm

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = _stale_group()
    _calls(group, 12)
    if rank == 0:
        _die_in(1.0)
        time.sleep(30)
    return _after_death(_outcome(lambda: delaycomm.flush(group)))


@pytest.mark.timeout(120)
def test_the_store_host_that_dies_ends_flush_with_a_delaycomm_error_at_once(tmp_path):
    env = {"DEATH_FILE": str(tmp_path / "d"), "TORCHELASTIC_USE_AGENT_STORE": "False"}  # rank 0 hosts its store
    r = run_procs(_store_host_death_ranks, 2, free_port(), timeout=100, expect_exit={0: 3}, env=env)[1]
    assert r["kind"] == "DistBackendError" and r["msg"].startswith("delaycomm: flush on group"), r
    # Whichever rank 1 sees first, the store's connection or the peer watch's: never c10d's raw network error.
    assert "rank(s) 0 left the group" in r["msg"] or "the group's store failed" in r["msg"], r
    assert r["after_death_s"] < AT_ONCE_S, r  # before: at the group's timeout (30 s)


# ---------------------------------------------------------------------------------------------------------------
# Under torchrun: a survivor raises at once, so its stats file is written before the agent stops it

DIES_MID_CALIBRATION = """
import os
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("delaycomm")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(20):
    # Step 0's bucket is DDP's pre-rebuild bucket, a stream of its own seen once; the rebuilt bucket's 6th call
    # (its 5th interval), in step 6, calibrates step_ms=auto. Rank 1 dies before it: rank 0 waits in the agreement.
    if dist.get_rank() == 1 and step == 6:
        os._exit(1)
    loss = model(torch.randn(8, 16)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_torchrun_a_survivor_of_a_death_in_calibration_raises_and_writes_its_stats(tmp_path):
    from tests.harness.user_job import run_user_job

    script = tmp_path / "dies_mid_calibration.py"
    script.write_text(DIES_MID_CALIBRATION)
    env = {
        "DELAYCOMM_DELAY": "exp:p99=5ms",
        "DELAYCOMM_DELAY_FRACTION": "0.3",
        "DELAYCOMM_STALENESS": "ssp:2",
        "DELAYCOMM_STATS": str(tmp_path / "stats.json"),
    }
    proc = run_user_job("torchrun", script, [], env, tmp_path, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "DistBackendError: delaycomm: staleness on group '0': agreeing on step_ms=auto failed: rank(s) 1 left" in out
    # Before: rank 0 waited in the agreement until torchrun's agent stopped it (SIGTERM, ~0.1 s after the death),
    # and its stats were lost.
    stats = tmp_path / "stats.rank0.json"
    assert stats.is_file(), out[-4000:]
    written = json.loads(stats.read_text())
    assert written["rank"] == 0, written["rank"]
    # The death came where the script means it to: steps 0-5 reduced in Gloo without an error, the 7th reduction
    # stopped in the agreement, before anything was calibrated (a death in a Gloo all-reduce would be counted in
    # "errors" and end in Gloo's own "Connection reset/closed by peer").
    st = written["staleness"]
    assert (st["steps"], st["step_source"], st["stale"]) == (6, "calibrating", 0), st
    assert (written["ops"]["allreduce"]["calls"], written["ops"]["allreduce"]["errors"]) == (6, 0), written["ops"]
