"""Delay families the claims compare, built from the existing spec grammar (docs/delay.md): nothing new is parsed.

- **fixed vs stochastic**: ``const:<mean>`` against the stochastic spec with the same mean;
- **capped vs uncapped tail**: a *capped* distribution is the spec's quantile function with every value above the
  cap replaced by the cap, ``x_c(u) = min(x(u), cap)``. It is written as a trace file (``trace:FILE``, replayed by
  inverse CDF with linear interpolation) of the quantiles at u = (i + 0.5) / n, i < n = 10 000, computed by the
  backend's own sampler (``delaycomm.DelaySampler(spec).quantile``: the C++ quantile function, one source of truth).
  The trace reproduces the capped distribution to within the spacing of its quantiles: a point mass of 1 - F(cap) at
  the cap, and the spec's shape below it. No new delay-spec option is needed (the spec grammar belongs to
  ``csrc/delay/DelaySpec``).
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["capped_trace", "const_of_mean", "TRACE_POINTS"]

TRACE_POINTS = 10_000


def _sampler(spec: str):
    from delaycomm import DelaySampler

    return DelaySampler(spec)


def cap_seconds(spec: str, cap: str) -> float:
    """The cap in seconds: ``mean`` (the spec's mean) or a duration with a unit (``25ms``)."""
    if cap == "mean":
        return float(_sampler(spec).mean())
    from delaycomm._delay import parse_duration

    return parse_duration(cap, "--delay-cap")


def capped_trace(spec: str, cap: str, directory: str) -> str:
    """Write the capped distribution of ``spec`` as a trace file in ``directory``; return its ``trace:`` spec.

    Args:
        spec: a delay spec with a quantile function (exp, lognormal, pareto, const, trace).
        cap: ``mean`` or a duration (``25ms``).
        directory: where the file goes (it must exist); the name says the spec and the cap.

    Raises:
        ValueError: a bad spec or cap (the sampler's or the duration parser's message).
    """
    sampler = _sampler(spec)
    cap_s = cap_seconds(spec, cap)
    u = (np.arange(TRACE_POINTS) + 0.5) / TRACE_POINTS
    x = np.minimum(np.asarray(sampler.quantile(u), dtype=float), cap_s)
    safe = "".join(c if c.isalnum() or c in "=.-" else "_" for c in f"{spec}-cap-{cap}")
    path = os.path.abspath(os.path.join(directory, f"delay-{safe}.txt"))
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            f"# {spec} capped at {cap} ({cap_s * 1e3:.6g} ms): min(quantile(u), cap) at u = (i + 0.5) / "
            f"{TRACE_POINTS}; written by delaycomm.experiment (docs/experiment.md)\n"
        )
        f.writelines(f"{v * 1e6:.3f}us\n" for v in x)
    return f"trace:{path}"


def const_of_mean(spec: str) -> str:
    """``const:<the spec's mean>``: the fixed delay with the stochastic spec's mean."""
    return f"const:{_sampler(spec).mean() * 1e3:.6g}ms"
