"""How ``python -m delaycomm.experiment run`` ends, as a user meets it (docs/experiment.md, "When a run fails" and
"Stopping a run"): a signal stops the run in flight and every process of the job, a failed run says the job's own
error, a bad record or metric is never a traceback nor a silently dropped seed."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from delaycomm._tools.launch import descendants
from delaycomm.experiment.analysis import analyze, format_stats
from delaycomm.experiment.cli import main
from delaycomm.experiment.metrics import MAX_LINE, MetricLineError, parse
from delaycomm.experiment.script import failure_message, torchrun_exit
from delaycomm.experiment.study import record_path, run_study
from tests.harness.procs import started_command

JOB = Path(__file__).parent / "scripts" / "edge_job.py"


def _main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def _started(tmp_path: Path, cases: list[str], nproc: int):
    """The experiment as a user starts it, on the real torchrun (through the harness: bounded, and killed with its
    session when the test ends); yields ``(proc, pids, out)`` once every rank of the last (hanging) seed has written
    its pids."""
    pids, out = tmp_path / "pids", tmp_path / "out"
    pids.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_")}
    env.update(EDGE_PIDS=str(pids), EDGE_CASES=",".join(cases))
    cmd = [sys.executable, "-m", "delaycomm.experiment", "run", "--seeds", str(len(cases)), "--nproc", str(nproc)]
    cmd += ["--configs", "gloo", "--out", str(out), "--no-progress", "--", str(JOB)]
    with started_command(cmd, timeout=220, env=env, cwd=str(tmp_path)) as proc:
        deadline = time.monotonic() + 150
        while len(list(pids.iterdir())) < nproc:
            if proc.poll() is not None:
                raise AssertionError(f"the job ended before its last seed: {proc.communicate()}")
            if time.monotonic() > deadline:
                raise AssertionError("the job never reached its last seed in 150 s")
            time.sleep(0.2)
        yield proc, pids, out


def _signal_and_check(proc: subprocess.Popen, pids: Path, sig: signal.Signals) -> str:
    """Send ``sig`` to the experiment alone (as a terminal's Ctrl-C reaches it: the launch has a session of its
    own), then check that it exits 130 with one line and no traceback, and that no process of the job is left."""
    job = set()
    for f in pids.iterdir():
        job.update(int(p) for p in f.read_text().split())  # each rank and the `sleep` it started
    tree, _ = descendants(proc.pid)  # the torchrun agent, the ranks, their children
    assert job <= tree, (job, tree)
    proc.send_signal(sig)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    left = sorted(p for p in tree if _alive(p))
    assert not left, f"processes of the job still running after {sig.name}: {left}"
    assert proc.returncode == 130, (proc.returncode, stdout, stderr)
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_ctrl_c_stops_the_run_in_flight_and_every_process_and_keeps_the_finished_runs(tmp_path):
    with _started(tmp_path, ["ok", "hang"], nproc=2) as (proc, pids, out):
        line = _signal_and_check(proc, pids, signal.SIGINT)
    assert line == (
        f"python -m delaycomm.experiment run: interrupted by SIGINT: stopped gloo seed 1 (not recorded); 1 ok run(s) "
        f"kept in {out} (1 finished now, 0 reused); run the same command again to resume (the failed and the "
        "missing runs run again)"
    ), line
    assert not record_path(out, "gloo", 1).exists()
    rec = json.loads(record_path(out, "gloo", 0).read_text())["record"]
    assert rec["status"] == "ok" and rec["metrics"]["loss"] == 1.0


def _check_failures(raised: dict, exited: dict) -> None:
    # The job's own error line, read through torch's "[rankN]: " prefix, and the log to read; not torchrun's banner.
    assert raised["status"] == "failed"
    m = re.fullmatch(
        r"exit code 1: rank (\d): RuntimeError: the job broke on purpose after init_process_group on rank (\d) "
        r"\(log: (.*)\)",
        raised["message"],
    )
    assert m and m[1] == m[2] and Path(m[3]).is_file() and m[3].endswith(f"/{m[1]}/stderr.log"), raised
    # sys.exit(3): the rank's own code (torchrun's error summary has it; torchrun itself exits 1).
    assert exited["status"] == "failed" and exited["detail"]["returncode"] == 3, exited
    assert re.fullmatch(r"exit code 3: rank \d exited with code 3 with no error line \(log: .*\)", exited["message"])


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_sigterm_stops_the_run_in_flight_and_every_process_and_failed_runs_say_their_own_error(tmp_path):
    with _started(tmp_path, ["raise", "exit3", "hang"], nproc=2) as (proc, pids, out):
        line = _signal_and_check(proc, pids, signal.SIGTERM)
    assert line.startswith(
        f"python -m delaycomm.experiment run: interrupted by SIGTERM: stopped gloo seed 2 (not recorded); 0 ok "
        f"run(s) kept in {out} (2 finished now, 0 reused)"
    ), line
    recs = [json.loads(record_path(out, "gloo", s).read_text())["record"] for s in range(2)]
    _check_failures(*recs)


# The real output of two failed runs under torchrun (torch 2.13, 2 ranks, tests/experiment/scripts/edge_job.py's
# "raise" and "exit3"), in torchrun's layout: its own output and each rank's stderr (--redirects 3).
RECORDED = Path(__file__).parent / "data" / "torchrun-2.13"


@pytest.mark.parametrize("case", ["raise", "exit3"])
def test_a_failed_run_says_the_jobs_own_error_or_the_ranks_own_exit_code(case):
    folder = RECORDED / case
    code, message = failure_message(folder / "logs", 2, folder / "torchrun.log", 1)  # torchrun exits 1
    log = folder / "logs" / "run_0" / "attempt_0" / "0" / "stderr.log"
    # torchrun lists rank 1 first under "Failures:"; the root cause is rank 0
    assert torchrun_exit(folder / "torchrun.log") == (0, 1 if case == "raise" else 3)
    if case == "raise":  # each line of the traceback is "[rank0]: ..."
        want = f"rank 0: RuntimeError: the job broke on purpose after init_process_group on rank 0 (log: {log})"
        assert (code, message) == (1, want)
    else:
        assert (code, message) == (3, f"rank 0 exited with code 3 with no error line (log: {log})")


class _Job:
    """A job of the multi-seed runner that reports ``loss`` per seed from a table, counting its runs (the runner's
    bookkeeping under test: what it reuses, reruns and refuses; the launches are tested above)."""

    def __init__(self, loss):
        self.loss, self.runs = loss, []

    def fingerprint(self):
        return {"kind": "table"}

    def config_fingerprint(self, config):
        return {"name": config.name}

    def run(self, config, seed, rundir, progress):
        self.runs.append(seed)
        return {"status": "ok", "message": "", "metrics": {"loss": self.loss[seed]}, "curves": {}, "delaycomm": None}


class _Config:
    name = "gloo"


@pytest.mark.parametrize(
    "corrupt,why",
    [
        (lambda rec: [], "the record is a list, not an object"),
        (
            lambda rec: {k: v for k, v in rec.items() if k != "config"},
            "the record is of None seed 1, not 'gloo' seed 1",
        ),
        (lambda rec: {**rec, "metrics": {"loss": "0.5"}}, "metric 'loss' is '0.5', not a finite number"),
        (lambda rec: {**rec, "metrics": {"loss": float("nan")}}, "metric 'loss' is nan, not a finite number"),
        (lambda rec: {**rec, "curves": {"loss": [[1]]}}, "curve 'loss' is not a list of [step, finite number]"),
    ],
)
def test_a_corrupt_or_bad_stored_record_is_run_again_with_a_note_naming_the_file(tmp_path, capsys, corrupt, why):
    job = _Job({0: 0.5, 1: 0.25})
    assert run_study(job, [_Config()], [0, 1], tmp_path)[1] == 0 and job.runs == [0, 1]
    path = record_path(tmp_path, "gloo", 1)
    doc = json.loads(path.read_text())
    # NaN as Python writes it: what a hand-edited or foreign file may hold (our writer never does)
    path.write_text(json.dumps({**doc, "record": corrupt(doc["record"])}))
    capsys.readouterr()
    again, reused = run_study(job, [_Config()], [0, 1], tmp_path)
    assert (reused, job.runs) == (1, [0, 1, 1])  # seed 1 ran again; never silently n=1 of 2
    assert capsys.readouterr().err == f"# {path}: {why}; running it again\n"
    assert [r["metrics"]["loss"] for r in again] == [0.5, 0.25]
    assert run_study(job, [_Config()], [0, 1], tmp_path)[1] == 2  # and it is reused from now on


def test_metrics_near_the_float_maximum_give_inf_not_an_overflow():
    recs = [
        {"config": c, "seed": s, "status": "ok", "message": "", "metrics": {"loss": v}, "curves": {"loss": [[1, v]]}}
        for c, v in (("gloo", 1e308), ("b", -1e308))
        for s in (0, 1)
    ]
    doc = analyze(recs, ["gloo", "b"], "gloo")
    g, b = doc["configs"]
    assert g["metrics"]["loss"]["mean"] == 1e308 and g["curves"]["loss"]["mean"] == [1e308]
    vs = b["vs_baseline"]["loss"]
    assert vs["mean"] == -math.inf and vs["verdict"] == "beyond the float range", vs
    text = format_stats(doc, ["header"])
    assert "beyond the float range" in text, text


def test_a_metric_line_is_bounded_and_its_error_is_short():
    with pytest.raises(MetricLineError) as e:
        parse(["DELAYCOMM_METRIC loss=1 blob=" + "7" * (1 << 20)], "rank 0's stdout")
    assert f"a metric line has at most {MAX_LINE}" in str(e.value) and len(str(e.value)) < 400
    with pytest.raises(MetricLineError) as e:
        parse(["DELAYCOMM_METRIC loss=" + "x" * 4000], "rank 0's stdout")
    assert "is not a number" in str(e.value) and len(str(e.value)) < 400


def test_an_unwritable_out_is_a_clear_error_before_any_run(tmp_path):
    (tmp_path / "file").write_text("")
    code, stdout, stderr = _main(["run", "--out", str(tmp_path / "file" / "out"), "--", str(JOB)])
    assert code == 2 and stdout == "", stdout
    assert stderr == (
        f"python -m delaycomm.experiment run: error: argument --out: cannot write results in "
        f"'{tmp_path / 'file' / 'out'}': Not a directory\n"
    ), stderr
