"""Every rank agrees, or every rank fails: options that must match are compared when a group is created (real
processes, real Gloo, a timeout on each run; docs/config.md)."""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta

import pytest

from tests.harness import run_in_child, run_procs

pytestmark = [pytest.mark.multiproc]

# option -> (rank 0's keyword value, rank 1's, the line the error shows for it). Every option that must match.
MISMATCH = {
    "delay": (
        "exp:p99=400ms",
        "exp:p99=200ms",
        "  delay: 'exp:p99=400ms' on rank 0 (from the keyword delay= of DelayConfig); 'exp:p99=200ms' on rank 1 "
        "(from the keyword delay= of DelayConfig)",
    ),
    "delay_fraction": (
        0.3,
        0.5,
        "  delay_fraction: '0.3' on rank 0 (from the keyword delay_fraction= of "
        "DelayConfig); '0.5' on rank 1 (from the keyword delay_fraction= of DelayConfig)",
    ),
    "delay_ranks": (
        "0",
        "all",
        "  delay_ranks: '0' on rank 0 (from the keyword delay_ranks= of DelayConfig); 'all' "
        "on rank 1 (from the keyword delay_ranks= of DelayConfig)",
    ),
    "delay_ops": (
        "allreduce",
        "broadcast",
        "  delay_ops: 'allreduce' on rank 0 (from the keyword delay_ops= of "
        "DelayConfig); 'broadcast' on rank 1 (from the keyword delay_ops= of DelayConfig)",
    ),
    "delay_where": (
        "network",
        "host",
        "  delay_where: 'network' on rank 0 (from the keyword delay_where= of "
        "DelayConfig); 'host' on rank 1 (from the keyword delay_where= of DelayConfig)",
    ),
    "delay_mode": (
        "add",
        "match",
        "  delay_mode: 'add' on rank 0 (from the keyword delay_mode= of DelayConfig); 'match' on rank 1 (from the "
        "keyword delay_mode= of DelayConfig)",
    ),
    "delay_burst": (
        "none",
        "10",
        "  delay_burst: 'none' on rank 0 (from the keyword delay_burst= of DelayConfig); '10' on rank 1 (from the "
        "keyword delay_burst= of DelayConfig)",
    ),
    "slowdown": (
        "0:2x",
        "none",
        "  slowdown: '0:2x' on rank 0 (from the keyword slowdown= of DelayConfig); 'none' on "
        "rank 1 (from the keyword slowdown= of DelayConfig)",
    ),
    "seed": (
        1,
        2,
        "  seed: '1' on rank 0 (from the keyword seed= of DelayConfig); '2' on rank 1 (from the keyword "
        "seed= of DelayConfig)",
    ),
    "staleness": (
        "ssp:2",
        "bsp",
        "  staleness: 'ssp:2' on rank 0 (from the keyword staleness= of DelayConfig); 'bsp' "
        "on rank 1 (from the keyword staleness= of DelayConfig)",
    ),
    "stale_policy": (
        "ema",
        "apply",
        "  stale_policy: 'ema' on rank 0 (from the keyword stale_policy= of "
        "DelayConfig); 'apply' on rank 1 (from the keyword stale_policy= of DelayConfig)",
    ),
    "ema_alpha": (
        0.1,
        0.2,
        "  ema_alpha: '0.1' on rank 0 (from the keyword ema_alpha= of DelayConfig); '0.2' on "
        "rank 1 (from the keyword ema_alpha= of DelayConfig)",
    ),
    "step_ms": (
        "auto",
        5,
        "  step_ms: 'auto' on rank 0 (from the keyword step_ms= of DelayConfig); '5.0' on rank 1 "
        "(from the keyword step_ms= of DelayConfig)",
    ),
    "max_pending": (
        64,
        8,
        "  max_pending: '64' on rank 0 (from the keyword max_pending= of DelayConfig); '8' on "
        "rank 1 (from the keyword max_pending= of DelayConfig)",
    ),
    "nccl_algo": (
        "allreduce:tree",
        "auto",
        "  nccl_algo: 'allreduce:tree' on rank 0 (from the keyword nccl_algo= of "
        "DelayConfig); 'auto' on rank 1 (from the keyword nccl_algo= of DelayConfig)",
    ),
    "nccl_buffsize": (
        "2MiB",
        "4MiB",
        "  nccl_buffsize: '2097152' on rank 0 (from the keyword nccl_buffsize= of "
        "DelayConfig); '4194304' on rank 1 (from the keyword nccl_buffsize= of DelayConfig)",
    ),
}
HEAD = (
    "delaycomm: group '0': the ranks give different values to options that must be the same on every rank "
    "(every rank of the group raises this error):\n"
)
TAIL = "\ngive each of them one value on every rank (options that may differ per rank: stats, trace, trace_events)"


