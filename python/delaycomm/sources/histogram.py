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

__all__ = ["BASE", "SPREAD_WEIGHT", "Spread", "Pool", "Pools", "class_entry", "size_class_bytes", "spread_samples"]

BASE = 1.02  # csrc/stats/Histogram.hpp, LogHistogram::kBase
_BUCKETS = 1700  # LogHistogram::kBuckets
_LOG_BASE = math.log(BASE)
_Z99 = statistics.NormalDist().inv_cdf(0.99)
# The points one table row's mean is spread into: what the row weighs beside other rows and other sources' calls.
SPREAD_WEIGHT = 1000


def size_class_bytes(nbytes: int) -> int:
    """The profile class of a call of ``nbytes`` (its smallest size: 0, or the power of two at or below)."""
    return 0 if nbytes <= 0 else 1 << (int(nbytes).bit_length() - 1)


class _Acc:
    """A class's histogram, added to a block of samples at a time."""

    def __init__(self):
        self.counts = np.zeros(_BUCKETS, dtype=np.int64)
        self.n = self.zeros = 0
        self.lo, self.hi, self.total = math.inf, -math.inf, 0.0

    def add(self, x: np.ndarray, times: np.ndarray | None = None) -> None:
        """Rows of samples ``x`` (2-D; or one row), row i read ``times[i]`` times (default once)."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        if not x.size:
            return
        t = np.ones(x.shape[0], dtype=np.int64) if times is None else np.asarray(times, dtype=np.int64)
        self.n += int(x.shape[1] * t.sum())
        self.zeros += int((np.count_nonzero(x <= 0.0, axis=1) * t).sum())
        self.lo, self.hi = min(self.lo, float(x.min())), max(self.hi, float(x.max()))
        self.total += float((np.maximum(x, 0.0).sum(axis=1) * t).sum())
        pos = x > 0.0
        idx = np.clip(np.floor(np.log(np.maximum(x, 1.0)) / _LOG_BASE), 0, _BUCKETS - 1).astype(np.int64)
        w = np.broadcast_to(t[:, None], x.shape)
        self.counts += np.bincount(idx[pos], weights=w[pos], minlength=_BUCKETS).astype(np.int64)

    def add_pool(self, pool: Pool) -> None:
        groups: dict[tuple[float, int], list[tuple[float, int]]] = {}
        for (mean, ratio, lo, hi, weight), times in pool.draws.items():
            if lo is None and hi is None:
                groups.setdefault((ratio, weight), []).append((mean, times))
            else:  # clipped to nccl-tests' per-iteration min and max: each row its own shape
                self.add(spread_samples(mean, Spread(ratio, lo, hi), weight) * pool.scale, np.array([times]))
        for (ratio, weight), items in groups.items():
            # without bounds, a row's points are its mean times one shape (spread_samples' scaling)
            shape = spread_samples(1.0, Spread(ratio), weight) if weight > 1 else np.ones(1)
            step = max(1, (1 << 20) // shape.size)
            for k in range(0, len(items), step):
                block = np.array(items[k : k + step], dtype=np.float64)
                self.add_scaled(block[:, 0] * pool.scale, block[:, 1].astype(np.int64), shape)

    def add_scaled(self, means: np.ndarray, times: np.ndarray, shape: np.ndarray) -> None:
        """Rows ``means[i] x shape`` (shape > 0), row i read ``times[i]`` times: the buckets from the logarithms'
        sum, one addition per point."""
        zero = means <= 0.0
        if zero.any():  # a row of mean 0: every point 0
            self.add(np.zeros((int(zero.sum()), shape.size)), times[zero])
            means, times = means[~zero], times[~zero]
        if not means.size:
            return
        self.n += int(shape.size * times.sum())
        self.lo = min(self.lo, float(means.min() * shape.min()))
        self.hi = max(self.hi, float(means.max() * shape.max()))
        self.total += float((means * times).sum() * shape.sum())
        logs = np.log(means)[:, None] + np.log(shape)[None, :]
        idx = np.clip(np.floor(np.maximum(logs, 0.0) / _LOG_BASE), 0, _BUCKETS - 1).astype(np.int64)
        w = np.broadcast_to(times[:, None], idx.shape)
        self.counts += np.bincount(idx.ravel(), weights=w.ravel(), minlength=_BUCKETS).astype(np.int64)

    def entry(self, size_class: int) -> dict:
        buckets = np.flatnonzero(self.counts)
        return {
            "bytes": int(size_class),
            "count": int(self.n),
            "zeros": int(self.zeros),
            "min_ns": float(max(self.lo, 0.0)) if self.n else 0.0,
            "max_ns": float(max(self.hi, 0.0)) if self.n else 0.0,
            "sum_ns": float(self.total),
            "buckets": [[int(b), int(self.counts[b])] for b in buckets],
        }


def class_entry(size_class: int, samples_ns) -> dict:
    """The profile entry (docs/profile.md, schema v1) of one size class holding ``samples_ns``: an array of
    samples, a :class:`Pool`, or a list of them (added up part by part, never concatenated)."""
    parts = samples_ns if isinstance(samples_ns, (list, tuple)) else [samples_ns]
    acc = _Acc()
    for part in parts:
        if isinstance(part, Pool):
            acc.add_pool(part)
        else:
            acc.add(np.asarray(part, dtype=np.float64).reshape(1, -1))
    return acc.entry(size_class)


class Pool:
    """The samples of one (op, bytes) as they are read, without keeping them: each distinct draw (a table row's
    mean and spread, or a call's duration) once, with how many times it was read. A sweep appended run after run
    costs one entry per distinct row, not 1000 samples per row; ``pool * ratio`` scales every sample (re-targeting)
    without copying."""

    __slots__ = ("draws", "scale")

    def __init__(self, draws: dict | None = None, scale: float = 1.0):
        # (mean ns, p99/p50, lo ns, hi ns, points) -> times read
        self.draws: dict[tuple[float, float, float | None, float | None, int], int] = {} if draws is None else draws
        self.scale = scale

    def add(self, mean_ns: float, spread: Spread | None = None, weight: int = SPREAD_WEIGHT) -> None:
        """One row's mean spread into ``weight`` points (``spread`` None: one call of ``mean_ns``, one point)."""
        key = (
            (float(mean_ns), 1.0, None, None, 1)
            if spread is None
            else (float(mean_ns), spread.p99_over_p50, spread.lo, spread.hi, weight)
        )
        self.draws[key] = self.draws.get(key, 0) + 1

    def add_array(self, samples: np.ndarray) -> None:
        """Each sample of ``samples`` as one call."""
        values, times = np.unique(np.asarray(samples, dtype=np.float64), return_counts=True)
        for v, t in zip(values.tolist(), times.tolist()):
            key = (v, 1.0, None, None, 1)
            self.draws[key] = self.draws.get(key, 0) + t

    def __mul__(self, ratio: float) -> Pool:
        return Pool(self.draws, self.scale * float(ratio))

    def __len__(self) -> int:
        return sum(key[4] * t for key, t in self.draws.items())

    def arrays(self):
        """(samples, times read) per distinct draw, scaled."""
        for (mean, ratio, lo, hi, weight), times in self.draws.items():
            x = spread_samples(mean, Spread(ratio, lo, hi), weight) if weight > 1 else np.array([mean])
            yield (x * self.scale if self.scale != 1.0 else x), times

    def samples(self) -> np.ndarray:
        """Every sample (for small pools and tests: memory grows with the draws read)."""
        parts = [np.tile(x, t) for x, t in self.arrays()]
        return np.concatenate(parts) if parts else np.zeros(0)


class Pools(list):
    """Several pools read as one (the parts of one (op, bytes) from several tables or sources)."""

    def __mul__(self, ratio: float) -> Pools:  # type: ignore[override]
        return Pools(p * ratio for p in self)

    def samples(self) -> np.ndarray:
        parts = [p.samples() if isinstance(p, Pool) else np.asarray(p) for p in self]
        return np.concatenate(parts) if parts else np.zeros(0)


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
