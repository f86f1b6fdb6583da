"""Turns what the ranks measured into one summary per config, a table, JSON and a plot.

Measuring is the runner's job; everything here is arithmetic on its output. How ranks are combined:

- a step's time is the slowest rank's time for that step (the step is done when every rank is); P50/P99 are over
  steps. Wall clock is the slowest rank's, from the barrier after setup to its last step.
- the training loss of a step is the mean over ranks of their batch losses (each rank trains on its own shard).
- allreduce latency P50/P99 come from delaycomm's histograms (issue to completion, per rank); the table shows the
  rank where they are highest. The raw gloo reference has no such telemetry ("-").
- delayed and slowed calls are summed over ranks; the slowdown's wait is the largest total over ranks.
- staleness counts are the group's (equal on every rank: all derive them from the shared schedule); stale:fresh is
  stale arrivals over fresh contributions; SSP blocked time is the largest over ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from delaycomm._tools.table import Column
from delaycomm._tools.table import format_table as format_table_rows
from delaycomm.experiment.configs import ExperimentConfig, effect_problems
from delaycomm.experiment.probe import summarize_probe

__all__ = ["summarize", "telemetry", "format_table", "columns_for", "plot", "COLUMNS"]


def _staleness(blocks: Sequence[dict | None]) -> dict[str, Any] | None:
    """The group's staleness counts. Every rank derives who is fresh and who is late from the shared schedule, so
    the counts are the group's and equal on every rank: they are taken from rank 0. Blocked time is per rank: the
    largest is kept."""
    if not blocks or not blocks[0] or not blocks[0].get("steps"):
        return None
    b = blocks[0]
    return {
        "steps": b["steps"],
        "fresh": b["fresh"],
        "stale": b["stale"],
        "dropped": b["dropped"],
        "stale_fresh_ratio": b["stale"] / b["fresh"] if b["fresh"] else None,
        "staleness_mean_steps": b["staleness"]["mean"] if b["staleness"]["count"] else 0.0,
        "staleness_max_steps": b["staleness"]["max"] if b["staleness"]["count"] else 0.0,
        "blocked_ms": max(x["blocked_ms"] for x in blocks if x),
    }


def telemetry(stats: Sequence[dict]) -> dict[str, Any]:
    """What delaycomm measured in a run, from each rank's ``delaycomm.stats()`` (or stats file), by rank: the
    all-reduce's calls and latency, delayed and slowed calls, and the staleness counts (module docstring)."""
    ops = [s.get("ops", {}) for s in stats]
    ar = [o.get("allreduce") for o in ops]
    ar = [a for a in ar if a]
    slow = [s.get("slowdown") or {} for s in stats]
    return {
        "allreduce_calls": sum(a["calls"] for a in ar),
        "allreduce_p50_ms": max(a["latency"]["p50_us"] for a in ar) * 1e-3 if ar else None,
        "allreduce_p99_ms": max(a["latency"]["p99_us"] for a in ar) * 1e-3 if ar else None,
        "delayed_calls": sum(op.get("delayed_calls", 0) for o in ops for op in o.values()),
        "slowed_calls": sum(b.get("calls", 0) for b in slow),
        # total time the slowdown made the callers wait: mean x count per rank, the largest over ranks
        "slowdown_wait_s": max(
            (b["blocked"]["mean_ms"] * b["blocked"]["count"] * 1e-3 for b in slow if b.get("blocked")), default=0.0
        ),
        "staleness": _staleness([s.get("staleness") for s in stats]),
        "update": _update([(s.get("staleness") or {}).get("update") for s in stats]),
    }


def _update(blocks: Sequence[dict | None]) -> dict[str, Any] | None:
    """The engine's opt-in update statistics (update_stats=1), summed over ranks: each rank's contribution against
    its BSP one (docs/telemetry.md, "Update statistics"); None when off."""
    on = [b for b in blocks if b and b.get("enabled")]
    if not on:
        return None
    fresh = sum(b["fresh_sq"] for b in on)
    steps = sum(b["steps"] for b in on)
    scales = [b["scale"] for b in on if b.get("scale") is not None]
    return {
        "steps": steps,
        "deviation": sum(b["deviation_sq"] for b in on) / fresh if fresh > 0 else None,
        "scale": sum(scales) / len(scales) if scales else None,
    }


