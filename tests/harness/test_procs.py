"""The harness's processes: run_procs reports every rank's outcome (a traceback, a fault that was expected or not,
the deadline) and run_command stops a command with everything it started at its timeout."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from tests.harness import CommandTimeout, run_command, run_procs
from tests.harness import procs as procs_module

pytestmark = [pytest.mark.multiproc]


def _returns(rank, world):
    return (rank, world, os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ.get("DC_HARNESS_TEST"))


def _rank1_raises(rank, world):
    if rank == 1:
        raise RuntimeError("rank 1 broke on purpose")
    time.sleep(60)  # stands for a collective that waits for rank 1


def _rank1_exits(rank, world):
    if rank == 1:
        os._exit(3)
    return "survived"


def _hangs(rank, world):
    time.sleep(60)


@pytest.mark.timeout(120)
def test_results_by_rank_with_the_launchers_environment():
    out = run_procs(_returns, 2, timeout=60, env={"DC_HARNESS_TEST": "x"})
    assert out == [(0, 2, "0", "2", "x"), (1, 2, "1", "2", "x")]


@pytest.mark.timeout(120)
def test_a_rank_that_raises_fails_the_run_with_its_traceback_and_the_others_are_stopped(monkeypatch):
    monkeypatch.setattr(procs_module, "_GRACE_S", 0.5)
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as raised:
        run_procs(_rank1_raises, 2, timeout=60)
    assert time.monotonic() - t0 < 30  # rank 0 sleeps 60 s: stopped after the grace, not waited for
    text = str(raised.value)
    assert text.startswith("2 of 2 rank(s) failed (timeout 60 s):\n"), text
    assert "--- rank 1 raised:\nTraceback" in text and "RuntimeError: rank 1 broke on purpose" in text
    assert "--- rank 0: no report, still running at the deadline or after another rank failed (killed)" in text


@pytest.mark.timeout(120)
def test_an_expected_fault_gives_none_and_another_exit_code_fails():
    assert run_procs(_rank1_exits, 2, timeout=60, expect_exit={1: 3}) == ["survived", None]
    with pytest.raises(
        AssertionError, match=re.escape("--- rank 1: expected to exit with code 4, got exited with code 3")
    ):
        run_procs(_rank1_exits, 2, timeout=60, expect_exit={1: 4})


@pytest.mark.timeout(120)
def test_the_deadline_stops_every_rank():
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"^2 of 2 rank\(s\) failed \(timeout 1 s\)") as raised:
        run_procs(_hangs, 2, timeout=1)
    assert time.monotonic() - t0 < 30
    assert str(raised.value).count("no report, still running at the deadline") == 2


@pytest.mark.timeout(60)
def test_run_command_kills_the_command_and_what_it_started_at_the_timeout():
    # the script starts a child of its own, says its pid, then waits: both must be gone after the timeout
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        run_command(["bash", "-c", "sleep 30 & echo child $!; wait"], timeout=1)
    assert isinstance(raised.value, CommandTimeout)
    match = re.search(r"child (\d+)", str(raised.value))  # the output so far is in the message
    assert match, str(raised.value)
    pid = int(match.group(1))
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"the command's child {pid} outlived the timeout"


def test_run_command_returns_the_output_and_the_exit_code(tmp_path):
    proc = run_command(["bash", "-c", "echo out; echo err >&2; pwd; exit 3"], timeout=30, cwd=str(tmp_path))
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, f"out\n{tmp_path}\n", "err\n")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
