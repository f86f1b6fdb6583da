"""The experiment as a function: run each config, summarise, and return one JSON-ready document."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from delaycomm._tools.machine import machine_info, versions
from delaycomm.experiment.configs import ExperimentConfig
from delaycomm.experiment.report import summarize
from delaycomm.experiment.runner import Hyper, Runner, load_digits_split
from delaycomm.experiment.worker import MODELS, steps_per_epoch

__all__ = ["run_experiment", "header_lines"]


def header_lines(doc: dict[str, Any]) -> list[str]:
    """The ``#`` lines above the table: what was run, with what, where."""
    hp, ds, m, v = doc["hyper"], doc["dataset"], doc["machine"], doc["versions"]
    epochs = (
        f"{hp['epochs']} epochs"
        if hp["budget_s"] is None
        else (f"budget {hp['budget_s']:g} s (at most {hp['epochs']} epochs)")
    )
    lines = [
        f"delaycomm.experiment: {ds['name']} ({ds['n_train']} train / {ds['n_test']} test), model {hp['model']} "
        f"({MODELS[hp['model']][1]}), {hp['nproc']} ranks x {ds['steps_per_epoch']} steps/epoch, {epochs}",
        f"SGD lr {hp['lr']:g} momentum {hp['momentum']:g}, batch {hp['batch_size']}/rank, seed {hp['seed']}, "
        f"delay of the delayed configs: {hp['delay']}, step_ms "
        f"{'calibrated' if hp['step_ms'] is None else format(hp['step_ms'], 'g')}; identical for every config",
        f"machine: {m['hostname']}, {m['cpu_count']} CPUs ({m['cpu']}), torch {v['torch']}, delaycomm "
        f"{v['delaycomm']}; 1 intra-op thread per rank",
    ]
    if doc["ignored_env"]:
        lines.append("ignored (each config sets its options itself): " + ", ".join(doc["ignored_env"]))
    return lines


def run_experiment(hp: Hyper, configs: Sequence[ExperimentConfig], progress: bool | None = None) -> dict[str, Any]:
    """Train every config in ``configs`` with the hyper-parameters ``hp``.

    Args:
        hp: the hyper-parameters (checked by the caller: :func:`delaycomm.experiment.cli.parse_args`).
        configs: the rows of :data:`delaycomm.experiment.configs.CONFIGS` to run, in order.
        progress: show a tqdm bar on stderr (None: only when stderr is a terminal).

    Returns:
        The document that ``--json`` writes: ``tool``, ``argv``, ``machine``, ``versions``, ``hyper``, ``dataset``,
        ``configs`` (one :func:`delaycomm.experiment.report.summarize` record each), ``duration_s``.
    """
    from tqdm import tqdm

    started = time.monotonic()
    data = load_digits_split(hp.seed, hp.test_fraction)
    spe = steps_per_epoch(len(data["x_train"]), hp.nproc, hp.batch_size)
    if spe < 1:
        raise ValueError(
            f"argument --batch-size: expected at most {len(data['x_train']) // hp.nproc} (the {len(data['x_train'])} "
            f"training samples split over {hp.nproc} ranks), got {hp.batch_size}"
        )
    doc: dict[str, Any] = {
        "tool": "delaycomm.experiment",
        "argv": sys.argv,
        "machine": machine_info(),
        "versions": versions(("torch", "numpy", "scikit-learn")),
        "hyper": dataclasses.asdict(hp),
        "dataset": {
            "name": "sklearn digits",
            "n_train": len(data["x_train"]),
            "n_test": len(data["x_test"]),
            "features": int(data["x_train"].shape[1]),
            "classes": int(data["n_classes"]),
            "steps_per_epoch": spe,
        },
        "ignored_env": sorted(k for k in os.environ if k.startswith("DELAYCOMM_") and k != "DELAYCOMM_LOG_LEVEL"),
        "configs": [],
    }
    total = None if hp.budget_s is not None else len(configs) * hp.epochs * spe
    runner = Runner()
    with tqdm(
        total=total,
        unit="step",
        file=sys.stderr,
        disable=(None if progress is None else not progress),
        dynamic_ncols=True,
    ) as bar:
        for config in configs:
            bar.set_description(config.name)
            done = [0]

            def advance(n: int, done: list[int] = done) -> None:
                done[0] += n
                bar.update(n)

            run = runner.run(config, hp, data, advance)
            doc["configs"].append(summarize(config, run))
            if total is not None:
                bar.update(max(0, hp.epochs * spe - done[0]))  # steps that will not come (failed, stopped)
    doc["duration_s"] = time.monotonic() - started
    return doc
