"""Delay distributions, their deterministic samples, and fitting a spec to overall latency percentiles.

The math lives in C++ (``csrc/delay/``); this module documents it and gives it a Pythonic surface.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from delaycomm import _C

__all__ = ["DelaySampler", "DelayFit", "fit", "parse_duration"]


def parse_duration(value: float | int | str, what: str = "duration") -> float:
    """A duration in seconds: a number of seconds, or a string with a unit (``"60ms"``, ``"800us"``, ``"2s"``).

    Raises:
        ValueError: negative, not finite, or a string without a unit.
    """
    if isinstance(value, bool):
        raise ValueError(f"delaycomm: {what} {value!r} is not a duration (expected seconds or e.g. '60ms')")
    if isinstance(value, (int, float)):
        v = float(value)
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"delaycomm: {what} {value!r} must be a finite number of seconds >= 0")
        return v
    if isinstance(value, str):
        return _C.parse_duration(value, what)
    raise ValueError(f"delaycomm: {what} {value!r} is not a duration (expected seconds or e.g. '60ms')")


class DelaySampler(_C.DelaySampler):
    """A delay distribution with deterministic, counter-based draws.

    Draw ``(stream, seq)`` is a pure function of ``(seed, rank, stream, seq)`` (Philox4x32-10): the same seed gives
    the same delays in every run and process, ranks are decorrelated, and no state is shared between threads. The
    backend draws op ``seq`` of kind ``k`` from stream ``k``; the simulator and :class:`delaycomm.data.DelayedLoader`
    use their own streams.

    Args:
        spec: a delay spec: ``exp:p99=400ms`` (P99 is exactly 400 ms: rate ln(100)/400 ms), ``exp:mean=400ms``,
            ``lognormal:p50=60ms,p99=400ms[,p999=2s]``, ``pareto:p50=60ms,p99=400ms[,p999=2s]``, ``const:50ms``,
            ``trace:FILE`` (one latency per line with a unit; inverse CDF with linear interpolation),
            ``profile:FILE`` (per op and size class, docs/profile.md; draws without a call pool every call) or
            ``none``; or a spec parsed already (``delaycomm._C.DelaySpec``, e.g. a group's ``delay`` option's
            ``spec``), whose file is then not read again.
        seed: seed of the schedule (>= 0).
        rank: the rank whose draws :meth:`sample` returns (>= 0).

    Raises:
        ValueError: a malformed spec or trace file (the message says what is wrong and what is accepted), or a
            third percentile the family cannot reach.

    Methods (seconds throughout):
        ``sample(stream, seq)``; ``sample_many(n, stream=0, start=0)`` -> float64 array of draws ``start..start+n-1``;
        ``quantile(q)`` and ``cdf(x)`` (floats or arrays); ``mean()``; ``describe()`` -> dict (family, solved
        parameters, percentiles).
    """

    def __init__(self, spec: str | _C.DelaySpec, seed: int = 0, rank: int = 0) -> None:
        super().__init__(spec, seed, rank)

    def __repr__(self) -> str:
        return f"DelaySampler({self.spec!r}, seed={self.seed}, rank={self.rank})"


@dataclasses.dataclass(frozen=True)
class DelayFit:
    """A delay spec and fraction whose overall latency percentiles meet the targets given to :func:`fit`.

    Attributes:
        delay: the spec (the ``delay`` option).
        fraction: the ``delay_fraction`` option.
        family: the distribution family chosen.
        component: the percentiles the spec goes through, ``{q: seconds}`` (of the delayed calls alone).
        achieved: the overall percentiles of the mixture computed back from the spec, ``{"p50": seconds, ...}``.
    """

    delay: str
    fraction: float
    family: str
    component: dict[float, float]
    achieved: dict[str, float]

    def options(self) -> dict[str, Any]:
        """The options to pass: ``delaycomm.DelayConfig(**fit.options())`` or ``configure(**fit.options())``."""
        return {"delay": self.delay, "delay_fraction": self.fraction}

    def env(self) -> dict[str, str]:
        """The same as environment variables, for an unmodified torchrun job."""
        return {"DELAYCOMM_DELAY": self.delay, "DELAYCOMM_DELAY_FRACTION": repr(self.fraction)}

    def __str__(self) -> str:
        return self.delay


_KEYS = (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))


def fit(
    p50: float | str | None = None,
    p99: float | str | None = None,
    p999: float | str | None = None,
    fraction: float = 0.3,
    family: str = "auto",
) -> DelayFit:
    """A delay spec whose *overall* added-latency percentiles hit the targets when ``fraction`` of calls are delayed.

    Only a fraction f of the calls is delayed, so the overall latency is a mixture: the overall quantile q is the
    delayed calls' quantile 1 - (1 - q) / f when q > 1 - f, and the undelayed latency (0 added) otherwise. Each
    target is mapped to that component percentile and the family is solved through them: one target gives an
    ``exp``, two a ``lognormal`` (or ``family``), three a shifted lognormal, or a generalised Pareto when the
    lognormal cannot reach the tail. Latencies are the *added* delay (the network's own latency comes on top).

    Args:
        p50: overall median, seconds or a duration string (``"60ms"``); None or 0 to leave it to the undelayed
            calls (needs ``fraction <= 0.5``).
        p99: overall P99.
        p999: overall P99.9 (pins the tail).
        fraction: the share of delayed calls, in (0, 1].
        family: ``"auto"``, ``"exp"``, ``"lognormal"`` or ``"pareto"``.

    Returns:
        A :class:`DelayFit`; ``str(fit)`` is the spec.

    Raises:
        ValueError: why no spec can meet the targets (e.g. a p50 > 0 with fraction <= 0.5: the median call is then
            not delayed).
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise ValueError(f"delaycomm.fit: fraction must be a number in (0, 1], got {fraction!r}")
    targets = []
    for (name, q), value in zip(_KEYS, (p50, p99, p999)):
        if value is None:
            continue
        targets.append((q, parse_duration(value, f"delaycomm.fit: {name}")))
    if not targets:
        raise ValueError("delaycomm.fit: give at least one of p50, p99, p999")
    r = _C.fit_mixture(targets, float(fraction), family)
    names = {q: name for name, q in _KEYS}
    return DelayFit(
        delay=r["spec"],
        fraction=r["fraction"],
        family=r["family"],
        component={q: x for q, x in r["component"]},
        achieved={names[q]: x for q, x in r["achieved"]},
    )
