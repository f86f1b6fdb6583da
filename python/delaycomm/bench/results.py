"""Run records: reading, checking and writing them, and the statistics every report derives from raw times.

A run record (JSON) holds raw per-call times (``times_us[repeat][call]``, each the max over ranks); everything
else (percentiles, bandwidths, ratios) is derived here, by one set of functions, whether the record was just
measured or read back from a file. Written records carry the derived fields too (``p50_us``, ``busbw_GBps``,
``ratio``...) for other tools; on reading they are recomputed from the times.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from delaycomm._tools import output
from delaycomm.bench import collectives

__all__ = ["BenchFileError", "RowStats", "percentile", "row_stats", "load", "save", "check_record", "FORMAT"]

FORMAT = "delaycomm-bench/1"
_ROW_KEYS = ("collective", "size_bytes", "count", "dtype", "redop", "backend", "times_us")


class BenchFileError(ValueError):
    """A file that is not a readable delaycomm bench record (the message names the file and what is wrong)."""


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default).

    With sorted values x[0..m-1], the rank is h = (m - 1) q / 100 and the result x[floor h] + (h - floor h) *
    (x[floor h + 1] - x[floor h]).
    """
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    h = (len(xs) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


@dataclasses.dataclass(frozen=True)
class RowStats:
    """What the reports show for one (collective, size, backend)."""

    collective: str
    size_bytes: int
    count: int
    dtype: str
    redop: str
    backend: str
    p50_us: float
    p99_us: float
    min_us: float
    max_us: float
    mean_us: float
    algbw_GBps: float
    busbw_GBps: float
    repeat_p50_us: tuple[float, ...]
    wrong: int | None
    ratio: float | None = None  # median over repeats of p50(this) / p50(raw) (None for the raw backend)
    repeat_ratios: tuple[float, ...] = ()

    @property
    def spread(self) -> float:
        """(max - min) / median of the per-repeat p50s: how much the repeats disagree."""
        med = statistics.median(self.repeat_p50_us)
        return (max(self.repeat_p50_us) - min(self.repeat_p50_us)) / med if med > 0 else 0.0


def bandwidths(size_bytes: int, time_us: float, collective: str, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second) for one call of ``size_bytes`` taking ``time_us``.

    algbw = size / time; busbw = algbw x the collective's bus factor (docs/benchmark.md derives each factor).
    """
    if time_us <= 0:
        return math.inf, math.inf
    algbw = size_bytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * collectives.get(collective).bus_factor(world_size)


def row_stats(record: dict[str, Any]) -> list[RowStats]:
    """Derive every row's statistics (and its ratio to the raw backend of the same run)."""
    n = int(record["world_size"])
    raw = _raw_label(record)
    by_key = {(r["collective"], r["size_bytes"], r["backend"]): r for r in record["rows"]}
    out = []
    for r in record["rows"]:
        flat = [t for rep in r["times_us"] for t in rep]
        rep_p50 = tuple(percentile(rep, 50) for rep in r["times_us"])
        p50 = percentile(flat, 50)
        algbw, busbw = bandwidths(r["size_bytes"], p50, r["collective"], n)
        ratio, rep_ratios = None, ()
        raw_row = by_key.get((r["collective"], r["size_bytes"], raw)) if raw else None
        if raw_row is not None and r["backend"] != raw:
            raw_p50 = [percentile(rep, 50) for rep in raw_row["times_us"]]
            rep_ratios = tuple(a / b if b > 0 else math.inf for a, b in zip(rep_p50, raw_p50))
            ratio = statistics.median(rep_ratios)
        out.append(
            RowStats(
                collective=r["collective"],
                size_bytes=r["size_bytes"],
                count=r["count"],
                dtype=r["dtype"],
                redop=r["redop"],
                backend=r["backend"],
                p50_us=p50,
                p99_us=percentile(flat, 99),
                min_us=min(flat),
                max_us=max(flat),
                mean_us=statistics.fmean(flat),
                algbw_GBps=algbw,
                busbw_GBps=busbw,
                repeat_p50_us=rep_p50,
                wrong=r.get("wrong"),
                ratio=ratio,
                repeat_ratios=rep_ratios,
            )
        )
    return out


def _raw_label(record: dict[str, Any]) -> str | None:
    for b in record["settings"]["backends"]:
        if b["name"] != "delaycomm":
            return b["label"]
    return None


def raw_label(record: dict[str, Any]) -> str | None:
    """The label of the run's raw reference backend, or None."""
    return _raw_label(record)


def save(record: dict[str, Any], path: str | None) -> str:
    """The record as JSON text, with derived statistics added per row; written to ``path`` unless None or '-'."""
    stats = {(s.collective, s.size_bytes, s.backend): s for s in row_stats(record)}
    out = dict(record)
    out["rows"] = []
    for r in record["rows"]:
        s = stats[(r["collective"], r["size_bytes"], r["backend"])]
        derived = {
            k: _finite(getattr(s, k))
            for k in ("p50_us", "p99_us", "min_us", "max_us", "mean_us", "algbw_GBps", "busbw_GBps", "ratio")
        }
        derived["repeat_p50_us"] = list(s.repeat_p50_us)
        derived["repeat_ratios"] = [_finite(x) for x in s.repeat_ratios]
        out["rows"].append({**r, **derived})
    if path in (None, "-"):
        return output.dumps(out)
    return output.write_json(path, out).rstrip("\n")


def _finite(x):
    if isinstance(x, float):
        return round(x, 6) if math.isfinite(x) else None
    return x


def load(path: str) -> dict[str, Any]:
    """Read and check a run record.

    Raises:
        BenchFileError: the file is missing, not JSON, or not a delaycomm bench record (naming what is wrong).
    """
    record = output.read_json(path, BenchFileError)
    try:
        check_record(record)
    except ValueError as e:
        raise BenchFileError(f"{path}: not a delaycomm bench result: {e}") from None
    return record


def check_record(record: Any) -> None:
    """Raise ValueError naming the first thing that makes ``record`` unusable."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if record.get("format") != FORMAT:
        raise ValueError(f"'format' is {record.get('format')!r}, expected {FORMAT!r}")
    settings = record.get("settings")
    if (
        not isinstance(settings, dict)
        or not isinstance(settings.get("backends"), list)
        or not all(
            isinstance(b, dict) and isinstance(b.get("label"), str) and isinstance(b.get("name"), str)
            for b in settings["backends"]
        )
    ):
        raise ValueError("'settings.backends' must be a list of {label, name, options}")
    if not isinstance(record.get("world_size"), int) or record["world_size"] < 1:
        raise ValueError("'world_size' must be a positive integer")
    rows = record.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError("'rows' must be a non-empty list")
    labels = {b["label"] for b in settings["backends"]}
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or any(k not in r for k in _ROW_KEYS):
            raise ValueError(f"rows[{i}] must hold {', '.join(_ROW_KEYS)}")
        if r["collective"] not in collectives.COLLECTIVES:
            raise ValueError(f"rows[{i}]: unknown collective {r['collective']!r}")
        if r["backend"] not in labels:
            raise ValueError(f"rows[{i}]: backend {r['backend']!r} is not in settings.backends")
        if not isinstance(r["size_bytes"], int) or r["size_bytes"] <= 0:
            raise ValueError(f"rows[{i}]: 'size_bytes' must be a positive integer")
        t = r["times_us"]
        if (
            not isinstance(t, list)
            or not t
            or not all(isinstance(rep, list) and rep for rep in t)
            or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                for rep in t
                for x in rep
            )
        ):
            raise ValueError(f"rows[{i}]: 'times_us' must be a non-empty list of non-empty lists of times >= 0")
