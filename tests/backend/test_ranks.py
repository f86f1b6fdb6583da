"""``delay_ranks`` and ``slowdown`` name global ranks, in every group (docs/config.md, "Ranks"): a group delays
only those of its members named there; a rank outside a group is not that group's error, one outside the job is.
Subgroups with one seed draw different schedules. Real processes, real Gloo, the options set as a user sets them.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.harness import run_procs

pytestmark = [pytest.mark.multiproc]

CALLS = 3


def _delayed(group, calls: int = CALLS) -> int:
    """This rank's delayed all-reduces among ``calls`` on ``group``."""
    import torch
    import torch.distributed as dist

    import delaycomm

    for _ in range(calls):
        dist.all_reduce(torch.ones(1), group=group)
    return delaycomm.stats(group)["ops"]["allreduce"]["delayed_calls"]


def _pattern(group, calls: int) -> list[bool]:
    """Which of ``calls`` all-reduces on ``group`` were delayed on this rank, call by call."""
    import torch
    import torch.distributed as dist

    import delaycomm

    out, before = [], 0
    for _ in range(calls):
        dist.all_reduce(torch.ones(1), group=group)
        now = delaycomm.stats(group)["ops"]["allreduce"]["delayed_calls"]
        out.append(now > before)
        before = now
    return out


def _job(rank, world):
    """DELAYCOMM_DELAY_RANKS=0 (the environment, as torchrun users set it) with every call delayed."""
    import torch.distributed as dist

    import delaycomm

    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60))
    out = {"world": _delayed(dist.group.WORLD)}
    sub = {}
    for members in ([2, 3], [1, 2, 3]):  # before: group rank 0 of each was delayed (global 2, then global 1)
        g = dist.new_group(members)
        if rank in members:
            sub[str(members)] = _delayed(g)
    out["sub"] = sub
    # pg_options name global ranks too: rank 3 in a group of two is not an error there (before: 'rank 3 not in a
    # group of 2'), and delays rank 3 only.
    g = dist.new_group([0, 1], pg_options=delaycomm.DelayConfig(delay_ranks="3"))
    if rank in (0, 1):
        out["[0, 1] with delay_ranks=3"] = _delayed(g)
    g = dist.new_group([2, 3], pg_options=delaycomm.DelayConfig(delay_ranks="3", slowdown="3:1.5x"))
    if rank in (2, 3):
        out["[2, 3] with delay_ranks=3"] = _delayed(g)
        out["[2, 3] slowed calls"] = delaycomm.stats(g)["slowdown"]["calls"]
    # A rank outside the job is still a mistake, on every member.
    try:
        dist.new_group([0, 1, 2, 3], pg_options=delaycomm.DelayConfig(delay_ranks="0,4"))
        out["rank 4"] = "created"
    except ValueError as e:
        out["rank 4"] = str(e).splitlines()[-1]
    # Equivalent values are one value: 'all' and '0,1' in the group of ranks 0 and 1, '2,3,0' in that of 2 and 3.
    spelled = {0: "all", 1: "0,1", 2: "all", 3: "2,3,0"}[rank]
    pairs = [
        dist.new_group(members, pg_options=delaycomm.DelayConfig(delay_ranks=spelled, delay_fraction=0.5))
        for members in ([0, 1], [2, 3])
    ]
    g = pairs[0] if rank in (0, 1) else pairs[1]
    out["pattern"] = _pattern(g, 40)
    g = dist.new_group(pg_options=delaycomm.DelayConfig(delay_fraction=-0.0 if rank % 2 else 0.0))  # one value
    out["-0"] = _delayed(g)
    return out


@pytest.mark.timeout(200)
def test_delay_ranks_and_slowdown_name_global_ranks_in_every_group():
    env = {"DELAYCOMM_DELAY": "const:1ms", "DELAYCOMM_DELAY_FRACTION": "1", "DELAYCOMM_DELAY_RANKS": "0"}
    res = run_procs(_job, 4, timeout=180, env=env)
    assert [r["world"] for r in res] == [CALLS, 0, 0, 0]
    assert [r["sub"] for r in res] == [
        {},
        {"[1, 2, 3]": 0},
        {"[2, 3]": 0, "[1, 2, 3]": 0},
        {"[2, 3]": 0, "[1, 2, 3]": 0},
    ]
    assert [r.get("[0, 1] with delay_ranks=3") for r in res] == [0, 0, None, None]
    assert [r.get("[2, 3] with delay_ranks=3") for r in res] == [None, None, 0, CALLS]
    assert res[2]["[2, 3] slowed calls"] == 0 and res[3]["[2, 3] slowed calls"] > 0
    assert [r["rank 4"] for r in res] == [
        "delaycomm: invalid value '0,4' for option 'delay_ranks' from the keyword delay_ranks= of DelayConfig: "
        "rank 4 not in a job of 4 ranks; expected global ranks in [0, 4)"
    ] * 4
    # Two disjoint subgroups, one seed: group rank 0 of each (global 0 and 2) used to draw the same schedule.
    patterns = [r["pattern"] for r in res]
    assert all(0 < sum(p) < len(p) for p in patterns), patterns
    assert patterns[0] != patterns[2] and patterns[1] != patterns[3], patterns
    assert [r["-0"] for r in res] == [0, 0, 0, 0]
