"""``python -m delaycomm.experiment run``: a user's script, unmodified, once per config and seed (real processes,
the real backend); its rows, their errors, resuming, and what a missing extra says."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import sys
from pathlib import Path

import pytest

from delaycomm.experiment.cli import main
from tests.harness import run_procs

pytestmark = pytest.mark.multiproc

JOB = Path(__file__).parent / "scripts" / "metric_job.py"


def _main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _config_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """One `run --launcher forked` with two configs that train and two that fail, 2 seeds, with scikit-learn hidden
    from this process: `run` with a user's script must not need it."""
    tmp = tmp_path_factory.mktemp("run")
    configs = _config_file(
        tmp,
        "configs.txt",
        "[gloo]\n[delayed]\nDELAYCOMM_DELAY = const:5ms\nDELAYCOMM_DELAY_FRACTION = 0.5\n"
        "[fails]\nDELAYCOMM_DELAY = const:1ms\n[silent]\nDELAYCOMM_DELAY = const:3ms\n"
        "[stale]\nDELAYCOMM_DELAY = const:5ms\nDELAYCOMM_STALENESS = ssp:2\nDELAYCOMM_UPDATE_STATS = 1\n",
    )
    out, js = tmp / "out", tmp / "run.json"
    argv = ["run", "--launcher", "forked", "--seeds", "2", "--config-file", configs, "--out", str(out)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "sklearn", None)  # `import sklearn` raises ImportError
        for name in [k for k in os.environ if k.startswith("DELAYCOMM_")]:
            mp.delenv(name)
        first = _main([*argv, "--no-progress", "--json", str(js), "--", str(JOB)])
        ok_only = _config_file(
            tmp, "ok.txt", "[gloo]\n[delayed]\nDELAYCOMM_DELAY = const:5ms\nDELAYCOMM_DELAY_FRACTION = 0.5\n"
        )
        again = _main([*argv[:5], "--config-file", ok_only, "--out", str(out), "--no-progress", "--", str(JOB)])
    return first, again, json.loads(js.read_text())


@pytest.mark.timeout(240)
def test_every_config_and_seed_runs_and_reports(forked):
    (code, stdout, stderr), _, doc = forked
    assert code == 1, stdout + stderr  # two configs fail on purpose
    runs = {(r["config"], r["seed"]): r for r in doc["runs"]}
    assert len(runs) == 10
    for seed in (0, 1):
        g, d = runs[("gloo", seed)], runs[("delayed", seed)]
        assert g["status"] == d["status"] == "ok", (g["message"], d["message"])
        # rank 0's metric lines: the last value counts, and a step line is a point of the curve
        assert g["metrics"]["seed_seen"] == seed  # DELAYCOMM_SEED reached the script
        assert len(g["curves"]["loss"]) == 30 and g["curves"]["loss"][-1] == [30, g["metrics"]["loss"]]
        assert g["metrics"]["final_loss"] == g["metrics"]["loss"]
        # delaycomm's own stats, from the stats files: the delay showed, the reference had none
        assert g["detail"]["backend"] == "delaycomm" and g["delaycomm"]["delayed_calls"] == 0
        assert d["delaycomm"]["delayed_calls"] > 0
        # BSP: a delay changes the timing, never the arithmetic
        assert d["curves"]["loss"] == g["curves"]["loss"]
    assert runs[("gloo", 0)]["metrics"]["loss"] != runs[("gloo", 1)]["metrics"]["loss"]
    for seed in (0, 1):
        assert runs[("fails", seed)]["status"] == "failed"
        log = Path(runs[("fails", seed)]["detail"]["rundir"]) / "logs" / "forked" / "attempt_0" / "0" / "stderr.log"
        assert runs[("fails", seed)]["message"] == (
            f"exit code 1: rank 0: ValueError: the job failed on purpose (log: {log})"
        ), runs[("fails", seed)]["message"]
        assert runs[("silent", seed)]["status"] == "failed"
        assert runs[("silent", seed)]["message"].startswith("the script reported no metric: print 'DELAYCOMM_METRIC")
    for seed in (0, 1):
        # an unmodified DDP script under ssp:2: its buckets went stale, and the engine measured what each rank sent
        s = runs[("stale", seed)]
        assert s["status"] == "ok", s["message"]
        assert s["delaycomm"]["staleness"]["stale"] > 0
        assert s["delaycomm"]["update"]["steps"] > 0 and 0 < s["delaycomm"]["update"]["deviation"] < 2
        assert runs[("delayed", seed)]["delaycomm"]["update"] is None  # off by default
    a = {c["name"]: c for c in doc["analysis"]["configs"]}
    assert a["stale"]["delaycomm"]["engine_update_deviation"]["n"] == 2
    assert a["delayed"]["vs_baseline"]["final_loss"]["identical"] is True
    assert a["delayed"]["vs_baseline"]["final_loss"]["verdict"] == "no difference shown"
    assert a["delayed"]["vs_baseline"]["wall_s"]["n"] == 2
    assert "# fails seed 0: failed: exit code 1: rank 0: ValueError: the job failed on purpose (log: " in stdout
    assert not multiprocessing.active_children()


