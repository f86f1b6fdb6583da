"""The controlled experiment (docs/experiment.md): one small real model on scikit-learn's digits, trained under several
delay / staleness configs with identical hyper-parameters and seeds, through real processes and the real backend.

Command line: ``python -m delaycomm.experiment --help``; design and reading guide: ``docs/experiment.md``.
"""

from delaycomm.experiment.cli import main, parse_args
from delaycomm.experiment.configs import CONFIGS, ExperimentConfig
from delaycomm.experiment.run import run_experiment
from delaycomm.experiment.runner import Hyper

__all__ = ["CONFIGS", "ExperimentConfig", "Hyper", "run_experiment", "parse_args", "main"]
