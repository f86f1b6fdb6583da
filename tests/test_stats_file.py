"""The stats file: one per rank and group (placeholders, a directory, or added suffixes), checked writable when the
group is created (issue 10, defect 13). Real ranks, real Gloo."""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta

import pytest

from tests.harness import run_procs


@pytest.mark.parametrize(
    "template, rank, group, world, default, expected",
    [
        ("s.json", 0, "0", 1, True, "s.json"),  # one process: the path as given
        ("s.json", 1, "0", 2, True, "s.rank1.json"),  # several ranks: .rank{R} added
        ("s.json", 1, "3", 2, False, "s.group3.rank1.json"),  # another group: .group{G} added too
        ("s", 1, "3", 2, False, "s.group3.rank1"),
        ("run/{group}-{rank}.json", 1, "3", 2, False, "run/3-1.json"),
        ("run/{rank}/s.json", 1, "0", 2, True, "run/1/s.json"),
        ("s-{rank}.json", 1, "3", 2, False, "s-1.group3.json"),
        ("d/", 1, "0", 2, True, "d/stats.rank1.json"),  # a directory: d/stats.json, then the same rule
        ("d/", 0, "0", 1, True, "d/stats.json"),
        ("s{{x}}.json", 0, "0", 1, True, "s{x}.json"),
    ],
)
def test_stats_file_names(template, rank, group, world, default, expected):
    from delaycomm._config import stats_file

    assert stats_file(template, rank, group, world, default) == expected


def _two_groups(rank, world, templates, rdzv):
    """Per template: a world group and a subgroup, one all_reduce on the world and two on the subgroup, destroy."""
    import torch
    import torch.distributed as dist

    for i, stats in enumerate(templates):
        os.environ["DELAYCOMM_STATS"] = stats
        dist.init_process_group(
            "delaycomm", init_method=f"file://{rdzv}{i}", rank=rank, world_size=world, timeout=timedelta(seconds=30)
        )
        sub = dist.new_group([0, 1], timeout=timedelta(seconds=30))
        t = torch.ones(1)
        dist.all_reduce(t)
        dist.all_reduce(t, group=sub)
        dist.all_reduce(t, group=sub)
        dist.destroy_process_group()  # writes every group's file


LAYOUTS = {  # directory -> (template, the files expected in it)
    "plain": (
        "{d}/stats.json",
        ["stats.group1.rank0.json", "stats.group1.rank1.json", "stats.rank0.json", "stats.rank1.json"],
    ),
    "directory": (
        "{d}/",
        ["stats.group1.rank0.json", "stats.group1.rank1.json", "stats.rank0.json", "stats.rank1.json"],
    ),
    "placeholders": ("{d}/g{{group}}-r{{rank}}.json", ["g0-r0.json", "g0-r1.json", "g1-r0.json", "g1-r1.json"]),
}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    for name in LAYOUTS:
        (root / name).mkdir()
    templates = [t.format(d=root / name) for name, (t, _) in LAYOUTS.items()]
    run_procs(_two_groups, 2, templates, str(root / "rdzv"), timeout=150)
    return root


@pytest.mark.multiproc
@pytest.mark.timeout(200)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_rank_and_group_writes_its_own_file(layouts, layout):
    # Before: all four (2 ranks x 2 groups) wrote one path; the last writer's file was all that was left.
    d = layouts / layout
    assert sorted(p.name for p in d.iterdir()) == LAYOUTS[layout][1]
    for name, (group, rank, calls) in zip(
        LAYOUTS[layout][1],
        [("1", 0, 2), ("1", 1, 2), ("0", 0, 1), ("0", 1, 1)]
        if layout != "placeholders"
        else [("0", 0, 1), ("0", 1, 1), ("1", 0, 2), ("1", 1, 2)],
    ):
        data = json.loads((d / name).read_text())
        assert (data["group"], data["rank"], data["ops"]["allreduce"]["calls"]) == (group, rank, calls), name


def _unwritable(rank, world, cases, rdzv):
    import torch.distributed as dist

    import delaycomm

    out = []
    for i, template in enumerate(cases):
        try:
            dist.init_process_group(
                "delaycomm",
                init_method=f"file://{rdzv}{i}",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=20),
                pg_options=delaycomm.DelayConfig(stats=template),
            )
        except ValueError as e:
            out.append(str(e))
            continue
        out.append(None)
        dist.destroy_process_group()
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_an_unwritable_stats_path_fails_at_init_on_every_rank(tmp_path):
    # Before: /proc/x.json was accepted and the write failed at destroy with a log warning only (exit 0).
    fifo = tmp_path / "fifo.rank{rank}.json"
    for r in range(2):
        os.mkfifo(str(fifo).format(rank=r))
    cases = ["/proc/x.json", str(tmp_path / "fifo.json"), str(tmp_path / "{rank}" / "s.json")]
    res = run_procs(_unwritable, 2, cases, str(tmp_path / "rdzv"), timeout=90)
    for rank in range(2):
        # torch names the world group by a counter that a failed init does not reset
        got = [re.sub(r"in group '\d+'", "in group 'G'", m or "") for m in res[rank]]
        head = (
            f"delaycomm: invalid value {{!r}} for option 'stats' from the keyword stats= of DelayConfig: the file "
            f"of rank {rank} in group 'G', {{!r}}, {{}}; expected a writable path"
        )
        assert got == [
            head.format("/proc/x.json", f"/proc/x.rank{rank}.json", "cannot be written (No such file or directory)"),
            head.format(cases[1], str(tmp_path / f"fifo.rank{rank}.json"), "exists and is not a regular file"),
            head.format(cases[2], str(tmp_path / str(rank) / "s.json"), "is in a directory that does not exist"),
        ], res[rank]


_NEVER_DESTROYED = """
import torch, torch.distributed as dist
import delaycomm
dist.init_process_group("delaycomm", init_method="file://{rdzv}", rank=0, world_size=1)
t = torch.ones(2)
dist.all_reduce(t)
dist.all_reduce(t)
"""  # exits without destroy_process_group, as PyTorch Lightning scripts do


@pytest.mark.timeout(120)
def test_a_group_never_destroyed_writes_its_stats_at_exit(tmp_path):
    from tests.harness import run_cli

    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_")}
    env["DELAYCOMM_STATS"] = str(tmp_path / "stats.json")
    proc = run_cli(["-c", _NEVER_DESTROYED.format(rdzv=tmp_path / "rdzv")], env=env, timeout=100)
    # NOTE: a process that exits with a Gloo group never destroyed aborts now and then in teardown, after the
    # interpreter's exit handlers, with plain Gloo too (README, "Known issues"; 1 in 15 here for each): that is
    # not what this test is about, and the stats are written before it.
    upstream_abort = proc.returncode == -6 and "terminate called without an active exception" in proc.stderr
    assert proc.returncode == 0 or upstream_abort, proc.stderr[-3000:]
    data = json.loads((tmp_path / "stats.json").read_text())
    assert data["ops"]["allreduce"]["calls"] == 2, data["ops"]["allreduce"]
