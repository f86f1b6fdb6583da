"""The experiment's configurations: one table, name -> backend and DelayConfig keywords.

Every config trains the same model on the same data with the same hyper-parameters and seeds; only the
communication differs. A config that takes the experiment's ``--delay`` spec says so (``uses_delay``), so that one
flag moves every delayed config together.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ExperimentConfig",
    "CONFIGS",
    "DEFAULT_DELAY",
    "select_configs",
    "resolved_options",
    "effect_problems",
    "command_line",
]

DEFAULT_DELAY = "exp:p99=40ms"


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """One row of the table.

    Attributes:
        name: the name used on the command line (``--configs``).
        backend: ``"gloo"`` (the raw reference) or ``"delaycomm"``.
        options: DelayConfig keywords (without ``delay`` and ``seed``, which the experiment supplies).
        uses_delay: the config takes the experiment's delay spec (``--delay``).
        description: one line for the table and the docs.
        parallel: how the model is distributed: ``"ddp"`` (DistributedDataParallel; the stale configs register
            ``delaycomm.ddp_hook``) or ``"fsdp2"`` (``fully_shard`` on every Linear layer and the root: gradients
            are reduce-scattered, keyed by FSDP2's reduction scope).
        delay: a delay spec of this config's own, in place of the experiment's ``--delay`` (the claims' delay
            families); None: the experiment's.
        warmup_steps: an EpochWarmup of this config's own (the claims' warmup); None: the experiment's ``--warmup``.
    """

    name: str
    backend: str
    options: Mapping[str, Any]
    uses_delay: bool
    description: str
    parallel: str = "ddp"
    delay: str | None = None
    warmup_steps: int | None = None


CONFIGS: tuple[ExperimentConfig, ...] = (
    ExperimentConfig("gloo", "gloo", {}, False, "raw Gloo, no delaycomm: the reference"),
    ExperimentConfig("bsp", "delaycomm", {}, False, "delaycomm without delay (BSP): its overhead vs gloo"),
    ExperimentConfig(
        "bsp-delay", "delaycomm", {}, True, "network delay on a fraction of calls; BSP pays every delay as waiting"
    ),
    ExperimentConfig(
        "straggler", "delaycomm", {"slowdown": "0:4x"}, False, "rank 0 computes 4x slower; BSP waits for it every step"
    ),
    ExperimentConfig(
        "ssp2-ema",
        "delaycomm",
        {"staleness": "ssp:2", "stale_policy": "ema"},
        True,
        "delay under SSP(2); late gradients blended by EMA (alpha 0.1)",
    ),
    ExperimentConfig(
        "asp-apply",
        "delaycomm",
        {"staleness": "asp", "stale_policy": "apply"},
        True,
        "delay under ASP; late gradients applied when they arrive",
    ),
    ExperimentConfig(
        "asp-drop",
        "delaycomm",
        {"staleness": "asp", "stale_policy": "drop"},
        True,
        "delay under ASP; late gradients dropped",
    ),
    ExperimentConfig(
        "fsdp2-bsp-delay",
        "delaycomm",
        {},
        True,
        "FSDP2 (fully_shard): network delay on a fraction of calls, paid as waiting",
        "fsdp2",
    ),
    ExperimentConfig(
        "fsdp2-ssp2-ema",
        "delaycomm",
        {"staleness": "ssp:2", "stale_policy": "ema"},
        True,
        "FSDP2: the reduce-scatters' delay under SSP(2), late gradients blended by EMA",
        "fsdp2",
    ),
)
_BY_NAME = {c.name: c for c in CONFIGS}


def select_configs(names: Sequence[str] | None) -> list[ExperimentConfig]:
    """The configs named on the command line, in the order given (None: all of them).

    Raises:
        ValueError: an unknown or repeated name, naming the flag and the accepted names.
    """
    if names is None:
        return list(CONFIGS)
    out: list[ExperimentConfig] = []
    for name in names:
        if name not in _BY_NAME:
            raise ValueError(f"--configs: unknown config {name!r}; accepted: {', '.join(_BY_NAME)}")
        if _BY_NAME[name] in out:
            raise ValueError(f"--configs: config {name!r} is listed twice")
        out.append(_BY_NAME[name])
    if not out:
        raise ValueError(f"--configs: no config given; accepted: {', '.join(_BY_NAME)}")
    return out


def resolved_options(
    config: ExperimentConfig,
    delay: str,
    seed: int | None,
    step_ms: float | None = None,
    fraction: float | None = None,
    ema_alpha: float | None = None,
) -> dict[str, Any]:
    """The DelayConfig keywords a config runs with (empty for the raw gloo reference).

    Args:
        config: the row.
        delay: the experiment's delay spec (``--delay``), for a config that uses a delay and has none of its own.
        seed: the delay schedule's seed (None: left out, for a caller that sets it per run).
        step_ms: None leaves the backend to calibrate it (``step_ms="auto"``).
        fraction: ``delay_fraction`` of the configs that use a delay (None: the backend's default, 0.3).
        ema_alpha: ``ema_alpha`` of the stale configs (None: the backend's default, 0.1).

    The config's own options win over the experiment-wide knobs (a claims config that sets ``ema_alpha`` keeps it).
    """
    if config.backend != "delaycomm":
        return {}
    opts: dict[str, Any] = {}
    if seed is not None:
        opts["seed"] = seed
    if step_ms is not None:
        opts["step_ms"] = step_ms
    if config.uses_delay:
        opts["delay"] = config.delay or delay
        if fraction is not None:
            opts["delay_fraction"] = fraction
    if ema_alpha is not None and str(config.options.get("staleness", "bsp")) not in ("bsp", "ssp:0"):
        opts["ema_alpha"] = ema_alpha
    opts.update(config.options)
    return opts


def effect_problems(backend: str, options: Mapping[str, Any], stats: Sequence[Mapping]) -> list[str]:
    """Checks that what a config asked for shows in the telemetry of its ranks (``delaycomm.stats`` per rank).

    An option that a build accepts but does not act on would otherwise produce a row indistinguishable from
    plain BSP. Returns one sentence per option that left no trace (empty when all did).

    Args:
        backend: the config's backend (``gloo``: nothing to check).
        options: the DelayConfig keywords the config ran with (option names; values as given).
        stats: each rank's ``delaycomm.stats()``.
    """
    if backend != "delaycomm":
        return []
    problems = []
    staleness = str(options.get("staleness", "bsp"))
    stale = staleness not in ("bsp", "ssp:0")
    if options.get("delay", "none") != "none" and not stale:
        delayed = sum(op.get("delayed_calls", 0) for s in stats for op in s.get("ops", {}).values())
        if delayed == 0:
            problems.append(f"delay={options['delay']!r} was set but no rank recorded a delayed call")
    if options.get("delay", "none") != "none" and stale:
        # NOTE: under ssp/asp the schedule's delays become staleness, not network delay: the evidence is late
        # contributions (stale arrivals or drops), not delayed calls.
        late = sum((s.get("staleness") or {}).get(k, 0) for s in stats for k in ("stale", "dropped"))
        if late == 0:
            problems.append(f"delay={options['delay']!r} was set but no contribution arrived late")
    if str(options.get("slowdown", "none")) != "none":
        calls = sum((s.get("slowdown") or {}).get("calls", 0) for s in stats)
        if calls == 0:
            problems.append(f"slowdown={options['slowdown']!r} was set but no rank recorded a slowed call")
    if stale:
        steps = sum(s.get("staleness", {}).get("steps", 0) for s in stats)
        if steps == 0:
            problems.append(f"staleness={staleness!r} was set but the staleness engine recorded no step")
    return problems


def command_line() -> list[str]:
    """The command as a user typed it, for a result file: ``python -m delaycomm.experiment ...`` rather than the
    absolute path of one machine's ``__main__.py``."""
    argv = list(sys.argv)
    if argv and argv[0].replace(os.sep, "/").endswith("delaycomm/experiment/__main__.py"):
        argv[:1] = ["python", "-m", "delaycomm.experiment"]
    return argv
