"""Per-call records (``delaycomm-percall/1``): reading them, and every figure derived from their block times.

A record holds each run's raw block times (:func:`delaycomm.bench.percall_engine.measure`); the table, the gate
and the GPU check's report all derive their numbers from them with :func:`rows`, whether the record was just
measured or read back (``--from-json``).
"""

from __future__ import annotations

import statistics
from typing import Any

from delaycomm._tools.output import read_json

__all__ = ["FORMAT", "PercallFileError", "load", "run_stats", "rows"]

FORMAT = "delaycomm-percall/1"


class PercallFileError(ValueError):
    """A file that is not a readable per-call record (the message names the file and what is wrong)."""


def load(path: str) -> dict[str, Any]:
    """Read a per-call record.

    Raises:
        PercallFileError: no such file, not JSON, or not a per-call record with runs.
    """
    rec = read_json(path, PercallFileError)
    if not isinstance(rec, dict) or rec.get("format") != FORMAT or not rec.get("runs"):
        raise PercallFileError(f"{path}: not a per-call record ('format' must be {FORMAT!r}, with runs)")
    return rec


def _median(xs):
    return statistics.median(xs) if xs else None


def run_stats(item: dict[str, Any]) -> dict[str, float]:
    """One run's figures for one (size, path): medians over its pairs."""
    pairs = list(zip(item["raw_cpu_us"], item["dc_cpu_us"], item["raw_wall_us"], item["dc_wall_us"]))
    return {
        "raw_cpu_us": _median([p[0] for p in pairs]),
        "dc_cpu_us": _median([p[1] for p in pairs]),
        "added_cpu_us": _median([p[1] - p[0] for p in pairs]),
        "ratio_cpu": _median([p[1] / p[0] for p in pairs if p[0] > 0]),
        "raw_wall_us": _median([p[2] for p in pairs]),
        "added_wall_us": _median([p[3] - p[2] for p in pairs]),
        "ratio_wall": _median([p[3] / p[2] for p in pairs if p[2] > 0]),
    }


def rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (size, path): the median over runs of each run's figures, and the per-run values (``run_<figure>``)."""
    keyed: dict[tuple[int, str], list[dict[str, float]]] = {}
    for run in record["runs"]:
        for it in run["items"]:
            keyed.setdefault((it["size_bytes"], it["path"]), []).append(run_stats(it))
    out = []
    for (size, path), per_run in keyed.items():
        row = {"size_bytes": size, "path": path}
        for k in per_run[0]:
            row[k] = _median([r[k] for r in per_run])
            row[f"run_{k}"] = [r[k] for r in per_run]
        out.append(row)
    return out
