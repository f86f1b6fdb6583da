"""The claims' outputs: the claims table (the one docs/claims.md commits), the per-config context table, a slim
JSON form of the statistics and the plot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from delaycomm._tools.table import Column, format_rows
from delaycomm.experiment.analysis import downsample

__all__ = ["format_claims", "format_context", "slim", "plot_claims", "markdown_claims", "SEED_DOC"]

# Seed 000 as the repository names it (relative to the repository's root: the checkout sits beside shared/).
SEED_DOC = "../shared/seeds/000_*.txt"

CONTEXT_METRICS = (
    "update_noise_ratio",
    "effective_lr",
    "oscillation",
    "oscillation_2epochs",
    "final_train_loss",
    "test_loss",
    "test_accuracy",
    "test_r2",
)


def format_claims(rows: Sequence[dict]) -> str:
    """One ``#`` block per claim and task: the claim, the setting, the measured numbers, the verdict."""
    lines = [f"# seed 000's claims ({SEED_DOC}; docs/claims.md): mean ± 95% t interval over the paired seeds"]
    for r in rows:
        lines.append(f"# [{r['verdict']}] {r['claim']} ({r['task']})")
        lines.append(f"#     setting: {r['setting']}")
        lines.append(f"#     measured: {r['measured']}")
    return "\n".join(lines)


def markdown_claims(rows: Sequence[dict]) -> str:
    """The table of docs/claims.md: claim | where seed 000 says it | task | setting | measured | verdict."""
    out = ["| claim | where seed 000 says it | task | setting | measured (mean ± 95% CI) | verdict |", "|---" * 6 + "|"]
    for r in rows:
        cells = [r["claim"], r["where"], r["task"], r["setting"], r["measured"], f"**{r['verdict']}**"]
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(out)


def _cell(iv: dict | None) -> str:
    if not iv or iv.get("mean") is None:
        return "-"
    return f"{iv['mean']:.4g}" + (f" ±{iv['half']:.2g}" if iv.get("half") is not None else "")


def format_context(task: str, analysis: dict[str, Any]) -> str:
    """Per config of ``task``: stale:fresh and each context metric, mean ± 95% half-width."""
    metrics = [m for m in CONTEXT_METRICS if m in analysis["metrics"]]
    columns = [Column("config", align="<", width=9), Column("stale:fresh", width=11)]
    columns += [Column(m.replace("_", " "), width=12) for m in metrics]
    rows = []
    for c in analysis["configs"]:
        rows.append(
            [c["name"], _cell(c["delaycomm"].get("stale_fresh_ratio"))] + [_cell(c["metrics"].get(m)) for m in metrics]
        )
    return format_rows(columns, rows, [f"{task}: what each config did (mean ±95% half-width over seeds)"])


def slim(analysis: dict[str, Any], points: int = 100) -> dict[str, Any]:
    """The statistics with each curve band cut to ``points`` points (for a small committed JSON)."""
    out = {**analysis, "configs": []}
    for c in analysis["configs"]:
        curves = {}
        for k, band in c["curves"].items():
            rows = list(zip(band["step"], band["mean"], band["lo"], band["hi"]))
            cut = downsample(rows, points)
            curves[k] = {
                "step": [r[0] for r in cut],
                "mean": [r[1] for r in cut],
                "lo": [r[2] for r in cut],
                "hi": [r[3] for r in cut],
                "n": band["n"],
            }
        out["configs"].append({**c, "curves": curves})
    return out


def plot_claims(analyses: dict[str, dict], rows: Sequence[dict], path: str) -> None:
    """Per task: the full training loss per config (mean and 95% band over seeds), and the update noise and the
    oscillation per config with their intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(analyses)
    fig, axes = plt.subplots(len(tasks), 3, figsize=(17, 4.4 * len(tasks)), squeeze=False)
    for row, task in zip(axes, tasks):
        a = analyses[task]
        for c in a["configs"]:
            band = c["curves"].get("full_loss")
            if band:
                (line,) = row[0].plot(band["step"], band["mean"], lw=1.0, label=c["name"])
                row[0].fill_between(band["step"], band["lo"], band["hi"], color=line.get_color(), alpha=0.15, lw=0)
        row[0].set(xlabel="step", ylabel="training loss (whole set)", yscale="log", title=f"{task}: loss per config")
        row[0].legend(fontsize=7, ncol=2)
        for ax, m in zip(row[1:], ("update_noise_ratio", "oscillation")):
            names = [c["name"] for c in a["configs"]]
            ivs = [c["metrics"].get(m, {}) for c in a["configs"]]
            xs = [i for i, iv in enumerate(ivs) if iv.get("mean") is not None]
            ax.errorbar(
                xs, [ivs[i]["mean"] for i in xs], yerr=[ivs[i].get("half") or 0 for i in xs], fmt="o", capsize=4
            )
            ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
            ax.set_title(f"{task}: {m} (mean, 95% interval)", fontsize=9)
        for ax in row:
            ax.grid(True, alpha=0.3)
            ax.title.set_fontsize(9)
    verdicts = ", ".join(f"{r['key']} ({r['task']}): {r['verdict']}" for r in rows if r["task"] != "-")
    fig.suptitle("delaycomm.experiment claims: " + verdicts, fontsize=8, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
