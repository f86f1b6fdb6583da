"""End to end: real rank processes, the real backend. The --quick run is the CI check that every config trains."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os

import pytest

from delaycomm.experiment import CONFIGS
from delaycomm.experiment.cli import QUICK_EPOCHS, main
from delaycomm.experiment.configs import ExperimentConfig
from delaycomm.experiment.runner import Hyper, Runner, load_digits_split

pytestmark = pytest.mark.multiproc


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One `--quick` run of every config, through the command line's main (each config in processes of its own).

    NOTE: main() runs in the test process rather than under a fresh interpreter: `python -m delaycomm.experiment`
    is that function and nothing else, and the ranks are real processes either way.
    """
    out = tmp_path_factory.mktemp("quick")
    js, png = out / "quick.json", out / "quick.png"
    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for name in [k for k in os.environ if k.startswith("DELAYCOMM_")]:
            mp.delenv(name)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(["--quick", "--no-progress", "--json", str(js), "--plot", str(png)])
    return code, stdout.getvalue(), stderr.getvalue(), js, png


@pytest.mark.timeout(300)
def test_quick_every_config_trains(quick):
    code, stdout, stderr, js, png = quick
    assert code == 0, stdout + stderr
    doc = json.loads(js.read_text())
    recs = {c["name"]: c for c in doc["configs"]}
    assert list(recs) == [c.name for c in CONFIGS]
    for name, rec in recs.items():
        assert rec["status"] == "ok", f"{name}: {rec['message']}"
        m = rec["metrics"]
        assert m["loss_fell"] and m["final_train_loss"] < m["initial_train_loss"], name
        assert m["steps"] == QUICK_EPOCHS * doc["dataset"]["steps_per_epoch"], name
        assert m["test_accuracy"] > 0.1, name  # better than chance on 10 balanced classes
        assert len(rec["curves"]["loss"]) == m["steps"]
    for line in stdout.splitlines():
        assert not line.startswith("# ") or ": not " not in line, line
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(300)
def test_quick_configs_differ_only_in_communication(quick):
    js = quick[3]
    doc = json.loads(js.read_text())
    recs = {c["name"]: c for c in doc["configs"]}
    # Same data, seeds and initial weights everywhere.
    assert len({round(r["metrics"]["initial_train_loss"], 12) for r in recs.values()}) == 1
    # Without delay, delaycomm over Gloo computes what raw Gloo computes: the same losses at every step.
    assert recs["bsp"]["curves"]["loss"] == recs["gloo"]["curves"]["loss"]
    # The delayed configs did get delays: as network delay under BSP, as late contributions under SSP/ASP.
    assert recs["bsp-delay"]["metrics"]["delayed_calls"] > 0
    assert recs["straggler"]["metrics"]["slowed_calls"] > 0
    for name in ("ssp2-ema", "asp-apply"):
        st = recs[name]["metrics"]["staleness"]
        assert st["steps"] == recs[name]["metrics"]["steps"] and st["stale"] > 0 and st["dropped"] == 0, name
    assert recs["asp-drop"]["metrics"]["staleness"]["dropped"] > 0
    # FSDP2: the same model's gradients reduce-scattered, one stream per parameter group (the MLP's two Linear
    # layers; its root holds none), each step of each stream one stale step.
    assert recs["fsdp2-bsp-delay"]["metrics"]["delayed_calls"] > 0
    st = recs["fsdp2-ssp2-ema"]["metrics"]["staleness"]
    assert st["steps"] == 2 * recs["fsdp2-ssp2-ema"]["metrics"]["steps"] and st["stale"] > 0, st


def _hyper(**kw):
    base = dict(
        model="mlp",
        epochs=1,
        batch_size=32,
        lr=0.05,
        momentum=0.9,
        seed=0,
        nproc=2,
        delay="exp:p99=40ms",
        budget_s=None,
        timeout_s=120.0,
    )
    base.update(kw)
    return Hyper(**base)


@pytest.fixture(scope="module")
def runner():
    return Runner()


@pytest.fixture(scope="module")
def data():
    return load_digits_split(0, 0.2)


@pytest.mark.timeout(120)
def test_value_error_at_init_is_reported_as_unavailable(runner, data):
    bad = ExperimentConfig("bad", "delaycomm", {"delay_ranks": "5"}, False, "a rank that does not exist")
    run = runner.run(bad, _hyper(), data, lambda n: None)
    assert run["status"] == "unavailable"
    assert run["message"].startswith(
        "not available in this build: delaycomm: invalid value '5' for option 'delay_ranks'"
    ), run["message"]
    assert run["ranks"] == []


@pytest.mark.timeout(120)
def test_an_error_in_a_rank_is_a_failure_with_its_message(runner, data):
    run = runner.run(CONFIGS[1], _hyper(model="nope"), data, lambda n: None)
    assert run["status"] == "failed"
    assert run["message"].startswith("rank 0: KeyError: 'nope' (at worker.py:"), run["message"]
    assert not multiprocessing.active_children()


@pytest.mark.timeout(120)
def test_budget_stops_every_rank_at_the_same_step(runner, data):
    run = runner.run(CONFIGS[1], _hyper(epochs=1_000_000, budget_s=0.5), data, lambda n: None)
    assert run["status"] == "ok", run["message"]
    r0, r1 = run["ranks"]
    assert r0["stopped_by_budget"] and r1["stopped_by_budget"]
    assert r0["steps"] == r1["steps"] > 0
    assert max(r0["end_s"][-1], r1["end_s"][-1]) >= 0.5


@pytest.mark.timeout(120)
def test_timeout_stops_the_ranks_and_exits_1(capsys):
    assert main(["--configs", "bsp", "--epochs", "1000", "--timeout", "2", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "  bsp          timeout" in out
    assert "# bsp: timed out after 2 s (--timeout) with 0/2 ranks done" in out
    assert not multiprocessing.active_children()


@pytest.mark.timeout(300)
def test_seeds_knobs_and_resume(tmp_path, capsys):
    """--seeds N through the multi-seed runner, with each knob reaching the config's options, then resumed."""
    out, js = tmp_path / "out", tmp_path / "s.json"
    argv = ["--configs", "gloo,ssp2-ema", "--epochs", "1", "--seeds", "2", "--seed", "3", "--no-progress"]
    argv += ["--ema-alpha", "0.3", "--fraction", "0.2", "--delay-cap", "mean", "--warmup", "3", "--out", str(out)]
    assert main([*argv, "--json", str(js)]) == 0, capsys.readouterr()
    doc = json.loads(js.read_text())
    assert [(r["config"], r["seed"]) for r in doc["runs"]] == [
        ("gloo", 3),
        ("gloo", 4),
        ("ssp2-ema", 3),
        ("ssp2-ema", 4),
    ]
    opts = doc["configs"][1]["options"]
    assert opts["ema_alpha"] == 0.3 and opts["delay_fraction"] == 0.2 and opts["seed"] == 3
    assert opts["delay"].startswith("trace:") and opts["delay"].endswith("cap-mean.txt")
    assert doc["hyper"]["warmup_steps"] == 3
    stale = {c["name"]: c for c in doc["analysis"]["configs"]}["ssp2-ema"]
    assert stale["vs_baseline"]["test_accuracy"]["n"] == 2 and stale["delaycomm"]["stale_fresh_ratio"]["n"] == 2
    text = capsys.readouterr().out
    assert "# statistics over seeds 3..4" in text and "(baseline)" in text
    # the same command again: every result comes from the folder
    assert main(argv) == 0
    assert "4 runs reused from" in capsys.readouterr().out