@pytest.mark.timeout(240)
def test_results_on_disk_are_not_run_again(forked):
    _, (code, stdout, stderr), _ = forked
    assert code == 0, stdout + stderr
    assert "# 4 runs, 4 reused from" in stdout


@pytest.mark.timeout(120)
def test_a_run_past_the_timeout_is_stopped(tmp_path):
    configs = _config_file(tmp_path, "hang.txt", "[hangs]\nDELAYCOMM_DELAY = const:2ms\n")
    code, stdout, stderr = _main(
        [
            "run",
            "--launcher",
            "forked",
            "--seeds",
            "1",
            "--config-file",
            configs,
            "--baseline",
            "hangs",
            "--timeout",
            "2",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            "--",
            str(JOB),
        ]
    )
    assert code == 1, stdout + stderr
    assert "# hangs seed 0: timeout: ran past --timeout 2 s; stopped" in stdout
    assert not multiprocessing.active_children()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["run", "--seeds", "1"], "give the script after --: python -m delaycomm.experiment run [options] -- train.py"),
        (["run", "--", "/no/such.py"], "the script '/no/such.py' is not a file"),
        (
            ["run", "--configs", "gloo,fsdp2-bsp-delay", "--", str(JOB)],
            "argument --configs: unknown config 'fsdp2-bsp-delay'",
        ),
        (["run", "--configs", "bsp-delay", "--", str(JOB)], "argument --baseline: 'gloo' is not among the configs run"),
        (
            ["run", "--config-file", str(JOB), "--ema-alpha", "0.3", "--", str(JOB)],
            "argument --config-file: --ema-alpha applies to the built-in table's configs",
        ),
        (["run", "--seeds", "0", "--", str(JOB)], "argument --seeds: 0 is too small; expected an integer in [1, 1000]"),
    ],
)
def test_bad_run_arguments_exit_2_naming_the_flag(argv, message):
    code, _, err = _main(argv)
    assert code == 2
    assert err.startswith("python -m delaycomm.experiment run: error: " + message), err


def _without_sklearn(rank: int, world: int) -> list:
    sys.modules["sklearn"] = None  # this process only: `import sklearn` raises ImportError
    return [_main(["--quick", "--no-progress"])[::2], _main(["claims", "--quick", "--no-progress"])[::2]]


@pytest.mark.timeout(120)
def test_the_built_in_tasks_without_scikit_learn_name_the_extra():
    (builtin, claims) = run_procs(_without_sklearn, 1, timeout=60)[0]
    extra = "): pip install scikit-learn"
    assert builtin[0] == 2 and builtin[1].startswith("python -m delaycomm.experiment: error: the built-in tasks")
    assert extra in builtin[1] and "Traceback" not in builtin[1]
    assert claims[0] == 2 and extra in claims[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_under_torchrun(tmp_path):
    """The same job under the real torchrun, as a user runs it (scripts/test.sh --slow)."""
    configs = _config_file(
        tmp_path, "c.txt", "[gloo]\n[delayed]\nDELAYCOMM_DELAY = const:5ms\n[fails]\nDELAYCOMM_DELAY = const:1ms\n"
    )
    js = tmp_path / "r.json"
    code, stdout, stderr = _main(
        [
            "run",
            "--seeds",
            "2",
            "--config-file",
            configs,
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            "--json",
            str(js),
            "--",
            str(JOB),
        ]
    )
    assert code == 1, stdout + stderr
    runs = {(r["config"], r["seed"]): r for r in json.loads(js.read_text())["runs"]}
    for seed in (0, 1):
        assert runs[("gloo", seed)]["status"] == "ok" and runs[("gloo", seed)]["detail"]["launcher"] == "torchrun"
        assert runs[("gloo", seed)]["metrics"]["seed_seen"] == seed
        assert runs[("delayed", seed)]["delaycomm"]["delayed_calls"] > 0
        assert runs[("delayed", seed)]["curves"]["loss"] == runs[("gloo", seed)]["curves"]["loss"]
        assert runs[("fails", seed)]["status"] == "failed"
        assert runs[("fails", seed)]["message"].startswith("exit code 1: rank ")
        assert "ValueError: the job failed on purpose (log: " in runs[("fails", seed)]["message"]