def _attempts(rank, world, cases, rdzv):
    """Creates the world group once per case (a fresh rendezvous each), each rank with its own value."""
    import torch.distributed as dist

    import delaycomm

    out = {}
    for i, (name, v0, v1) in enumerate(cases):
        try:
            dist.init_process_group(
                "delaycomm",
                init_method=f"file://{rdzv}{i}",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=20),
                pg_options=delaycomm.DelayConfig(**{name: v0 if rank == 0 else v1}),
            )
        except ValueError as e:
            out[name] = str(e)
            continue
        out[name] = None  # created: the mismatch went unnoticed
        dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def mismatch_runs(tmp_path_factory):
    cases = [(name, v0, v1) for name, (v0, v1, _) in MISMATCH.items()]
    return run_procs(_attempts, 2, cases, str(tmp_path_factory.mktemp("rdzv") / "r"), timeout=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(MISMATCH))
def test_a_mismatch_raises_the_same_error_on_every_rank(mismatch_runs, name):
    # torch names the world group by a counter that a failed init does not reset: take its name from the message.
    group = re.match(r"delaycomm: group '(\d+)'", mismatch_runs[0][name] or "")
    expected = HEAD.replace("group '0'", f"group '{group.group(1) if group else '?'}'") + MISMATCH[name][2] + TAIL
    assert mismatch_runs[0][name] == expected
    assert mismatch_runs[1][name] == expected


def _reuse_store(rank, world):
    import torch
    import torch.distributed as dist

    import delaycomm

    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, rank == 0, timeout=timedelta(seconds=60))
    out = []
    for seed in ({0: 1, 1: 2}[rank], 5):  # a failed creation leaves its keys behind; the next one must not read them
        try:
            dist.init_process_group(
                "delaycomm",
                store=store,
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=20),
                pg_options=delaycomm.DelayConfig(seed=seed),
            )
        except ValueError as e:
            out.append(str(e).splitlines()[1])
            continue
        t = torch.ones(2)
        dist.all_reduce(t)
        out.append(t.tolist())
        dist.destroy_process_group()
    return out


@pytest.mark.timeout(120)
def test_a_group_recreated_on_the_same_store_agrees_afresh():
    res = run_procs(_reuse_store, 2, timeout=90)
    line = (
        "  seed: '1' on rank 0 (from the keyword seed= of DelayConfig); '2' on rank 1 (from the keyword seed= of "
        "DelayConfig)"
    )
    assert res[0] == res[1] == [line, [2.0, 2.0]]


# --- as a user meets it: the same script, one rank's environment differs -----------------------------------------


def _env_world(rank, world, attempts, rdzv):
    """Per attempt: this rank's DELAYCOMM_* environment, then init_process_group as an unmodified script does."""
    import torch.distributed as dist

    out = []
    for i, per_rank_env in enumerate(attempts):
        for k in [k for k in os.environ if k.startswith("DELAYCOMM_")]:
            del os.environ[k]
        os.environ.update(per_rank_env[rank])
        t0 = time.monotonic()
        try:
            dist.init_process_group(
                "delaycomm", init_method=f"file://{rdzv}{i}", rank=rank, world_size=world, timeout=timedelta(seconds=20)
            )
        except ValueError as e:
            out.append({"error": str(e), "s": time.monotonic() - t0})
            continue
        out.append({"error": None})
        dist.destroy_process_group()
    return out


ENV_ATTEMPTS = [
    # The reproduction: rank 0 ssp:2, rank 1 bsp gave silently wrong sums (or a deadlock under
    # step_ms=auto); different seeds gave different schedules.
    [{"DELAYCOMM_STALENESS": "ssp:2", "DELAYCOMM_SEED": "3"}, {"DELAYCOMM_SEED": "4"}],
    # A bad value on rank 1 only: before, rank 1 raised and rank 0 waited in Gloo's connect for the whole timeout.
    [{}, {"DELAYCOMM_SEED": "-1"}],
]


@pytest.fixture(scope="module")
def env_runs(tmp_path_factory):
    return run_procs(_env_world, 2, ENV_ATTEMPTS, str(tmp_path_factory.mktemp("rdzv") / "r"), timeout=120)


@pytest.mark.timeout(150)
def test_staleness_set_on_one_rank_only_fails_on_both(env_runs):
    expected = (
        HEAD + "  seed: '3' on rank 0 (from the environment variable DELAYCOMM_SEED); '4' on rank 1 (from the "
        "environment variable DELAYCOMM_SEED)\n"
        "  staleness: 'ssp:2' on rank 0 (from the environment variable DELAYCOMM_STALENESS); 'bsp' on rank 1 "
        "(from the default)" + TAIL
    )
    assert env_runs[0][0]["error"] == env_runs[1][0]["error"] == expected