def summarize(
    config: ExperimentConfig, run: dict[str, Any], lr: float = 0.0, oscillation_steps: int = 200
) -> dict[str, Any]:
    """One config's record: what it was, its status and, when it ran, its metrics and curves.

    ``lr`` and ``oscillation_steps`` are for the update probe's metrics, when the ranks ran it
    (:func:`delaycomm.experiment.probe.summarize_probe`).
    """
    out: dict[str, Any] = {
        "name": config.name,
        "backend": config.backend,
        "description": config.description,
        "options": run["options"],
        "status": run["status"],
        "message": run["message"],
        "startup_s": run.get("startup_s"),
    }
    ranks = run["ranks"]
    if run["status"] != "ok":
        return out
    problems = effect_problems(config.backend, run["options"], [r.get("stats") or {} for r in ranks])
    if problems:
        out["status"] = "unavailable"
        out["message"] = "not in effect in this build: " + "; ".join(problems)
    r0 = ranks[0]
    n = min(len(r["losses"]) for r in ranks)
    step_s = np.max([r["step_s"][:n] for r in ranks], axis=0)
    wall_s = max(r["wall_s"] for r in ranks)
    score = "test_r2" if r0.get("task_kind") == "regression" else "test_accuracy"
    metrics: dict[str, Any] = {
        score: r0[score],
        "test_loss": r0["test_loss"],
        score.replace("test_", "train_"): r0[score.replace("test_", "train_")],
        "initial_train_loss": r0["initial_train_loss"],
        "final_train_loss": r0["final_train_loss"],
        "loss_fell": r0["final_train_loss"] < r0["initial_train_loss"],
        "pending_keys_at_end": r0.get("pending_keys_at_end", 0),
        "steps": n,
        "epochs": len(r0["epochs"]),
        "stopped_by_budget": r0["stopped_by_budget"],
        "wall_s": wall_s,
        "cpu_s": sum(r.get("cpu_s", 0.0) for r in ranks),
        "steps_per_s": n / wall_s if wall_s > 0 else 0.0,
        "step_p50_ms": float(np.percentile(step_s, 50)) * 1e3 if n else None,
        "step_p99_ms": float(np.percentile(step_s, 99)) * 1e3 if n else None,
    }
    if config.backend == "delaycomm":
        metrics.update(telemetry([r.get("stats") or {} for r in ranks]))
    if r0.get("probe") is not None:
        metrics.update(summarize_probe(r0["probe"], lr, oscillation_steps, r0["steps_per_epoch"]))
    out["metrics"] = metrics
    out["curves"] = {
        "step": list(range(1, n + 1)),
        "t_s": np.max([r["end_s"][:n] for r in ranks], axis=0).tolist(),
        "loss": np.mean([r["losses"][:n] for r in ranks], axis=0).tolist(),
    }
    if r0.get("probe") is not None:
        out["curves"]["full_loss"] = r0["probe"]["full_loss"][:n]
    out["epochs"] = r0["epochs"]
    out["ranks"] = [
        {k: v for k, v in r.items() if k not in ("losses", "step_s", "end_s", "epochs", "probe")} for r in ranks
    ]
    return out


def _m(key: str) -> Callable[[dict], Any]:
    return lambda rec: rec.get("metrics", {}).get(key)


def _st(key: str) -> Callable[[dict], Any]:
    return lambda rec: (rec.get("metrics", {}).get("staleness") or {}).get(key)


def _ok(value: Callable[[dict], Any]) -> Callable[[dict], Any]:
    """A config that did not run as asked shows no numbers (its record in --json keeps what was measured)."""
    return lambda rec: value(rec) if rec["status"] == "ok" else None


def _pct(rec: dict) -> Any:
    v = rec.get("metrics", {}).get("test_accuracy")
    return None if v is None else 100.0 * v


