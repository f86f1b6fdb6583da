"""The stats file: one per rank and group (placeholders, a directory, or added suffixes), checked writable when the
group is created (docs/telemetry.md). Real ranks, real Gloo."""

from __future__ import annotations

import json
import os
import re
import shutil
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


def test_stats_file_names_after_a_restart_or_in_a_repeated_cycle():
    from delaycomm._config import stats_file

    assert stats_file("s.json", 1, "0", 2, True, restart=1) == "s.rank1.restart1.json"
    assert stats_file("s-{restart}.json", 1, "0", 2, True, restart=1) == "s-1.rank1.json"
    assert stats_file("s-{restart}.json", 0, "0", 1, True) == "s-0.json"
    assert stats_file("s.json", 0, "2", 2, False, restart=1, cycle=2) == "s.group2.rank0.restart1.cycle2.json"


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
    # interpreter's exit handlers, with plain Gloo too (docs/known-issues.md; 1 in 15 here for each): that is
    # not what this test is about, and the stats are written before it.
    upstream_abort = proc.returncode == -6 and "terminate called without an active exception" in proc.stderr
    assert proc.returncode == 0 or upstream_abort, proc.stderr[-3000:]
    data = json.loads((tmp_path / "stats.json").read_text())
    assert data["ops"]["allreduce"]["calls"] == 2, data["ops"]["allreduce"]


# --- files that must not be replaced, paths that collide, repeated cycles -------------------------------

NOBODY = 65534


