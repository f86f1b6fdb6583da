"""End to end with real processes and real Gloo: numbers by hand (scripted clock), the check, the gate, the CLI.

The engine runs in real rank processes (tests/harness, forked from a server that imported torch once); the bench's
own launcher (``--nproc``) and torchrun are tested through the command line and :func:`launch.spawn`.
"""

import json
import os

import pytest

from delaycomm.bench import launch, results
from delaycomm.bench.cli import main
from delaycomm.bench.settings import Backend, Settings
from tests.harness import free_port, run_cli, run_procs

from .helpers import ScriptedClock, corrupt_entry, failing_entry, make_record, slow_entry

pytestmark = pytest.mark.multiproc
BACKENDS = (Backend("delaycomm", "delaycomm"), Backend("gloo", "gloo"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def settings(**kw):
    base = dict(
        collectives=("all_reduce",), sizes=(8, 4096), iters=10, warmup=2, repeats=3, backends=BACKENDS, timeout_s=60.0
    )
    base.update(kw)
    return Settings(**base)


def _rank(rank, world_size, settings, clock, entry):
    from delaycomm.bench import engine

    return (entry or engine.run_rank)(rank, world_size, settings, "env://", clock)


def measure(tmp_path, name, nproc=2, clock=None, entry=None, **kw):
    record = run_procs(_rank, nproc, settings(**kw), clock, entry, timeout=80)[0]
    path = tmp_path / f"{name}.json"
    results.save(record, str(path))
    return record, str(path)


@pytest.mark.timeout(90)
def test_scripted_clock_gives_the_hand_computed_numbers(tmp_path):
    # Per-call times (ns) on each rank; a call's time is the max over ranks: 1.5, 2, 3, 10 us.
    clock = ScriptedClock({0: [1000, 2000, 3000, 10000], 1: [1500, 1000, 3000, 4000], 2: [500, 500, 500, 500]})
    colls = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
    record, _ = measure(
        tmp_path,
        "scripted",
        nproc=3,
        clock=clock,
        collectives=colls,
        sizes=(1536, 6144),
        iters=4,
        repeats=1,
        warmup=1,
        root=1,
        interleave="block",
    )
    stats = results.row_stats(record)
    assert len(stats) == 5 * 2 * 2
    factor = {
        "all_reduce": 4 / 3,
        "all_gather": 2 / 3,
        "reduce_scatter": 2 / 3,
        "broadcast": 1.0,
        "all_to_all": 2 / 3,
    }  # n = 3
    for r in stats:
        assert r.p50_us == pytest.approx(2.5)  # median of 1.5 2 3 10
        assert r.p99_us == pytest.approx(9.79)  # h = 3 * 0.99 = 2.97 -> 3 + 0.97 * (10 - 3)
        assert r.repeat_p50_us == (2.5,)
        assert r.algbw_GBps == pytest.approx(r.size_bytes / 2.5e-6 / 1e9)
        assert r.busbw_GBps == pytest.approx(r.algbw_GBps * factor[r.collective])
        assert r.wrong == 0, r  # the check ran the real collectives through real Gloo and delaycomm
        assert r.ratio == (pytest.approx(1.0) if r.backend == "delaycomm" else None)
    assert {r.size_bytes for r in stats} == {1536, 6144}
    assert record["environment"]["torch"] and record["environment"]["delaycomm"]


@pytest.mark.timeout(90)
def test_calls_alternate_between_backends_and_the_order_flips_each_repeat(tmp_path):
    # Every other timed call lasts 5 us: with A B A B ... the first backend of a round gets the 1 us calls.
    clock = ScriptedClock({0: [1000, 5000], 1: [1000, 5000]})
    record, _ = measure(tmp_path, "alternate", clock=clock, sizes=(8,), iters=3, repeats=3, warmup=1, check=0)
    dc, gloo = results.row_stats(record)
    assert dc.repeat_p50_us == (1.0, 5.0, 1.0)  # first in repeats 0 and 2, second in repeat 1
    assert gloo.repeat_p50_us == (5.0, 1.0, 5.0)
    assert dc.repeat_ratios == (0.2, 5.0, 0.2) and dc.wrong is None


@pytest.mark.timeout(90)
@pytest.mark.parametrize("dtype, redop, nproc", [("bfloat16", "max", 3), ("int8", "prod", 2)])
def test_check_is_clean_for_other_dtypes_and_ops(tmp_path, dtype, redop, nproc):
    record, _ = measure(
        tmp_path,
        "dtypes",
        nproc=nproc,
        collectives=("all_reduce", "reduce_scatter"),
        sizes=(1, 2, 96),
        dtype=dtype,
        redop=redop,
        iters=2,
        repeats=1,
        warmup=1,
    )
    stats = results.row_stats(record)
    assert len(stats) == 2 * (5 if dtype == "int8" else 3) and all(r.wrong == 0 for r in stats)
    # too small for one element per rank, or the same element count twice: skipped and said so
    assert {(s["collective"], s["size_bytes"]) for s in record["skipped"]} == (
        {("all_reduce", 1), ("reduce_scatter", 1), ("reduce_scatter", 2)}
        if dtype == "bfloat16"
        else {("reduce_scatter", 1)}
    )


@pytest.mark.timeout(90)
def test_the_check_catches_an_injected_wrong_result(tmp_path, capsys):
    record, path = measure(tmp_path, "wrong", entry=corrupt_entry(("delaycomm",)), repeats=1, iters=3)
    wrong = {(r.size_bytes, r.backend): r.wrong for r in results.row_stats(record)}
    assert wrong == {(8, "delaycomm"): 1, (8, "gloo"): 0, (4096, "delaycomm"): 1, (4096, "gloo"): 0}
    assert main(["--from-json", path]) == 1
    out = capsys.readouterr().out
    assert "#wrong in total: 2 FAILED" in out and "error: 2 wrong result elements" in out


@pytest.mark.timeout(90)
def test_a_failing_rank_fails_the_run_at_once_with_its_traceback():
    # rank 0 waits in the rendezvous for rank 1, which is gone: the parent must not wait for the group timeout
    with pytest.raises(launch.RunFailed, match=r"(?s)rank 1 failed:.*RuntimeError: rank 1 broke on purpose"):
        launch.spawn(2, settings(timeout_s=600.0), entry=failing_entry)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    _, path = measure(tmp_path_factory.mktemp("base"), "baseline")
    return path


@pytest.mark.timeout(90)
def test_gate_identical_runs_pass(baseline, capsys):
    assert main(["--from-json", baseline, "--compare", baseline, "--max-slowdown", "1.10"]) == 0
    assert "gate: PASS: no slowdown beyond x1.1 at 2 sizes" in capsys.readouterr().out


@pytest.mark.timeout(90)
def test_gate_fails_when_only_delaycomm_gets_slower(baseline, tmp_path, capsys):
    _, path = measure(tmp_path, "slow", entry=slow_entry({"delaycomm": 0.05}))
    assert main(["--from-json", path, "--compare", baseline, "--max-slowdown", "1.5"]) == 1
    out = capsys.readouterr().out
    assert "gate: FAIL: delaycomm got slower relative to gloo at 2 of 2 sizes" in out
    assert "all_reduce 8 B delaycomm: ratio " in out and "all_reduce 4 KiB delaycomm: ratio " in out
    assert "3/3 repeats over" in out


@pytest.mark.timeout(90)
def test_gate_passes_a_uniformly_slower_machine(baseline, tmp_path, capsys):
    record, path = measure(tmp_path, "slower", entry=slow_entry({"delaycomm": 0.05, "gloo": 0.05}))
    slow_raw = [r.p50_us for r in results.row_stats(record) if r.backend == "gloo"]
    base_raw = [r.p50_us for r in results.row_stats(results.load(baseline)) if r.backend == "gloo"]
    assert all(s > 50_000 > b for s, b in zip(slow_raw, base_raw))  # every absolute time is far worse
    assert main(["--from-json", path, "--compare", baseline, "--max-slowdown", "1.5"]) == 0
    assert "gate: PASS" in capsys.readouterr().out


@pytest.fixture
def forked_ranks(monkeypatch):
    """The CLI in this process, its ranks forked by the test harness instead of the bench's launcher."""
    from delaycomm.bench import cli

    monkeypatch.setattr(
        cli, "_measure", lambda settings, nproc: run_procs(_rank, nproc, settings, None, None, timeout=80)[0]
    )


@pytest.mark.timeout(90)
def test_const_delay_shows_in_the_latency_and_fails_the_gate(tmp_path, forked_ranks, capsys):
    # The baseline: delaycomm as fast as gloo at both sizes (ratio 1); only ratios matter to the gate.
    baseline = str(tmp_path / "baseline.json")
    results.save(
        make_record({("all_reduce", size, b): [[100.0] * 5] * 3 for size in (8, 4096) for b in ("delaycomm", "gloo")}),
        baseline,
    )
    out = tmp_path / "delayed.json"
    status = main(
        [
            "--nproc",
            "2",
            "-b",
            "8",
            "-e",
            "4K",
            "-f",
            "512",
            "-n",
            "5",
            "-w",
            "1",
            "-r",
            "3",
            "--delay",
            "const:50ms",
            "--delay-fraction",
            "1",
            "--json",
            str(out),
            "--compare",
            baseline,
            "--max-slowdown",
            "1.5",
            "--confirm",
            "1",
        ]
    )
    stdout = capsys.readouterr().out
    assert status == 1, stdout
    assert "gate: FAIL: delaycomm got slower relative to gloo at 2 of 2 sizes" in stdout
    assert "all_reduce 8 B delaycomm: ratio" in stdout and "confirmation run 1: ratio" in stdout
    stats = {(r.size_bytes, r.backend): r for r in results.row_stats(results.load(str(out)))}
    for size in (8, 4096):
        dc, raw = stats[(size, "delaycomm")], stats[(size, "gloo")]
        # const:50ms on every call: the call takes the delay plus what the raw call takes (and some scheduling)
        assert 50_000 <= dc.p50_us <= 50_000 + raw.p99_us + 10_000
    injected = results.load(str(out))["injected_delay"]  # delaycomm's own telemetry of the injected delay
    assert [(d["backend"], d["collective"]) for d in injected] == [("delaycomm", "all_reduce")]
    assert injected[0]["delayed_calls"] == injected[0]["calls"]
    assert injected[0]["p50_us"] == pytest.approx(50_000, rel=0.02)
    assert "delaycomm injected delay on all_reduce (rank 0, delaycomm telemetry)" in stdout


def _cli(argv, module="delaycomm.bench"):
    return run_cli(argv, timeout=80, module=module, cwd=ROOT)


@pytest.mark.timeout(90)
def test_cli_spawns_ranks_writes_json_and_plot(tmp_path, capsys):
    # The command line's main in this process; its launcher (--nproc) spawns the ranks as fresh interpreters.
    # (`python -m delaycomm.bench` itself runs in test_runs_under_torchrun, with --slow.)
    out, png = tmp_path / "run.json", tmp_path / "run.png"
    status = main(
        [
            "--nproc",
            "2",
            "-b",
            "8",
            "-e",
            "1K",
            "-f",
            "32",
            "-n",
            "5",
            "-w",
            "1",
            "-r",
            "2",
            "-C",
            "all_reduce,broadcast",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--progress",
            "on",
        ]
    )
    stdout = capsys.readouterr().out
    assert status == 0, stdout
    assert "#         size        count      type  redop" in stdout
    assert "# all_reduce: busbw factor 2(n-1)/n, n = 2" in stdout
    assert "# broadcast: busbw factor 1, n = 2" in stdout
    data = json.loads(out.read_text())
    assert data["format"] == "delaycomm-bench/1" and data["world_size"] == 2
    assert {r["size_bytes"] for r in data["rows"]} == {8, 256, 1024}
    env = data["environment"]
    assert env["torch"] and env["delaycomm"] and "cpu" in env["machine"]
    assert data["settings"]["iters"] == 5 and data["settings"]["repeats"] == 2
    assert all(len(r["times_us"]) == 2 and len(r["times_us"][0]) == 5 for r in data["rows"])
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_runs_under_torchrun(tmp_path):
    out = tmp_path / "torchrun.json"
    proc = _cli(
        [
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            "-m",
            "delaycomm.bench",
            "-b",
            "64",
            "-e",
            "64",
            "-n",
            "5",
            "-w",
            "1",
            "-r",
            "2",
            "--json",
            str(out),
        ],
        module="torch.distributed.run",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and [r["backend"] for r in data["rows"]] == ["delaycomm", "gloo"]
    assert proc.stdout.count("# delaycomm bench: 2 ranks on cpu") == 1  # rank 0 reports, once