COLUMNS: tuple[Column, ...] = (
    Column("config", "", lambda rec: rec["name"], width=11, align="<"),
    Column("status", "", lambda rec: rec["status"], width=11, align="<"),
    Column("test acc", "%", _ok(_pct), "{:.1f}", 8),
    Column("loss 0", "", _ok(_m("initial_train_loss")), "{:.3f}", 7),
    Column("loss end", "", _ok(_m("final_train_loss")), "{:.4f}", 8),
    Column("wall", "s", _ok(_m("wall_s")), "{:.2f}", 7),
    Column("steps", "", _ok(_m("steps")), width=6),
    Column("steps/s", "1/s", _ok(_m("steps_per_s")), "{:.1f}", 8),
    Column("step p50", "ms", _ok(_m("step_p50_ms")), "{:.2f}", 8),
    Column("step p99", "ms", _ok(_m("step_p99_ms")), "{:.2f}", 8),
    Column("ar p50", "ms", _ok(_m("allreduce_p50_ms")), "{:.2f}", 7),
    Column("ar p99", "ms", _ok(_m("allreduce_p99_ms")), "{:.2f}", 7),
    Column("delayed", "calls", _ok(_m("delayed_calls")), width=7),
    Column("slowed", "calls", _ok(_m("slowed_calls")), width=7),
    Column("stale:fresh", "", _ok(_st("stale_fresh_ratio")), "{:.3f}", 11),
    Column("dropped", "", _ok(_st("dropped")), width=7),
    Column("stl mean", "steps", _ok(_st("staleness_mean_steps")), "{:.2f}", 8),
    Column("stl max", "steps", _ok(_st("staleness_max_steps")), "{:.0f}", 7),
)


def columns_for(records: Sequence[dict]) -> tuple[Column, ...]:
    """The table's columns: a regression task shows its test R² where a classification task shows its accuracy."""
    if any("test_r2" in rec.get("metrics", {}) for rec in records):
        return (COLUMNS[0], COLUMNS[1], Column("test R2", "", _ok(_m("test_r2")), "{:.3f}", 8), *COLUMNS[3:])
    return COLUMNS


def format_table(records: Sequence[dict], header_lines: Sequence[str] = ()) -> str:
    """The records as a fixed-column table: ``#`` header lines, column names, units, one row per config, then
    one ``#`` line per config that did not run (with why)."""
    lines = [format_table_rows(columns_for(records), records, header_lines)]
    lines.extend(f"# {rec['name']}: {rec['message']}" for rec in records if rec["message"])
    return "\n".join(lines)


def plot(records: Sequence[dict], path: str, title: str) -> None:
    """Training loss vs step and vs wall clock, and test accuracy vs wall clock, one line per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for rec in records:
        if rec["status"] != "ok" or "curves" not in rec:
            continue
        c = rec["curves"]
        loss = _smooth(np.asarray(c["loss"]), max(1, rec["ranks"][0]["steps_per_epoch"] // 2))
        axes[0].plot(c["step"], loss, label=rec["name"], lw=1.2)
        axes[1].plot(c["t_s"], loss, label=rec["name"], lw=1.2)
        ep = rec["epochs"]
        score = "test_r2" if "test_r2" in ep[0] else "test_accuracy"
        scale = 1.0 if score == "test_r2" else 100.0
        axes[2].plot([e["t_s"] for e in ep], [scale * e[score] for e in ep], marker=".", label=rec["name"], lw=1.2)
        axes[2].set(ylabel="test R2" if score == "test_r2" else "test accuracy (%)")
    axes[0].set(xlabel="step", ylabel="training loss (mean over ranks, smoothed)", yscale="log")
    axes[1].set(xlabel="wall clock (s)", ylabel="training loss", yscale="log")
    axes[2].set(xlabel="wall clock (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[2].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average (the first points average what there is so far)."""
    if window <= 1 or len(x) == 0:
        return x
    c = np.cumsum(np.insert(x, 0, 0.0))
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)
