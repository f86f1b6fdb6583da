"""The controlled experiment (docs/experiment.md): your own training script, or a built-in task on real data that
ships with scikit-learn, trained under each delay / staleness config and several seeds, through real processes and
the real backend, with statistics that decide.

Command line: ``python -m delaycomm.experiment --help`` (the built-in tasks), ``python -m delaycomm.experiment run
--help`` (your script), ``python -m delaycomm.experiment claims --help`` (seed 000's claims).

In a training script: :func:`report` (``report(step=12, loss=0.3)``: a ``DELAYCOMM_METRIC`` line on rank 0) and
:func:`seed` (the run's seed, ``DELAYCOMM_SEED``). Importing this package for them imports neither scikit-learn nor
the experiment's runner.
"""

from __future__ import annotations

from typing import Any

from delaycomm.experiment.metrics import report, seed

__all__ = ["report", "seed", "CONFIGS", "ExperimentConfig", "Hyper", "run_experiment", "parse_args", "main"]

_LAZY = {
    "CONFIGS": "delaycomm.experiment.configs",
    "ExperimentConfig": "delaycomm.experiment.configs",
    "Hyper": "delaycomm.experiment.runner",
    "run_experiment": "delaycomm.experiment.run",
    "parse_args": "delaycomm.experiment.cli",
    "main": "delaycomm.experiment.cli",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'delaycomm.experiment' has no attribute {name!r}")
