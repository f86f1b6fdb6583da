"""Latency samples into the log-bucket histograms of profiles, and the spread of a mean into a distribution.

The bucket scheme is the stats files' and profiles' (csrc/stats/Histogram.hpp, docs/profile.md): bucket ``i`` holds
[1.02^i, 1.02^(i+1)) ns, 1700 buckets, exact zeros counted apart. A source gives samples (a trace's kernel
durations, or the points a table row's mean is spread into); this module turns them into one profile class.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

import numpy as np

__all__ = ["BASE", "SPREAD_WEIGHT", "Spread", "class_entry", "size_class_bytes", "spread_samples"]

BASE = 1.02  # csrc/stats/Histogram.hpp, LogHistogram::kBase
_BUCKETS = 1700  # LogHistogram::kBuckets
_LOG_BASE = math.log(BASE)
_Z99 = statistics.NormalDist().inv_cdf(0.99)
# The points one table row's mean is spread into: what the row weighs beside other rows and other sources' calls.
SPREAD_WEIGHT = 1000


def size_class_bytes(nbytes: int) -> int:
    """The profile class of a call of ``nbytes`` (its smallest size: 0, or the power of two at or below)."""
    return 0 if nbytes <= 0 else 1 << (int(nbytes).bit_length() - 1)


def class_entry(size_class: int, samples_ns: np.ndarray) -> dict:
    """The profile entry (docs/profile.md, schema v1) of one size class holding ``samples_ns``."""
    x = np.asarray(samples_ns, dtype=np.float64)
    zeros = int(np.count_nonzero(x <= 0.0))
    pos = x[x > 0.0]
    idx = np.clip(np.floor(np.log(np.maximum(pos, 1.0)) / _LOG_BASE), 0, _BUCKETS - 1).astype(np.int64)
    buckets, counts = np.unique(idx, return_counts=True)
    return {
        "bytes": int(size_class),
        "count": int(x.size),
        "zeros": zeros,
        "min_ns": float(max(x.min(), 0.0)),
        "max_ns": float(max(x.max(), 0.0)),
        "sum_ns": float(np.maximum(x, 0.0).sum()),
        "buckets": [[int(b), int(c)] for b, c in zip(buckets, counts)],
    }


@dataclass(frozen=True)
class Spread:
    """How one mean time becomes a distribution: a lognormal with the given mean and p99/p50 ratio.

    ``p99_over_p50`` 1 is a point mass (every draw the mean). With ``lo``/``hi`` (nccl-tests' per-iteration min and
    max) the draws are clipped to them and then scaled back to the mean.
    """

    p99_over_p50: float
    lo: float | None = None
    hi: float | None = None

    @staticmethod
    def from_tail(mean: float, p99: float, lo: float | None, hi: float | None, cv: float | None) -> Spread:
        """The lognormal whose mean is ``mean`` and p99 is ``p99`` (nccl-tests' per-iteration columns); when the p99
        is not above the mean (a tail beyond p99 pulled the mean up), the one whose coefficient of variation is
        ``cv`` instead."""
        ratio = p99 / mean if mean > 0 else 1.0
        disc = _Z99 * _Z99 - 2.0 * math.log(ratio) if ratio > 1.0 else -1.0
        if ratio > 1.0 and disc >= 0.0:
            sigma = _Z99 - math.sqrt(disc)
        elif cv is not None and cv > 0.0:
            sigma = math.sqrt(math.log1p(cv * cv))
        else:
            sigma = 0.0
        return Spread(math.exp(_Z99 * sigma), lo, hi)


def spread_samples(mean_ns: float, spread: Spread, weight: int = SPREAD_WEIGHT) -> np.ndarray:
    """``weight`` points of the lognormal of mean ``mean_ns`` (the quantiles at (i + 0.5) / weight), scaled so that
    their mean is exactly ``mean_ns`` (after clipping to the spread's bounds, when it has them)."""
    if mean_ns <= 0.0:
        return np.zeros(weight)
    sigma = math.log(spread.p99_over_p50) / _Z99
    if sigma <= 1e-12:
        return np.full(weight, float(mean_ns))
    x = np.exp(sigma * _normal_points(weight) - 0.5 * sigma * sigma) * mean_ns
    lo = spread.lo if spread.lo is not None and spread.lo <= mean_ns else None
    hi = spread.hi if spread.hi is not None and spread.hi >= mean_ns else None
    for _ in range(50):  # scale to the mean and clip, until both hold (the mean lies within the bounds)
        x *= mean_ns / x.mean()
        if lo is None and hi is None:
            break
        x = np.clip(x, lo if lo is not None else 0.0, hi if hi is not None else np.inf)
        if abs(x.mean() / mean_ns - 1.0) < 1e-9:
            break
    return x


@functools.lru_cache(maxsize=4)
def _normal_points(weight: int) -> np.ndarray:
    nd = statistics.NormalDist()
    z = np.array([nd.inv_cdf((i + 0.5) / weight) for i in range(weight)])
    z.setflags(write=False)
    return z
