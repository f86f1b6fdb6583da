"""The metric contract between a user's training script and ``python -m delaycomm.experiment run``
(docs/experiment.md, "The metric contract"): one format, written by :func:`report` and read by :func:`parse`.

A metric line is printed by rank 0 on its standard output::

    DELAYCOMM_METRIC name=value [name=value ...]

- ``name``: a letter or ``_``, then letters, digits, ``_`` or ``.``; ``value``: a finite number (Python's ``float``
  syntax: ``0.25``, ``1e-3``).
- The **last** value printed for a name is the run's value of that metric.
- A line with ``step=N`` (an integer >= 0) is also a point of a curve: each other ``name=value`` on it is the
  value of ``name`` at step N (``DELAYCOMM_METRIC step=12 loss=0.31``). A loss curve is such lines, one per step
  (or every k steps); its last point is the run's ``loss`` unless a later line says otherwise.
- A metric line has at most 4096 characters (:data:`MAX_LINE`).
- A line that starts with ``DELAYCOMM_METRIC`` and breaks these rules fails the run, naming the line: a metric
  that was meant and cannot be read is never silently dropped. Other lines are the script's own output.

The seed of a run reaches the script as ``DELAYCOMM_SEED`` (also the seed of delaycomm's delay schedule):
:func:`seed` reads it.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["PREFIX", "SEED_ENV", "MAX_LINE", "report", "seed", "format_line", "parse", "MetricLineError", "Parsed"]

PREFIX = "DELAYCOMM_METRIC"
SEED_ENV = "DELAYCOMM_SEED"
STEP = "step"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
MAX_LINE = 4096  # characters of a metric line: a longer one fails the run (never copied into the record whole)


class MetricLineError(ValueError):
    """A ``DELAYCOMM_METRIC`` line that breaks the contract (the message names the line and what is wrong)."""


def _number(value: Any) -> float:
    item = getattr(value, "item", None)  # a one-element tensor or a numpy scalar
    if callable(item):
        value = item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a metric's value must be a number, got {type(value).__name__}")
    return float(value)


def format_line(step: int | None = None, **metrics: Any) -> str:
    """The metric line for ``metrics`` (at ``step``, when given).

    Raises:
        ValueError: no metric, a name that is not accepted, a value that is not a finite number, a bad step.
    """
    if not metrics:
        raise ValueError("delaycomm.experiment.report: give at least one metric, e.g. report(loss=0.3)")
    parts = [PREFIX]
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"delaycomm.experiment.report: step must be an integer >= 0, got {step!r}")
        parts.append(f"{STEP}={step}")
    for name, value in metrics.items():
        if not _NAME.match(name) or name == STEP:
            raise ValueError(
                f"delaycomm.experiment.report: metric name {name!r} is not accepted; expected a letter or _ then "
                "letters, digits, _ or . (and not 'step')"
            )
        try:
            v = _number(value)
        except TypeError as e:
            raise ValueError(f"delaycomm.experiment.report: {name}: {e}") from None
        if not math.isfinite(v):
            raise ValueError(f"delaycomm.experiment.report: {name}={v!r} is not a finite number")
        parts.append(f"{name}={v!r}")
    line = " ".join(parts)
    if len(line) > MAX_LINE:
        raise ValueError(f"delaycomm.experiment.report: {len(line)} characters; a metric line has at most {MAX_LINE}")
    return line


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return int(os.environ.get("RANK", "0"))


def report(step: int | None = None, **metrics: Any) -> None:
    """Report metrics to ``python -m delaycomm.experiment run`` (a line on rank 0's stdout; other ranks print
    nothing).

    Args:
        step: the step these values belong to (a point of each metric's curve), or None for final values.
        **metrics: name=value, each a finite number (a Python number, a numpy scalar or a one-element tensor).

    Raises:
        ValueError: no metric, a name that is not accepted, a value that is not a finite number, a bad step.
    """
    line = format_line(step, **metrics)
    if _rank() == 0:
        print(line, file=sys.stdout, flush=True)


def seed(default: int = 0) -> int:
    """The run's seed (``DELAYCOMM_SEED``), for the script's own data order and initial weights; ``default`` when
    the script runs outside the experiment."""
    text = os.environ.get(SEED_ENV)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"delaycomm.experiment.seed: {SEED_ENV}={text!r} is not an integer") from None


class Parsed:
    """What a run's output reported: ``final`` (name -> last value) and ``curves`` (name -> [(step, value)])."""

    def __init__(self) -> None:
        self.final: dict[str, float] = {}
        self.curves: dict[str, list[tuple[int, float]]] = {}
        self.lines = 0


def parse(lines: Iterable[str], source: str = "stdout") -> Parsed:
    """Read the metric lines of a run's output.

    Raises:
        MetricLineError: a ``DELAYCOMM_METRIC`` line that breaks the contract, naming ``source`` and the line number.
    """
    out = Parsed()
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line.startswith(PREFIX):
            continue
        rest = line[len(PREFIX) :]
        if rest and not rest[0].isspace():
            continue  # DELAYCOMM_METRICS..., another word
        where = f"{source} line {number} ({shorten(line)!r})"
        if len(line) > MAX_LINE:
            raise MetricLineError(f"{where}: {len(line)} characters; a metric line has at most {MAX_LINE}")
        pairs = rest.split()
        if not pairs:
            raise MetricLineError(f"{where}: no name=value after {PREFIX}")
        values: dict[str, float] = {}
        step: int | None = None
        for pair in pairs:
            name, eq, text = pair.partition("=")
            if not eq or not _NAME.match(name):
                raise MetricLineError(
                    f"{where}: {shorten(pair, 60)!r} is not name=value "
                    "(name: a letter or _ then letters, digits, _ or .)"
                )
            if name == STEP:
                if not text.isdigit():
                    raise MetricLineError(f"{where}: step={shorten(text, 60)!r} is not an integer >= 0")
                step = int(text)
                continue
            try:
                v = float(text)
            except ValueError:
                raise MetricLineError(f"{where}: {name}={shorten(text, 60)!r} is not a number") from None
            if not math.isfinite(v):
                raise MetricLineError(f"{where}: {name}={text} is not a finite number")
            values[name] = v
        if not values:
            raise MetricLineError(f"{where}: a step with no metric")
        out.lines += 1
        for name, v in values.items():
            out.final[name] = v
            if step is not None:
                out.curves.setdefault(name, []).append((step, v))
    return out


def shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 20] + " ... " + text[-min(15, limit // 4) :]


MESSAGE_CHARS = 300  # an error line longer than this is shortened in the record and the table


def shorten_message(text: str, limit: int = MESSAGE_CHARS) -> str:
    """A run's error line as the record and the table keep it (its length said where it was cut)."""
    return text if len(text) <= limit else text[: limit - 40] + f" ... ({len(text)} characters) ... " + text[-15:]
