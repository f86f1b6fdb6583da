"""Offline NumPy discrete-event simulator of BSP / SSP(s) / ASP training.

N workers with stragglers and compute jitter train a convex logistic
regression through a parameter server, under a consistency model, a stale
policy and a step-size rule, with optional network delay from the backend's
delay specs. Run ``python -m delaycomm.sim --help``; design notes are in
docs/sim.md. This package needs NumPy only (matplotlib for plots, imported
lazily); it is an offline model, not the runtime backend.

Example:
    >>> from delaycomm.sim import SimConfig, simulate
    >>> r = simulate(SimConfig(model="lead:2", budget=50.0))
    >>> r.max_staleness <= r.bound
    True
"""

from .engine import DelaySource, RunResult, SimConfig, parse_jitter, simulate
from .experiments import PUBLISHED, check_published, run_configs, seed002_config
from .models import ConsistencyModel, parse_model, staleness_bound
from .policies import POLICIES, STEP_RULES, ServerOptimizer, StalePolicy, StepConfig
from .problem import LogisticProblem, ProblemConfig

__all__ = [
    "POLICIES",
    "PUBLISHED",
    "STEP_RULES",
    "ConsistencyModel",
    "DelaySource",
    "LogisticProblem",
    "ProblemConfig",
    "RunResult",
    "ServerOptimizer",
    "SimConfig",
    "StalePolicy",
    "StepConfig",
    "check_published",
    "parse_jitter",
    "parse_model",
    "run_configs",
    "seed002_config",
    "simulate",
    "staleness_bound",
]
