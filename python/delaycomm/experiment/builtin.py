"""A built-in task (digits, diabetes) as a job of the multi-seed runner: each (config, seed) on fresh rank
processes forked from the experiment's fork server (:class:`delaycomm.experiment.runner.Runner`), the seed fixing
the split, the initial weights, the data order and the delay schedule."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from delaycomm.experiment.analysis import downsample
from delaycomm.experiment.configs import ExperimentConfig, resolved_options
from delaycomm.experiment.probe import PROBE_METRICS
from delaycomm.experiment.runner import Hyper, Runner
from delaycomm.experiment.summary import summarize
from delaycomm.experiment.tasks import load_split

__all__ = ["BuiltinJob", "STAT_METRICS"]

# The metrics the statistics are about (the detailed record keeps every measurement).
STAT_METRICS = ("test_accuracy", "test_r2", "test_loss", "final_train_loss", "wall_s") + PROBE_METRICS


class BuiltinJob:
    """Runs a config of the built-in table on a built-in task for one seed."""

    def __init__(self, hp: Hyper) -> None:
        self.hp = hp
        self._runner: Runner | None = None
        self.first: dict[str, dict] = {}  # config -> the detailed summary of its first seed run here

    def fingerprint(self) -> dict[str, Any]:
        hp = dataclasses.asdict(self.hp)
        for k in ("seed", "timeout_s"):
            hp.pop(k)
        return {"kind": "builtin", **hp}

    def config_fingerprint(self, config: ExperimentConfig) -> dict[str, Any]:
        hp = self.hp
        return {
            "backend": config.backend,
            "parallel": config.parallel,
            "warmup_steps": config.warmup_steps,
            "options": resolved_options(config, hp.delay, None, hp.step_ms, hp.fraction, hp.ema_alpha),
        }

    def run(self, config: ExperimentConfig, seed: int, rundir: Path | None, note: Callable[[str], None]) -> dict:
        if self._runner is None:
            self._runner = Runner()
        hp = dataclasses.replace(self.hp, seed=seed)
        data = load_split(hp.task, seed, hp.test_fraction)
        done = [0]

        def progress(n: int) -> None:
            done[0] += n
            note(f"step {done[0]}")

        summary = summarize(config, self._runner.run(config, hp, data, progress), hp.lr, hp.oscillation_steps)
        summary["seed"] = seed
        self.first.setdefault(config.name, summary)
        return record_of(summary)


def record_of(summary: dict[str, Any]) -> dict[str, Any]:
    """The study's record of one built-in run (its detailed summary kept under ``detail``, without the curves)."""
    m = summary.get("metrics", {})
    rec: dict[str, Any] = {
        "status": summary["status"],
        "message": summary["message"],
        "metrics": {k: m[k] for k in STAT_METRICS if m.get(k) is not None},
        "curves": {},
        "delaycomm": None,
        "wall_s": m.get("wall_s"),
        "detail": {k: v for k, v in summary.items() if k != "curves"},
    }
    curves = summary.get("curves")
    if curves:
        rec["curves"]["train_loss"] = downsample(list(zip(curves["step"], curves["loss"])))
        if "full_loss" in curves:
            rec["curves"]["full_loss"] = downsample(list(zip(curves["step"], curves["full_loss"])))
    if summary["backend"] == "delaycomm" and m:
        rec["delaycomm"] = {k: m.get(k) for k in ("delayed_calls", "slowed_calls", "staleness")}
    return rec
