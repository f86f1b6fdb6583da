"""python -m delaycomm.bench percall: the per-call cost (statistics, gate rule, command line, one real run)."""

from __future__ import annotations

import copy
import json
import os
import subprocess

import pytest

from delaycomm.bench import percall, percall_engine
from delaycomm.bench.gate import compare_percall
from delaycomm.bench.percall_results import FORMAT, rows
from tests.harness import run_cli


def record(raw: list[list[float]], dc: list[list[float]], path: str = "sync", device: str = "cpu") -> dict:
    """A record with one item per run: raw[run][pair] and dc[run][pair] CPU µs per call (wall = CPU)."""
    runs = [
        {
            "items": [
                {
                    "size_bytes": 8,
                    "path": path,
                    "raw_cpu_us": r,
                    "dc_cpu_us": d,
                    "raw_wall_us": r,
                    "dc_wall_us": d,
                    "first": ["raw"] * len(r),
                }
            ]
        }
        for r, d in zip(raw, dc)
    ]
    return {
        "format": FORMAT,
        "settings": {"device": device, "calls": 400, "blocks": len(raw[0]), "inject_us": 0},
        "runs": runs,
    }


RAW = [[40.0, 41.0, 39.0, 40.5, 60.0], [42.0, 40.0, 41.0, 43.0, 39.0], [40.0, 40.0, 40.0, 41.0, 39.0]]
DC = [[48.0, 49.0, 47.0, 48.5, 50.0], [50.0, 48.0, 49.0, 51.0, 47.0], [48.0, 49.0, 48.0, 49.0, 47.0]]


def test_the_figure_is_the_median_over_runs_of_each_runs_median_paired_difference():
    (row,) = rows(record(RAW, DC))
    # run 0: differences 8, 8, 8, 8, -10 -> 8; run 1: 8 each -> 8; run 2: 8, 9, 8, 8, 8 -> 8
    assert row["run_added_cpu_us"] == [8.0, 8.0, 8.0]
    assert row["added_cpu_us"] == 8.0
    assert row["run_ratio_cpu"][1] == pytest.approx(49.0 / 41.0)
    assert row["raw_cpu_us"] == 40.5  # median over runs (40.5, 41, 40) of each run's median raw block


def _shift(rec: dict, us: float, scale: float = 1.0) -> dict:
    """The record with every delaycomm block ``us`` slower and every block ``scale`` times slower."""
    out = copy.deepcopy(rec)
    for run in out["runs"]:
        for it in run["items"]:
            it["raw_cpu_us"] = [x * scale for x in it["raw_cpu_us"]]
            it["dc_cpu_us"] = [x * scale + us for x in it["dc_cpu_us"]]
    return out


def test_gate_passes_an_unchanged_run_and_fails_a_5us_regression():
    base = record(RAW, DC)
    (same,) = compare_percall(copy.deepcopy(base), base, 2.5)
    assert not same.failed and same.regression_us == pytest.approx(0.0, abs=1e-9)
    (slow,) = compare_percall(_shift(base, 5.0), base, 2.5)
    assert slow.failed and slow.regression_us == pytest.approx(5.0, abs=0.2)
    assert slow.runs_over == 3


def test_gate_takes_ratios_so_a_slower_machine_neither_fails_nor_hides_a_regression():
    base = record(RAW, DC)
    # twice as slow everywhere (delaycomm's 8 us become 16 us): the difference form would read +8 us and fail
    (slower,) = compare_percall(_shift(base, 0.0, scale=2.0), base, 2.5)
    assert not slower.failed, slower
    # and a 5 us regression on that machine still fails
    (both,) = compare_percall(_shift(base, 5.0, scale=2.0), base, 2.5)
    assert both.failed and both.regression_us == pytest.approx(5.0, abs=0.3)


def test_gate_needs_a_majority_of_runs_over_the_limit():
    base = record(RAW, DC)
    one_bad = copy.deepcopy(base)
    one_bad["runs"][0]["items"][0]["dc_cpu_us"] = [x + 30 for x in DC[0]]
    (v,) = compare_percall(one_bad, base, 2.5)
    assert v.runs_over == 1 and not v.failed


def test_gate_refuses_another_device_and_nothing_in_common():
    base = record(RAW, DC)
    with pytest.raises(ValueError, match="the baseline was measured with device 'cuda', this run with 'cpu'"):
        compare_percall(base, record(RAW, DC, device="cuda"), 2.5)
    with pytest.raises(ValueError, match="no \\(size, path\\) in common"):
        compare_percall(base, record(RAW, DC, path="future_then"), 2.5)


