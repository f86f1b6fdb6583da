"""The built-in experiment as a function: every config x seed through the multi-seed runner, summarised, as one
JSON-ready document."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from delaycomm._tools.machine import machine_info, versions
from delaycomm.experiment.analysis import analyze
from delaycomm.experiment.builtin import BuiltinJob
from delaycomm.experiment.configs import ExperimentConfig, command_line
from delaycomm.experiment.runner import Hyper
from delaycomm.experiment.study import run_study
from delaycomm.experiment.tasks import TASKS, load_split
from delaycomm.experiment.worker import describe_model, steps_per_epoch

__all__ = ["run_experiment", "header_lines"]


def header_lines(doc: dict[str, Any]) -> list[str]:
    """The ``#`` lines above the table: what was run, with what, where."""
    hp, ds, m, v = doc["hyper"], doc["dataset"], doc["machine"], doc["versions"]
    epochs = (
        f"{hp['epochs']} epochs"
        if hp["budget_s"] is None
        else (f"budget {hp['budget_s']:g} s (at most {hp['epochs']} epochs)")
    )
    seeds = doc["seeds"]
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}..{seeds[-1]} (the table: seed {seeds[0]})"
    knobs = []
    if hp.get("fraction") is not None:
        knobs.append(f"delay_fraction {hp['fraction']:g}")
    if hp.get("ema_alpha") is not None:
        knobs.append(f"ema_alpha {hp['ema_alpha']:g}")
    if hp.get("warmup_steps"):
        knobs.append(f"EpochWarmup {hp['warmup_steps']} steps")
    lines = [
        f"delaycomm.experiment: {ds['name']} ({ds['n_train']} train / {ds['n_test']} test), model {hp['model']} "
        f"({ds['model']}), {hp['nproc']} ranks x {ds['steps_per_epoch']} steps/epoch, {epochs}",
        f"SGD lr {hp['lr']:g} momentum {hp['momentum']:g}, batch {hp['batch_size']}/rank, {seed_text}, "
        f"delay of the delayed configs: {hp['delay']}, step_ms "
        f"{'calibrated' if hp['step_ms'] is None else format(hp['step_ms'], 'g')}"
        + (", " + ", ".join(knobs) if knobs else "")
        + "; identical for every config",
        f"machine: {m['hostname']}, {m['cpu_count']} CPUs ({m['cpu']}), torch {v['torch']}, delaycomm "
        f"{v['delaycomm']}; 1 intra-op thread per rank",
    ]
    if doc["ignored_env"]:
        lines.append("ignored (each config sets its options itself): " + ", ".join(doc["ignored_env"]))
    return lines


def _check(hp: Hyper, data: dict) -> int:
    n = len(data["x_train"])
    spe = steps_per_epoch(n, hp.nproc, hp.batch_size)
    if spe < 1:
        raise ValueError(
            f"argument --batch-size: expected at most {n // hp.nproc} (the {n} training samples split over "
            f"{hp.nproc} ranks), got {hp.batch_size}"
        )
    if hp.warmup_steps > spe:
        raise ValueError(
            f"argument --warmup: expected at most {spe} (the steps per epoch: the warmup restarts every epoch), "
            f"got {hp.warmup_steps}"
        )
    return spe


def run_experiment(
    hp: Hyper,
    configs: Sequence[ExperimentConfig],
    progress: bool | None = None,
    seeds: int = 1,
    out: str | None = None,
    fresh: bool = False,
    delay_cap: str | None = None,
) -> dict[str, Any]:
    """Train every config in ``configs`` with the hyper-parameters ``hp``, for seeds ``hp.seed .. + seeds - 1``.

    Args:
        hp: the hyper-parameters (checked by the caller: :func:`delaycomm.experiment.cli.parse_args`).
        configs: the rows of :data:`delaycomm.experiment.configs.CONFIGS` to run, in order.
        progress: show a progress bar on stderr (None: only when stderr is a terminal).
        seeds: how many seeds.
        out: a folder that keeps each run's record (reused by a later call; None: none kept).
        fresh: with ``out``, run everything again.
        delay_cap: cap the delay's tail (``mean`` or a duration): replayed as a trace (delaycomm.experiment.families).

    Returns:
        The document that ``--json`` writes: ``tool``, ``argv``, ``machine``, ``versions``, ``hyper``, ``dataset``,
        ``seeds``, ``configs`` (the first seed's :func:`delaycomm.experiment.summary.summarize` record of each
        config: the table), ``runs`` (every run's record), ``analysis`` (the statistics), ``reused``,
        ``duration_s``.

    Raises:
        ValueError: a batch larger than a rank's shard, a warmup longer than an epoch, a bad cap, a results folder
            of another experiment.
    """
    started = time.monotonic()
    data = load_split(hp.task, hp.seed, hp.test_fraction)
    spe = _check(hp, data)
    with tempfile.TemporaryDirectory(prefix="delaycomm-experiment-") as tmp:
        if delay_cap is not None:
            from delaycomm.experiment.families import capped_trace

            trace_dir = os.path.join(out, "delays") if out else tmp
            os.makedirs(trace_dir, exist_ok=True)
            try:
                hp = dataclasses.replace(hp, delay=capped_trace(hp.delay, delay_cap, trace_dir))
            except ValueError as e:
                raise ValueError(f"argument --delay-cap: {e}") from None
        job = BuiltinJob(hp)
        seed_list = list(range(hp.seed, hp.seed + seeds))
        records, reused = run_study(job, configs, seed_list, Path(out) if out else None, fresh=fresh, progress=progress)
    first = []
    for c in configs:
        if c.name in job.first:
            first.append(job.first[c.name])
        else:  # reused from --out: the detail without its curves
            rec = next(r for r in records if r["config"] == c.name)
            first.append(rec["detail"])
    names = [c.name for c in configs]
    n_out = int(data["n_classes"]) or 1
    task = TASKS[hp.task]
    doc: dict[str, Any] = {
        "tool": "delaycomm.experiment",
        "argv": command_line(),
        "machine": machine_info(),
        "versions": versions(("torch", "numpy", "scikit-learn")),
        "hyper": dataclasses.asdict(hp),
        "dataset": {
            "name": task.description,
            "task": hp.task,
            "kind": task.kind,
            "n_train": len(data["x_train"]),
            "n_test": len(data["x_test"]),
            "features": int(data["x_train"].shape[1]),
            "classes": int(data["n_classes"]),
            "steps_per_epoch": spe,
            "model": describe_model(hp.model, int(data["x_train"].shape[1]), n_out, task.hidden),
        },
        "seeds": seed_list,
        "ignored_env": sorted(k for k in os.environ if k.startswith("DELAYCOMM_") and k != "DELAYCOMM_LOG_LEVEL"),
        "configs": first,
        "runs": records,
        "analysis": analyze(records, names, "gloo" if "gloo" in names else names[0]),
        "reused": reused,
    }
    doc["duration_s"] = time.monotonic() - started
    return doc
