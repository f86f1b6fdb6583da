"""The statistics of a multi-seed experiment: a mean and its 95% confidence interval, and a paired comparison with
the baseline whose verdict comes only from the interval (docs/experiment.md, "Statistics").

- **Interval**: Student's t, ``mean ± t(0.975, n - 1) · sd / sqrt(n)`` over the n seeds that produced the metric
  (sd with n - 1 in the denominator).
- **Paired comparison**: for each seed that both the config and the baseline completed, ``d = config - baseline``
  (the same seed: the same data order, initial weights and delay schedule); the mean of d with its t interval.
- **Verdict** of a comparison, from that interval and the metric's direction only: ``better`` or ``worse`` when the
  interval excludes 0, ``no difference shown`` when it contains 0, ``higher``/``lower`` when the metric's direction
  is unknown, ``not enough seeds`` below 2 pairs.

The t quantile is computed here rather than taken from scipy (a test dependency, not a runtime one): for an integer
number of degrees of freedom, the two-sided t distribution function has a closed form (Abramowitz & Stegun 26.7.3
and 26.7.4: a finite sum of powers of cos(theta), theta = atan(t / sqrt(nu))); the quantile is found by bisection
on theta in (0, pi/2), where that function is monotone, to machine precision (the tests check it against scipy to
1e-9).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CONFIDENCE",
    "t_two_sided",
    "t_quantile",
    "interval",
    "paired",
    "verdict",
    "direction",
    "LOWER",
    "HIGHER",
    "UNKNOWN",
    "OVERFLOW",
]

CONFIDENCE = 0.95
LOWER, HIGHER, UNKNOWN = "lower", "higher", "unknown"
# The verdict of a comparison whose differences leave the float range (values near 1e308 of opposite signs).
OVERFLOW = "beyond the float range"

# How a metric's name tells which way is better, when the user did not say (--lower-better / --higher-better).
# Whole words of the name (split at "_", ".", "-"), first match wins; tested in tests/experiment/test_stats.py.
_LOWER_WORDS = "loss error err mse rmse mae nll perplexity ppl oscillation regret noise deviation".split()
_HIGHER_WORDS = "accuracy acc f1 auc r2 precision recall bleu score reward".split()


def t_two_sided(t: float, nu: int) -> float:
    """P(|T| < t) for Student's t with ``nu`` (an integer >= 1) degrees of freedom (A&S 26.7.3, 26.7.4)."""
    if nu < 1 or int(nu) != nu:
        raise ValueError(f"t_two_sided: nu must be an integer >= 1, got {nu!r}")
    if t <= 0:
        return 0.0
    if math.isinf(t):
        return 1.0
    return _a_of_theta(math.atan(t / math.sqrt(nu)), int(nu))


def _a_of_theta(theta: float, nu: int) -> float:
    c2 = math.cos(theta) ** 2
    s = math.sin(theta)
    if nu % 2 == 1:
        if nu == 1:
            return 2.0 * theta / math.pi
        term, total = math.cos(theta), math.cos(theta)
        for k in range(1, (nu - 3) // 2 + 1):  # powers cos^3 .. cos^(nu-2)
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2.0 / math.pi * (theta + s * total)
    term, total = 1.0, 1.0
    for k in range(0, (nu - 2) // 2):  # powers cos^2 .. cos^(nu-2)
        term *= c2 * (2 * k + 1) / (2 * k + 2)
        total += term
    return s * total


def t_quantile(confidence: float, nu: int) -> float:
    """The t such that P(|T| < t) = ``confidence`` (``t_quantile(0.95, nu)`` = scipy's ``t.ppf(0.975, nu)``)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"t_quantile: confidence must be in (0, 1), got {confidence!r}")
    if nu < 1 or int(nu) != nu:
        raise ValueError(f"t_quantile: nu must be an integer >= 1, got {nu!r}")
    lo, hi = 0.0, math.pi / 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _a_of_theta(mid, int(nu)) < confidence:
            lo = mid
        else:
            hi = mid
    return math.sqrt(nu) * math.tan(0.5 * (lo + hi))


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Mean and t interval of ``values``.

    Overflow-safe: the values are scaled by their largest magnitude before they are summed, so that values near the
    float maximum (``1e308``) give their mean, and a spread or a bound beyond it is ``inf`` (never an
    ``OverflowError``). A non-finite value (a difference of two finite values can overflow) gives a non-finite mean
    and an unbounded interval.

    Returns:
        ``{"n", "mean", "sd", "half", "lo", "hi"}``; with one value, ``sd``, ``half``, ``lo`` and ``hi`` are None.
    """
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "half": None, "lo": None, "hi": None}
    if not all(math.isfinite(v) for v in values):
        mean = sum(float(v) for v in values) / n  # inf, -inf, or nan for inf - inf
        if n < 2:
            return {"n": 1, "mean": mean, "sd": None, "half": None, "lo": None, "hi": None}
        return {"n": n, "mean": mean, "sd": math.inf, "half": math.inf, "lo": -math.inf, "hi": math.inf}
    scale = max(abs(v) for v in values) or 1.0
    scaled = [v / scale for v in values]
    m = math.fsum(scaled) / n
    mean = m * scale
    if n < 2:
        return {"n": 1, "mean": mean, "sd": None, "half": None, "lo": None, "hi": None}
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in scaled) / (n - 1)) * scale
    half = t_quantile(confidence, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "half": half, "lo": mean - half, "hi": mean + half}


def verdict(lo: float | None, hi: float | None, how: str) -> str:
    """The verdict of a difference (config - baseline) whose interval is [lo, hi], for a metric where ``how``
    (``lower``, ``higher`` or ``unknown``) is better."""
    if lo is None or hi is None:
        return "not enough seeds"
    if lo <= 0.0 <= hi:
        return "no difference shown"
    up = lo > 0.0
    if how == UNKNOWN:
        return "higher" if up else "lower"
    return "better" if up == (how == HIGHER) else "worse"


def paired(
    config: Mapping[int, float], baseline: Mapping[int, float], how: str, confidence: float = CONFIDENCE
) -> dict[str, Any]:
    """The paired comparison of a metric: ``config[seed] - baseline[seed]`` over the seeds both have.

    Returns:
        :func:`interval`'s fields for the differences, plus ``seeds`` (the pairs used), ``identical`` (every
        difference exactly 0) and ``verdict``.
    """
    seeds = sorted(set(config) & set(baseline))
    diffs = [config[s] - baseline[s] for s in seeds]
    out = interval(diffs, confidence)
    out["seeds"] = seeds
    out["identical"] = bool(diffs) and all(d == 0.0 for d in diffs)
    out["verdict"] = verdict(out["lo"], out["hi"], how)
    if out["mean"] is not None and not math.isfinite(out["mean"]):
        out["verdict"] = OVERFLOW
    return out


def direction(name: str, lower: Sequence[str] = (), higher: Sequence[str] = ()) -> str:
    """Which way a metric is better: as the user said (``lower`` / ``higher`` name lists), else from the words of
    its name (``test_loss``: lower; ``val_acc``: higher; ``wall_s``: lower), else ``unknown``."""
    if name in lower:
        return LOWER
    if name in higher:
        return HIGHER
    if name in ("wall_s",):
        return LOWER
    words = [w for w in name.lower().replace(".", "_").replace("-", "_").split("_") if w]
    for w in words:
        if w in _LOWER_WORDS:
            return LOWER
        if w in _HIGHER_WORDS:
            return HIGHER
    return UNKNOWN
