"""From the records of a multi-seed study to statistics: per config and metric the mean and its 95% interval, the
paired comparison with the baseline and its verdict (:mod:`delaycomm.experiment.stats`); the tables, the JSON and
the plot (metric per config with interval bars, curves per config with an interval band).

Only ``ok`` runs count. A metric a run did not report is missing for that seed (its n says so). The delaycomm
columns (delayed calls, stale:fresh, dropped) describe what each config did; they get intervals, not verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from delaycomm._tools.table import Column, format_rows
from delaycomm.experiment import stats as st

__all__ = ["analyze", "format_stats", "format_delaycomm", "format_errors", "plot_study", "TELEMETRY"]

# The delaycomm columns: (name, how to read it from a record's "delaycomm" block)
TELEMETRY = (
    ("delayed_calls", lambda d: d.get("delayed_calls")),
    ("slowed_calls", lambda d: d.get("slowed_calls")),
    ("stale_fresh_ratio", lambda d: (d.get("staleness") or {}).get("stale_fresh_ratio")),
    ("stale", lambda d: (d.get("staleness") or {}).get("stale")),
    ("dropped", lambda d: (d.get("staleness") or {}).get("dropped")),
    ("engine_update_deviation", lambda d: (d.get("update") or {}).get("deviation")),
    ("engine_update_scale", lambda d: (d.get("update") or {}).get("scale")),
)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _curve_band(runs: list[list[list[float]]]) -> dict[str, list] | None:
    """Mean and t interval per step over the runs' curves, at the steps every run has."""
    if not runs:
        return None
    common = sorted(set.intersection(*[{int(s) for s, _ in r} for r in runs]))
    if not common:
        return None
    by_run = [{int(s): v for s, v in r} for r in runs]
    mean, lo, hi = [], [], []
    for s in common:
        iv = st.interval([r[s] for r in by_run])
        mean.append(iv["mean"])
        lo.append(iv["lo"] if iv["lo"] is not None else iv["mean"])
        hi.append(iv["hi"] if iv["hi"] is not None else iv["mean"])
    return {"step": common, "mean": mean, "lo": lo, "hi": hi, "n": len(runs)}


def analyze(
    records: Sequence[dict[str, Any]],
    configs: Sequence[str],
    baseline: str,
    lower: Sequence[str] = (),
    higher: Sequence[str] = (),
) -> dict[str, Any]:
    """The statistics of a study.

    Args:
        records: one per (config, seed), as :func:`delaycomm.experiment.study.run_study` returns them.
        configs: the configs in table order (the baseline among them).
        baseline: the config every other one is compared with, paired by seed.
        lower, higher: metrics the user declared lower- or higher-is-better (else by name:
            :func:`delaycomm.experiment.stats.direction`).

    Returns:
        ``{"baseline", "confidence", "metrics": {name: direction}, "configs": [{"name", "runs", "ok",
        "errors": [...], "metrics": {name: interval}, "vs_baseline": {name: paired}, "delaycomm": {...},
        "curves": {name: band}}]}``.
    """
    by_config: dict[str, list[dict]] = {c: [] for c in configs}
    for rec in records:
        by_config.setdefault(rec["config"], []).append(rec)
    names: list[str] = []
    for rec in records:
        if rec["status"] == "ok":
            names += [m for m in rec["metrics"] if m not in names]
    values = {
        c: {
            m: {r["seed"]: r["metrics"][m] for r in rs if r["status"] == "ok" and _finite(r["metrics"].get(m))}
            for m in names
        }
        for c, rs in by_config.items()
    }
    dirs = {m: st.direction(m, lower, higher) for m in names}
    out_configs = []
    for c in configs:
        rs = by_config.get(c, [])
        ok = [r for r in rs if r["status"] == "ok"]
        entry: dict[str, Any] = {
            "name": c,
            "runs": len(rs),
            "ok": len(ok),
            "errors": [{"seed": r["seed"], "status": r["status"], "message": r["message"]} for r in rs if r not in ok],
            "metrics": {m: st.interval([values[c][m][s] for s in sorted(values[c][m])]) for m in names},
            "vs_baseline": {},
            "delaycomm": {},
            "curves": {},
        }
        if c != baseline and baseline in values:
            entry["vs_baseline"] = {m: st.paired(values[c][m], values[baseline][m], dirs[m]) for m in names}
        for key, read in TELEMETRY:
            vals = [read(r["delaycomm"]) for r in ok if r.get("delaycomm")]
            vals = [v for v in vals if _finite(v)]
            if vals:
                entry["delaycomm"][key] = st.interval(vals)
        curve_names = sorted({k for r in ok for k in r.get("curves", {})})
        for k in curve_names:
            band = _curve_band([r["curves"][k] for r in ok if r.get("curves", {}).get(k)])
            if band:
                entry["curves"][k] = band
        out_configs.append(entry)
    return {"baseline": baseline, "confidence": st.CONFIDENCE, "metrics": dirs, "configs": out_configs}