def _cases(rank, world, cases, rdzv):
    """Per case (stats template, environment, whether a directory takes the file's place after init): init, a few
    all_reduces, destroy; the init error, or the warnings of destroy."""
    import warnings

    import torch
    import torch.distributed as dist

    import delaycomm

    out = []
    for i, (template, env, make_dir) in enumerate(cases):
        os.environ.update(env)
        try:
            dist.init_process_group(
                "delaycomm",
                init_method=f"file://{rdzv}{i}",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=30),
                pg_options=delaycomm.DelayConfig(stats=template),
            )
        except ValueError as e:
            out.append(str(e))
            continue
        finally:
            for k in env:
                del os.environ[k]
        for _ in range(i % 3 + 1):  # a count that tells the cases' files apart
            dist.all_reduce(torch.ones(1))
        if make_dir:  # the path changes after the check: a directory, which no file can replace
            os.makedirs(os.path.join(template.format(rank=rank), "keep"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dist.destroy_process_group()
        out.append([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_stats_paths_that_must_not_be_replaced_collide_or_repeat(tmp_path):
    sticky, shared, cycles = tmp_path / "sticky", tmp_path / "shared", tmp_path / "cycles"
    for d, mode in ((sticky, 0o1777), (shared, 0o777), (cycles, 0o755)):
        d.mkdir()
        d.chmod(mode)
    (tmp_path / "r0").mkdir()
    (tmp_path / "r1").mkdir()
    for r in range(2):
        theirs = sticky / f"s.rank{r}.json"  # another user's file in a sticky directory (as /tmp)
        theirs.write_text("theirs")
        os.chown(theirs, NOBODY, NOBODY)
        readonly = shared / f"s.rank{r}.json"  # another user's read-only file in a directory anyone may write
        readonly.write_text("theirs")
        readonly.chmod(0o444)
        os.chown(readonly, NOBODY, NOBODY)
    cases = [
        (str(sticky / "s.json"), {}, False),
        (str(shared / "s.json"), {}, False),
        (str(tmp_path / "r{rank}" / ".." / "s.json"), {}, False),  # before: both ranks wrote tmp_path/s.json
        (str(cycles / "s.json"), {}, False),  # two cycles of one template: the second writes .cycle1
        (str(cycles / "s.json"), {}, False),
        (str(cycles / "s-{restart}.json"), {"TORCHELASTIC_RESTART_COUNT": "2"}, False),
        (str(cycles / "d{rank}.json"), {}, True),
        (str(tmp_path / "mine.json"), {}, False),  # this user's own file, made read-only
    ]
    for r in range(2):
        (tmp_path / f"mine.rank{r}.json").write_text("kept")
        (tmp_path / f"mine.rank{r}.json").chmod(0o444)
    res = run_procs(_cases, 2, cases, str(tmp_path / "rdzv"), timeout=180)
    for rank in range(2):
        got = [re.sub(r"group '\d+'", "group 'G'", m) if isinstance(m, str) else m for m in res[rank]]
        head = "delaycomm: invalid value {!r} for option 'stats' from the keyword stats= of DelayConfig: "
        own = "the file of rank {} in group 'G', {!r}, exists and "
        assert got[0] == head.format(cases[0][0]) + own.format(rank, str(sticky / f"s.rank{rank}.json")) + (
            f"belongs to another user (uid {NOBODY}); delaycomm replaces the file when the group is destroyed and "
            "never replaces another user's file; expected a writable path"
        )
        assert got[1] == head.format(cases[1][0]) + own.format(rank, str(shared / f"s.rank{rank}.json")) + (
            f"belongs to another user (uid {NOBODY}); delaycomm replaces the file when the group is destroyed and "
            "never replaces another user's file; expected a writable path"
        )
        assert got[2].startswith(head.format(cases[2][0]) + "'..' cancels the directory that holds {rank}"), got[2]
        assert got[3:6] == [[], [], []], got
        path = str(cycles / f"d{rank}.json")
        assert len(got[6]) == 1 and re.fullmatch(
            re.escape(f"delaycomm: the stats of group '0' were not written to {path!r}: [Errno 21] Is a directory: ")
            + rf"'{re.escape(str(cycles))}/\.d{rank}\.json\.\d+\.[0-9a-f]+\.tmp' -> '{re.escape(path)}' "
            + re.escape("(the path was checked when the group was created and has changed since)"),
            got[6][0],
        ), got[6]
        assert got[7] == head.format(cases[7][0]) + own.format(rank, str(tmp_path / f"mine.rank{rank}.json")) + (
            "is read-only (mode 0444); delaycomm replaces the file when the group is destroyed and never replaces "
            "a read-only file; expected a writable path"
        )
        for d in (sticky, shared):
            assert (d / f"s.rank{rank}.json").read_text() == "theirs"
        assert (tmp_path / f"mine.rank{rank}.json").read_text() == "kept"
    # every case's files, and nothing else: no temporary file left behind
    assert sorted(p.name for p in cycles.iterdir()) == sorted(
        ["s.rank0.json", "s.rank1.json", "s.rank0.cycle1.json", "s.rank1.cycle1.json", "s-2.rank0.json"]
        + ["s-2.rank1.json", "d0.json", "d1.json"]
    )
    for name, calls in [("s.rank1.json", 1), ("s.rank1.cycle1.json", 2), ("s-2.rank1.json", 3)]:
        assert json.loads((cycles / name).read_text())["ops"]["allreduce"]["calls"] == calls, name
    assert not (tmp_path / "s.json").exists() and not list(tmp_path.glob("s.rank*.json"))


_AS_ANOTHER_USER = """
import json, torch, torch.distributed as dist
import delaycomm
out = []
for i, stats in enumerate({paths!r}):
    try:
        dist.init_process_group("delaycomm", init_method=f"file://{rdzv}{{i}}", rank=0, world_size=1,
                                pg_options=delaycomm.DelayConfig(stats=stats))
    except ValueError as e:
        out.append(str(e))
        continue
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()
    out.append(None)
print(json.dumps(out))
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="runs a job as the user nobody: needs root and setpriv",
)
def test_a_file_the_user_may_not_replace_fails_at_init_as_a_user_without_privileges():
    # As root, a sticky directory stops nothing; as another user it does: before, the job of user nobody passed
    # init, then exited 0 with no stats file and a .tmp file left (rename refused in the sticky directory).
    import sys
    import tempfile

    from tests.harness import run_command

    root = tempfile.mkdtemp(prefix="delaycomm-stats-")  # under /tmp: pytest's own tmp_path is private to root
    try:
        os.chmod(root, 0o1777)
        mine = os.path.join(root, "root.json")  # root's file in a sticky directory: nobody may not replace it
        with open(mine, "w") as f:
            f.write("root's")
        script = _AS_ANOTHER_USER.format(paths=[mine], rdzv=os.path.join(root, "rdzv"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_")}
        proc = run_command(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", script],
            timeout=100,
            env=env,
            cwd=root,
        )
        if proc.returncode != 0 and ("Permission denied" in proc.stderr or "No module named" in proc.stderr):
            pytest.skip(f"the user nobody cannot run this interpreter here: {proc.stderr[-300:]}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.splitlines()[-1]) == [
            f"delaycomm: invalid value {mine!r} for option 'stats' from the keyword stats= of DelayConfig: the file "
            f"of rank 0 in group '0', {mine!r}, exists and belongs to another user (uid 0); delaycomm replaces the "
            "file when the group is destroyed and never replaces another user's file; expected a writable path"
        ]
        assert sorted(os.listdir(root)) == ["rdzv0", "root.json"] or sorted(os.listdir(root)) == ["root.json"]
    finally:
        shutil.rmtree(root, ignore_errors=True)


_RESTARTED_JOB = """
import os, sys, time, torch, torch.distributed as dist
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
store, rank, world = next(dist.rendezvous("env://"))
for cycle in range(2):  # two init/destroy cycles in each attempt
    # NOTE: each cycle under a store prefix of its own: a second cycle over the same keys can read the first
    # cycle's Gloo addresses, and its connect is refused (under load; on plain Gloo too).
    dist.init_process_group("delaycomm", store=dist.PrefixStore(f"cycle{cycle}/", store), rank=rank, world_size=world)
    for _ in range(1 + restart * 2 + cycle):  # 1, 2 calls in attempt 0; 3, 4 after the restart
        dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()
if restart == 0:
    # Both ranks have written their files before either fails: torchrun stops the other workers as soon as one
    # fails, and a rank stopped before its last destroy writes no file for that cycle.
    here = os.path.dirname(os.environ["DELAYCOMM_STATS"])
    open(os.path.join(here, "done." + os.environ["RANK"]), "w").close()
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(here, f"done.{r}")) for r in range(int(os.environ["WORLD_SIZE"]))):
        assert time.monotonic() < deadline, "the other rank never finished its cycles"
        time.sleep(0.05)
    sys.exit(3)  # torchrun restarts the job
"""


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_torchrun_restart_and_a_second_cycle_keep_their_own_stats_files(tmp_path):
    from tests.harness import free_port, run_cli

    script = tmp_path / "job.py"
    script.write_text(_RESTARTED_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_")}
    # NOTE: without it a restart fails on plain Gloo too (pytorch/pytorch#135712).
    env.update({"DELAYCOMM_STATS": str(tmp_path / "stats.json"), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    env.setdefault("OMP_NUM_THREADS", "1")
    argv = ["--nproc_per_node", "2", "--max-restarts", "1", "--rdzv-backend", "c10d"]
    argv += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(script)]
    proc = run_cli(argv, module="torch.distributed.run", env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = {p.name: json.loads(p.read_text())["ops"]["allreduce"]["calls"] for p in tmp_path.glob("stats*.json")}
    assert files == {  # before: 2 files, the last cycle's, overwriting the three before
        "stats.rank0.json": 1,
        "stats.rank1.json": 1,
        "stats.rank0.cycle1.json": 2,
        "stats.rank1.cycle1.json": 2,
        "stats.rank0.restart1.json": 3,
        "stats.rank1.restart1.json": 3,
        "stats.rank0.restart1.cycle1.json": 4,
        "stats.rank1.restart1.cycle1.json": 4,
    }
