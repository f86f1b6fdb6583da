"""The tools' launcher: every rank's outcome comes back, failures at once, a dead rank and the deadline noticed, an
expected exit, the teardown after the report, and how every process ended."""

from __future__ import annotations

import time

import pytest

from delaycomm._tools.launch import run_ranks

from . import _targets

# One fork server that imported delaycomm (and torch) once: each rank then starts in milliseconds.
FAST = {"start_method": "forkserver", "preload": ("tests.tools._targets",)}


@pytest.mark.timeout(120)
def test_results_messages_and_environment_of_every_rank():
    seen = []
    out = run_ranks(_targets.echo, 3, ("t",), env={"DC_TEST_ENV": "x"}, on_message=lambda *m: seen.append(m), **FAST)
    assert out.ok and not out.timed_out and out.errors == {}
    assert out.results == {0: ("t", 0, 3, "x"), 1: ("t", 1, 3, "x"), 2: ("t", 2, 3, "x")}
    assert out.exitcodes == {0: 0, 1: 0, 2: 0} and out.stopped == set()
    assert sorted(seen) == [("hello", 0, "0/3"), ("hello", 1, "1/3"), ("hello", 2, "2/3")]


@pytest.mark.timeout(120)
def test_an_error_stops_the_others_at_once_with_its_traceback():
    t0 = time.monotonic()
    out = run_ranks(_targets.rank1_raises, 2, **FAST)
    assert time.monotonic() - t0 < 30  # rank 0 sleeps 60 s: it was stopped, not waited for
    assert not out.ok and not out.timed_out and list(out.errors) == [1] and out.results == {}
    assert "RuntimeError: rank 1 broke on purpose" in out.errors[1] and "Traceback" in out.errors[1]


@pytest.mark.timeout(120)
def test_a_rank_error_payload_comes_back_as_raised_and_the_others_finish_within_the_grace():
    out = run_ranks(_targets.rank1_reports, 2, grace_s=30.0, **FAST)
    assert out.errors == {1: ("unavailable", "not in this build")} and out.results == {0: "ok"}


@pytest.mark.timeout(120)
def test_a_rank_that_dies_without_a_report_is_an_error():
    out = run_ranks(_targets.rank0_dies, 2, **FAST)
    assert out.errors == {0: "process exited with code 7 without a report"}
    assert out.exitcodes[0] == 7 and out.stopped == {1}  # rank 1 sleeps 60 s: stopped at once (no grace)


@pytest.mark.timeout(120)
def test_the_deadline_stops_every_rank():
    t0 = time.monotonic()
    out = run_ranks(_targets.hangs, 2, deadline_s=1.0, **FAST)
    assert out.timed_out and out.errors == {} and out.results == {} and not out.ok
    assert time.monotonic() - t0 < 30
    assert out.stopped == {0, 1} and all(code < 0 for code in out.exitcodes.values()), out.exitcodes


@pytest.mark.timeout(120)
def test_an_expected_exit_is_no_error_and_leaves_the_others_running():
    # grace_s=0: had rank 1's exit counted as an error, rank 0 (1 s more to go) would have been stopped at once
    out = run_ranks(_targets.rank1_exits_3, 2, expect_exit={1: 3}, **FAST)
    assert out.ok and out.results == {0: "ok"} and out.errors == {}
    assert out.exitcodes == {0: 0, 1: 3} and out.stopped == set()
    other = run_ranks(_targets.rank1_exits_3, 2, expect_exit={1: 4}, **FAST)
    assert other.errors == {1: "process exited with code 3 without a report (expected to exit with code 4)"}


@pytest.mark.timeout(120)
def test_the_teardown_runs_in_each_rank_after_its_report_and_its_error_is_ignored(tmp_path):
    env = {"DC_TEARDOWN_FILE": str(tmp_path / "rank")}
    out = run_ranks(_targets.returns_rank, 2, env=env, teardown=_targets.write_teardown_file, **FAST)
    assert out.ok and out.results == {0: 0, 1: 1} and out.exitcodes == {0: 0, 1: 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    # the report is delivered before the teardown runs: a teardown that ends the process cannot lose it
    crashed = run_ranks(_targets.returns_rank, 2, teardown=_targets.exit_5, **FAST)
    assert crashed.results == {0: 0, 1: 1} and crashed.exitcodes == {0: 5, 1: 5} and crashed.stopped == set()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nproc": 0}, "nproc must be >= 1, got 0"),
        ({"start_method": "fork"}, "start_method must be 'spawn' or 'forkserver', got 'fork'"),
        ({"preload": ("os",)}, "preload needs start_method='forkserver'"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=f"^run_ranks: {message}"):
        run_ranks(_targets.echo, **{"nproc": 1, **kwargs})
