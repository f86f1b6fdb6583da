"""``python -m delaycomm.experiment claims``: the verdict rules on exact intervals, the judges on synthetic records,
and a --quick run end to end (real ranks, the real backend; the full run is docs/claims.md's)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from delaycomm.experiment import claims as cl
from delaycomm.experiment.cli import main


def _iv(lo, hi):
    return {"n": 5, "mean": (lo + hi) / 2, "half": (hi - lo) / 2, "lo": lo, "hi": hi}


@pytest.mark.parametrize(
    "lo,hi,expected,verdict",
    [
        (0.1, 0.3, +1, "supported"),
        (-0.3, -0.1, +1, "contradicted"),
        (-0.1, 0.3, +1, "not shown"),
        (-0.3, -0.1, -1, "supported"),
    ],
)
def test_sign_rule(lo, hi, expected, verdict):
    assert cl.sign_verdict(_iv(lo, hi), expected) == verdict


@pytest.mark.parametrize(
    "lo,hi,verdict",
    [
        (-0.45, -0.35, "supported"),  # inside the claimed -50%..-30%
        (-0.35, -0.05, "supported"),  # overlaps it and excludes 0
        (-0.9, -0.7, "contradicted"),  # the right direction, a size the interval rules out
        (-0.1, 0.2, "contradicted"),  # rules out a cut of 30% or more
        (-0.4, 0.1, "not shown"),  # could be -40%, could be 0
        (0.2, 0.5, "contradicted"),
    ],
)
def test_size_rule(lo, hi, verdict):
    assert cl.size_verdict(_iv(lo, hi), [(-0.5, -0.3)]) == verdict
    assert cl.size_verdict({"n": 1, "mean": 0.0, "lo": None, "hi": None}, [(-0.5, -0.3)]) == "not shown"


def _records(values):
    """{config: {metric: [v per seed]}} -> records (and a stale:fresh ratio per config)."""
    ratios = {"frac0.15": 0.18, "ema0.1": 0.43, "frac0.5": 1.0}
    out = []
    for config, metrics in values.items():
        n = len(next(iter(metrics.values())))
        for seed in range(n):
            out.append(
                {
                    "config": config,
                    "seed": seed,
                    "status": "ok",
                    "message": "",
                    "metrics": {m: v[seed] for m, v in metrics.items()},
                    "delaycomm": {"staleness": {"stale_fresh_ratio": ratios.get(config, 0.43)}},
                }
            )
    return out


def test_the_threshold_rule():
    ts = cl.settings(quick=True, timeout_s=60)["digits"]
    base = [1.0, 1.1, 1.2, 1.0]
    rec = _records(
        {
            "gloo": {"final_train_loss": base},
            "frac0.15": {"final_train_loss": [v + d for v, d in zip(base, (0.0, 0.01, -0.01, 0.0))]},
            "ema0.1": {"final_train_loss": [v + 0.2 + d for v, d in zip(base, (0.0, 0.01, -0.01, 0.0))]},
            "frac0.5": {"final_train_loss": [v + 0.5 + d for v, d in zip(base, (0.0, 0.01, -0.01, 0.0))]},
        }
    )
    text, verdict, _ = cl._threshold(rec, ts)
    assert verdict == "supported", text
    rec = _records(
        {
            "gloo": {"final_train_loss": base},
            "frac0.15": {"final_train_loss": [v + 0.1 + d for v, d in zip(base, (0.0, 0.01, -0.01, 0.0))]},
            "ema0.1": {"final_train_loss": [v + 0.2 for v in base]},
            "frac0.5": {"final_train_loss": [v + 0.5 for v in base]},
        }
    )
    assert cl._threshold(rec, ts)[1] == "contradicted"  # already worse below 0.4


def test_the_variance_claim_is_a_relative_change_against_apply():
    ts = cl.settings(quick=True, timeout_s=60)["digits"]
    rec = _records(
        {
            "gloo": {"final_train_loss": [1.0, 1.0, 1.0]},
            "apply": {"update_noise_ratio": [1.0, 2.0, 1.5]},
            "ema0.1": {"update_noise_ratio": [0.6, 1.2, 0.9], "final_train_loss": [1.0, 1.0, 1.0]},
        }
    )
    text, verdict, numbers = cl._ema_variance(rec, ts)
    assert numbers["relative_noise_vs_apply"]["mean"] == pytest.approx(-0.4)
    assert verdict == "supported"
    assert text.startswith("update noise of ema0.1 vs apply: -40%")


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_quick_claims_end_to_end(tmp_path):
    """The --quick form on a subset of the configs (each claim's code runs; those whose configs did not run say
    'no data' and 'not shown')."""
    js, png, md = tmp_path / "c.json", tmp_path / "c.png", tmp_path / "c.md"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(
            [
                "claims",
                "--quick",
                "--tasks",
                "digits",
                "--configs",
                "ema0.1",
                "--out",
                str(tmp_path),
                "--json",
                str(js),
                "--plot",
                str(png),
                "--markdown",
                str(md),
                "--no-progress",
            ]
        )
    assert code == 0, out.getvalue() + err.getvalue()
    doc = json.loads(js.read_text())
    assert [c["name"] for c in doc["configs"]["digits"]] == ["gloo", "ema0.1"]
    rows = {(r["key"], r["task"]): r for r in doc["claims"]}
    assert rows[("tree", "-")]["verdict"] == "not measurable here"
    # tail-gap pairs ema0.1 with gloo, seed by seed; capped-tail's config did not run: no pair, no verdict
    assert rows[("tail-gap", "digits")]["verdict"] in ("supported", "contradicted", "not shown")
    assert rows[("tail-gap", "digits")]["numbers"]["diff"]["n"] == 2
    assert rows[("capped-tail", "digits")]["verdict"] == "not shown"
    assert rows[("capped-tail", "digits")]["numbers"]["diff"]["n"] == 0
    assert rows[("ema-variance", "digits")]["measured"].startswith("update noise of ema0.1 vs apply: no data")
    a = {c["name"]: c for c in doc["analysis"]["digits"]["configs"]}
    for name in ("gloo", "ema0.1"):
        assert a[name]["ok"] == 2, a[name]["errors"]
        assert a[name]["metrics"]["update_noise_ratio"]["n"] == 2
    assert a["gloo"]["metrics"]["update_noise_ratio"]["mean"] == pytest.approx(1.0, abs=1e-5)
    assert a["ema0.1"]["delaycomm"]["stale_fresh_ratio"]["mean"] > 0  # the engine made contributions stale
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert md.read_text().startswith("| claim | where seed 000 says it |")


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(900)
def test_quick_claims_every_config(tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["claims", "--quick", "--out", str(tmp_path), "--json", str(tmp_path / "c.json"), "--no-progress"])
    assert code == 0, out.getvalue()
    doc = json.loads((tmp_path / "c.json").read_text())
    assert {r["task"] for r in doc["claims"]} == {"digits", "diabetes", "-"}
    assert all(c["ok"] == 2 for t in doc["analysis"].values() for c in t["configs"])
    runs = json.loads((tmp_path / "digits" / "runs" / "capped" / "seed0.json").read_text())["record"]
    assert runs["detail"]["options"]["delay"].startswith("trace:")  # the capped tail, replayed as a trace