@pytest.mark.timeout(150)
def test_a_bad_value_on_one_rank_fails_every_rank_at_once(env_runs):
    own = (
        "delaycomm: invalid value '-1' for option 'seed' from the environment variable DELAYCOMM_SEED: expected "
        "an integer in [0, 2^63)"
    )
    group = re.match(r"delaycomm: group '(\d+)'", env_runs[0][1]["error"] or "")
    assert env_runs[1][1]["error"] == own
    assert env_runs[0][1]["error"] == (
        f"delaycomm: group '{group.group(1) if group else '?'}' cannot be created: the options of rank 1 were "
        f"rejected (every rank of the group raises this error):\n  rank 1: {own}"
    )
    assert env_runs[0][1]["s"] < 15, "rank 0 waited for the group's timeout instead of failing with rank 1"


def _trace_world(rank, world, paths):
    import torch
    import torch.distributed as dist

    import delaycomm

    out = {}
    for attempt, per_rank in enumerate(paths):
        try:
            dist.init_process_group(
                "delaycomm",
                init_method=f"file://{per_rank[2]}",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=20),
                pg_options=delaycomm.DelayConfig(delay=f"trace:{per_rank[rank]}"),
            )
        except ValueError as e:
            out[attempt] = str(e)
            continue
        t = torch.ones(1)
        dist.all_reduce(t)
        out[attempt] = t.item()
        dist.destroy_process_group()
    return out


@pytest.mark.timeout(150)
def test_trace_files_are_compared_by_content_not_path(tmp_path):
    same0, same1, other = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"
    same0.write_text("1ms\n2ms\n")
    same1.write_text("# another file, the same latencies\n2ms\n1ms\n")
    other.write_text("1ms\n3ms\n")
    attempts = [(str(same0), str(same1), str(tmp_path / "rdzv0")), (str(same0), str(other), str(tmp_path / "rdzv1"))]
    res = run_procs(_trace_world, 2, attempts, timeout=120)
    assert res[0][0] == res[1][0] == 2.0  # different paths, one content: agreed
    d0 = __import__("delaycomm")._C.parse_delay_spec(f"trace:{same0}")["trace_digest"]
    d1 = __import__("delaycomm")._C.parse_delay_spec(f"trace:{other}")["trace_digest"]
    expected = (
        HEAD + f"  delay: 'trace:{same0} (content {d0})' on rank 0 (from the keyword delay= of DelayConfig); "
        f"'trace:{other} (content {d1})' on rank 1 (from the keyword delay= of DelayConfig)" + TAIL
    )
    assert res[0][1] == res[1][1] == expected


# --- subgroups, ranks outside them, the timeout -----------------------------------------------------------------


def _subgroups(rank, world):
    import torch
    import torch.distributed as dist

    import delaycomm

    dist.init_process_group("delaycomm", timeout=timedelta(seconds=30))
    out = {}
    # Ranks 1 and 2 disagree on their subgroup; rank 0 is not in it (torch creates no backend there) and its own
    # different options do not count.
    seed = {0: 9, 1: 1, 2: 2}[rank]
    try:
        g = dist.new_group([1, 2], timeout=timedelta(seconds=20), pg_options=delaycomm.DelayConfig(seed=seed))
        out["sub"] = "member" if g != dist.GroupMember.NON_GROUP_MEMBER else "non-member"
    except ValueError as e:
        out["sub"] = str(e)
    # Ranks 0 and 1 agree on theirs (rank 2, outside, has other options).
    seed = {0: 5, 1: 5, 2: 6}[rank]
    g = dist.new_group([0, 1], timeout=timedelta(seconds=20), pg_options=delaycomm.DelayConfig(seed=seed))
    if rank in (0, 1):
        t = torch.ones(1)
        dist.all_reduce(t, group=g)
        out["agreeing_sub"] = t.item()
    t = torch.ones(1)
    dist.all_reduce(t)  # the world group is unharmed
    out["world"] = t.item()
    return out


@pytest.mark.timeout(150)
def test_subgroups_compare_their_members_only():
    res = run_procs(_subgroups, 3, timeout=120)
    assert res[0]["sub"] == "non-member"
    expected = (
        "delaycomm: group '1': the ranks give different values to options that must be the same on every "
        "rank (every rank of the group raises this error):\n"
        "  seed: '1' on rank 1 (from the keyword seed= of DelayConfig); '2' on rank 2 (from the keyword seed= "
        "of DelayConfig)" + TAIL
    )
    assert res[1]["sub"] == res[2]["sub"] == expected
    assert res[0]["agreeing_sub"] == res[1]["agreeing_sub"] == 2.0
    assert res[0]["world"] == res[1]["world"] == res[2]["world"] == 3.0


