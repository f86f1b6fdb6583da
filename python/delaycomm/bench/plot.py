"""``--plot FILE.png``: latency and bus bandwidth against size, one line per backend, log axes."""

from __future__ import annotations

from typing import Any

from delaycomm.bench.results import row_stats
from delaycomm.bench.units import format_size

__all__ = ["plot", "PLOT_EXTENSIONS"]

PLOT_EXTENSIONS = (".png", ".svg", ".pdf")


def plot(record: dict[str, Any], path: str) -> None:
    """Write the figure: for each collective, p50 latency (band up to p99) and busbw against size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    stats = row_stats(record)
    colls = list(dict.fromkeys(r.collective for r in stats))
    labels = [b["label"] for b in record["settings"]["backends"]]
    fig, axes = plt.subplots(len(colls), 2, figsize=(12, 4.2 * len(colls)), squeeze=False)
    size_fmt = FuncFormatter(lambda x, _: format_size(int(x)) if x >= 1 else "")
    for i, coll in enumerate(colls):
        lat, bw = axes[i]
        for label in labels:
            rows = sorted((r for r in stats if r.collective == coll and r.backend == label), key=lambda r: r.size_bytes)
            if not rows:
                continue
            x = [r.size_bytes for r in rows]
            (line,) = lat.plot(x, [r.p50_us for r in rows], marker="o", ms=3, label=f"{label} p50")
            lat.fill_between(
                x,
                [r.p50_us for r in rows],
                [r.p99_us for r in rows],
                color=line.get_color(),
                alpha=0.15,
                label=f"{label} p50-p99",
            )
            bw.plot(x, [r.busbw_GBps for r in rows], marker="o", ms=3, color=line.get_color(), label=label)
        for ax, ylabel in ((lat, "time per call (us, max over ranks)"), (bw, "busbw (GB/s)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(size_fmt)
            ax.set_xlabel("size")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        lat.set_title(f"{coll}: latency")
        bw.set_title(f"{coll}: bus bandwidth")
    env = record.get("environment", {})
    s = record["settings"]
    fig.suptitle(
        f"delaycomm bench: {record['world_size']} ranks, {s.get('device')}, {s.get('dtype')}, "
        f"torch {env.get('torch', '?')}, {env.get('machine', {}).get('cpu', '')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