def test_gate_refuses_a_baseline_measured_pinned_otherwise():
    pinned = record(RAW, DC)
    pinned["settings"]["pin_cpu"] = 0
    with pytest.raises(ValueError, match="the baseline was measured with pin_cpu 0, this run with None"):
        compare_percall(record(RAW, DC), pinned, 2.5)
    assert all(not v.failed for v in compare_percall(pinned, pinned, 2.5))


def test_the_injected_work_is_calibrated_to_the_cpu_time_asked_for():
    import time

    cal = percall_engine.calibrate(2000.0)
    # ns_per_iteration is rounded to 4 decimals in the record: allow its relative error (~1e-5) on top of the count's
    assert abs(cal["iterations"] - 2000.0 * 1e3 / cal["ns_per_iteration"]) <= 1 + cal["iterations"] * 1e-5
    t0 = time.thread_time_ns()
    percall_engine.work(cal["iterations"])
    # the same work again costs about the CPU time asked for; a shared core can make one timing 2x the other, so
    # this checks the scale (a unit slip would be 1000x), not the precision
    assert 0.25 * 2_000_000 <= time.thread_time_ns() - t0 <= 4 * 2_000_000


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_cli(
        ["percall", *args], timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"}, module="delaycomm.bench"
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--paths", "sync,bogus"],
            "argument --paths: unknown path 'bogus'; expected a comma-separated list of: sync, async_wait, future_then",
        ),
        (["-b", "2M", "-e", "1K"], "argument -b/--minbytes: 2097152 B is larger than -e/--maxbytes 1024 B"),
        (["--inject-us", "-1"], "argument --inject-us: -1 is out of range; expected microseconds in [0, 1e6)"),
        (["--blocks", "0"], "argument --blocks: 0 is too small; expected an integer >= 1"),
        (["--compare", "/nonexistent/base.json"], "argument --compare: /nonexistent/base.json: no such file"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        percall.main(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_file_that_is_not_a_record_is_refused(tmp_path, capsys):
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"format": "delaycomm-bench/1", "rows": []}))
    with pytest.raises(SystemExit) as e:
        percall.main(["--from-json", str(bad)])
    assert e.value.code == 2
    assert "not a per-call record ('format' must be 'delaycomm-percall/1', with runs)" in capsys.readouterr().err


# NOTE: slow (four fresh interpreters, each measuring in a process of its own); scripts/test.sh --slow runs it. CI's
# last stage runs the real benchmark and its gate on every run (.ci/bench-gate.sh), and the gate rule's verdicts
# are the tests above (docs/ci.md).
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_real_run_then_the_gate_fails_on_an_injected_slowdown(tmp_path):
    """Real Gloo and delaycomm groups in a fresh process. The injected 300 us dwarfs any load on the CI machine."""
    small = [
        "-b",
        "8",
        "-e",
        "8",
        "--paths",
        "sync",
        "--calls",
        "40",
        "--blocks",
        "7",
        "--warmup-blocks",
        "1",
        "--runs",
        "1",
        "--progress",
        "off",
    ]
    base = tmp_path / "base.json"
    proc = _cli(*small, "--json", str(base))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(base.read_text())
    assert rec["format"] == FORMAT and rec["environment"]["torch"]
    checks = rec["runs"][0]["checks"]
    # the harness made its calls through a real DelayBackend, which counted every one and changed no data
    assert checks["delaycomm_backend"] == "DelayBackend" and checks["raw_backend"] == "gloo"
    assert checks["delaycomm_calls_counted"] == checks["delaycomm_calls_made"] == 8 * 40
    assert checks["wrong_elements"] == 0 and checks["injection"] is None
    assert len(rec["runs"][0]["items"][0]["dc_cpu_us"]) == 7
    # the table reads the saved record back
    again = _cli("--from-json", str(base), timeout=60)
    assert again.returncode == 0 and "       8         sync" in again.stdout
    # a 300 us/call regression fails the gate (exit 1), naming the item
    slow = _cli(*small, "--inject-us", "300", "--compare", str(base), "--confirm", "0")
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert "gate: FAIL: delaycomm costs more than 2.5 us/call over its baseline at 8 B sync" in slow.stdout
    # --pin-cpu: every thread of each measuring process on one CPU, said in the record and the table
    pinned = tmp_path / "pinned.json"
    proc = _cli(*small, "--pin-cpu", "--json", str(pinned))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(pinned.read_text())
    assert rec["settings"]["pin_cpu"] == min(os.sched_getaffinity(0))
    assert rec["environment"]["machine"]["cpu_affinity"] == 1  # what the measuring process could use
    assert f"each run pinned to CPU {rec['settings']['pin_cpu']}" in proc.stdout