def _absent_peer(rank, world):
    import torch.distributed as dist

    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60))
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:  # never creates the subgroup; waits until rank 0 is done
        store.wait(["test/done"], timedelta(seconds=60))
        return None
    t0 = time.monotonic()
    try:
        dist.new_group([0, 1], timeout=timedelta(seconds=3))
        out = ("created", None)
    except Exception as e:  # noqa: BLE001 - the type is the point
        out = (type(e).__name__, str(e))
    store.set("test/done", "1")
    return out + (time.monotonic() - t0,)


@pytest.mark.timeout(120)
def test_the_agreement_waits_no_longer_than_the_group_timeout():
    res = run_procs(_absent_peer, 2, timeout=90)
    kind, msg, seconds = res[0]
    assert kind == "DistStoreError", (kind, msg)
    assert msg == (
        "delaycomm: group '1' rank 0: creating the group timed out after 3 s (the group's timeout) waiting "
        "for rank 1 to publish its options; a rank that never creates the group, or that failed before "
        "delaycomm's checks, leaves the others waiting"
    )
    assert seconds < 3 + 10  # the group's timeout, with room for a loaded machine


# --- rank 0 hosts the store (env:// without torchrun, tcp://, mp.spawn) -------------------------------------------

MISMATCH_ATTEMPTS, REJECTED_ATTEMPTS = 20, 2


def _attempt(rank, world, seed):
    """One rank of one job: init_process_group as an unmodified script calls it, then exit with what it raised."""
    import torch.distributed as dist

    os.environ["DELAYCOMM_SEED"] = seed
    t0 = time.monotonic()
    try:
        dist.init_process_group("delaycomm", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    except ValueError as e:
        return ("ValueError", str(e).splitlines()[0], time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001 - the type is the point
        return (type(e).__name__, str(e)[:300], time.monotonic() - t0)
    dist.destroy_process_group()
    return ("created", None, time.monotonic() - t0)


def _attempt_on(port, rank, world, seed):
    os.environ["MASTER_PORT"] = str(port)  # the job's own store, hosted by its rank 0
    return _attempt(rank, world, seed)


def _store_on_rank0(rank, world, ports):
    """Per attempt, a job as mp.spawn or a hand-started env:// job runs it: rank 0 hosts the TCPStore, one rank's
    seed differs (each rank in turn; invalid on the last attempts), and each rank is a process that exits as soon
    as init_process_group raises, rank 0's store with it. Each attempt's rank is a child forked from this rank
    (torch already imported, no thread started), so 22 jobs cost seconds."""
    out = []
    for i, port in enumerate(ports):
        odd = i % world
        rejected = i >= len(ports) - REJECTED_ATTEMPTS
        seed = ("-1" if rejected else "7") if rank == odd else "3"
        result = run_in_child(_attempt_on, port, rank, world, seed, default=("no report", None, 0.0))
        out.append(tuple(result) if isinstance(result, list) else ("child failed", result, 0.0))
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_rank_gets_the_error_when_rank_0_hosts_the_store():
    # Before: the last rank through the agreement raised at once; when that was rank 0, its store went with it
    # and ranks still reading got `DistNetworkError: Failed to recv` (3 of 12 runs at 4 ranks) instead.
    import socket

    socks = [socket.socket() for _ in range(MISMATCH_ATTEMPTS + REJECTED_ATTEMPTS)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    world = 4
    res = run_procs(_store_on_rank0, world, ports, timeout=240, env={"TORCHELASTIC_USE_AGENT_STORE": "False"})
    network = [(i, r, res[r][i]) for i in range(len(ports)) for r in range(world) if res[r][i][0] != "ValueError"]
    assert not network, f"{len(network)} of {len(ports) * world} rank attempts did not get the ValueError: {network}"
    for i in range(len(ports)):
        got = [res[r][i] for r in range(world)]
        first_lines = {line for _, line, _ in got}
        odd = i % world
        if i >= len(ports) - REJECTED_ATTEMPTS:
            others = re.sub(r"group '\d+'", "group 'G'", next(line for r, (_, line, _) in enumerate(got) if r != odd))
            assert others == (
                f"delaycomm: group 'G' cannot be created: the options of rank {odd} were rejected (every rank of "
                "the group raises this error):"
            ), got
            assert got[odd][1].startswith("delaycomm: invalid value '-1' for option 'seed'"), got
        else:
            assert len(first_lines) == 1, got