def _g(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}"


_STATS_COLUMNS = (
    Column("config", align="<", width=10),
    Column("metric", align="<", width=12),
    Column("better", align="<"),
    Column("n"),
    Column("mean", width=9),
    Column("+-95%", width=8),
    Column("diff vs base", width=12),
    Column("diff 95% CI", width=20),
    Column("verdict", align="<"),
)


def format_stats(doc: dict[str, Any], header: Sequence[str] = ()) -> str:
    """The statistics table: one row per config and metric."""
    rows = []
    base = doc["baseline"]
    for c in doc["configs"]:
        for m, how in doc["metrics"].items():
            iv = c["metrics"][m]
            if iv["n"] == 0:
                continue
            p = c["vs_baseline"].get(m)
            if c["name"] == base:
                diff, ci, verdict = "-", "-", "(baseline)"
            elif p is None or p["n"] == 0:
                diff, ci, verdict = "-", "-", "no paired seed"
            else:
                diff = _g(p["mean"])
                ci = "-" if p["lo"] is None else f"[{_g(p['lo'])}, {_g(p['hi'])}]"
                verdict = p["verdict"]
            rows.append([c["name"], m, how, str(iv["n"]), _g(iv["mean"]), _g(iv["half"]), diff, ci, verdict])
    return format_rows(_STATS_COLUMNS, rows, header)


_TEL_COLUMNS = (
    Column("config", align="<", width=10),
    Column("runs ok"),
    Column("delayed", "calls"),
    Column("slowed", "calls"),
    Column("stale:fresh", width=11),
    Column("+-95%"),
    Column("stale"),
    Column("dropped"),
)


def format_delaycomm(doc: dict[str, Any]) -> str:
    """What delaycomm did per config (means over the ok runs; ``-``: no delaycomm telemetry)."""
    rows = []
    for c in doc["configs"]:
        d = c["delaycomm"]

        def mean(key: str, d: dict = d) -> str:
            return _g(d[key]["mean"]) if key in d else "-"

        ratio = d.get("stale_fresh_ratio")
        rows.append(
            [
                c["name"],
                f"{c['ok']}/{c['runs']}",
                mean("delayed_calls"),
                mean("slowed_calls"),
                mean("stale_fresh_ratio"),
                _g(ratio["half"]) if ratio else "-",
                mean("stale"),
                mean("dropped"),
            ]
        )
    return format_rows(_TEL_COLUMNS, rows)


def format_errors(records: Sequence[dict[str, Any]]) -> list[str]:
    """One ``#`` line per run that did not end ``ok``, with why."""
    return [f"# {r['config']} seed {r['seed']}: {r['status']}: {r['message']}" for r in records if r["status"] != "ok"]


def plot_study(doc: dict[str, Any], path: str, title: str, metrics: Sequence[str] | None = None) -> None:
    """One panel per metric (mean and 95% interval per config) and one per curve (mean and band per config)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(metrics) if metrics is not None else list(doc["metrics"])
    curves = sorted({k for c in doc["configs"] for k in c["curves"]})
    panels = len(names) + len(curves)
    cols = min(3, max(1, panels))
    rows = max(1, math.ceil(panels / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    flat = list(axes.flat)
    labels = [c["name"] for c in doc["configs"]]
    for ax, m in zip(flat, names):
        means = [c["metrics"].get(m, {}).get("mean") for c in doc["configs"]]
        halves = [c["metrics"].get(m, {}).get("half") or 0.0 for c in doc["configs"]]
        xs = [i for i, v in enumerate(means) if v is not None]
        ax.errorbar(xs, [means[i] for i in xs], yerr=[halves[i] for i in xs], fmt="o", capsize=4)
        ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{m} ({doc['metrics'][m]} is better)", fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax, k in zip(flat[len(names) :], curves):
        for c in doc["configs"]:
            band = c["curves"].get(k)
            if not band:
                continue
            (line,) = ax.plot(band["step"], band["mean"], lw=1.1, label=c["name"])
            ax.fill_between(band["step"], band["lo"], band["hi"], color=line.get_color(), alpha=0.2, lw=0)
        ax.set(xlabel="step", title=f"{k}: mean over seeds, 95% band")
        ax.title.set_fontsize(9)
        if k.endswith("loss") and all(v > 0 for c in doc["configs"] for v in c["curves"].get(k, {}).get("lo", [1])):
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in flat[panels:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def downsample(curve: Sequence[Sequence[float]], points: int = 400) -> list[list[float]]:
    """At most ``points`` of a curve, evenly spaced by index (the last point kept)."""
    if len(curve) <= points:
        return [list(p) for p in curve]
    idx = np.unique(np.linspace(0, len(curve) - 1, points).round().astype(int))
    return [list(curve[i]) for i in idx]
