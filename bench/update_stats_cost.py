"""What ``update_stats=1`` adds per stale step (docs/telemetry.md, "Update statistics").

One process, world size 1, the real backend: two delaycomm groups with the same staleness settings (``ssp:4``,
``const:5ms`` on 30% of the contributions, ``step_ms`` 2: a late contribution is 3 steps late, no gate wait), one
with ``update_stats`` off (the default) and one with it on, each reducing a float32 bucket with
``delaycomm.stale_allreduce``. Blocks of ``--calls`` calls alternate between the groups (off first, then on first,
...); a block's cost per call is its wall time and its process CPU time over ``--calls``. Prints the median per
size and group, and the ratio on / off; ``--json`` writes every block. ``--off-only``: only the default group (for
a checkout without the option, to compare the engine's default path side by side).

    .venv/bin/python bench/update_stats_cost.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import delaycomm

STALE = dict(staleness="ssp:4", delay="const:5ms", delay_fraction=0.3, step_ms=2.0, seed=0)


def _block(group, t: torch.Tensor, key: int, calls: int) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        delaycomm.stale_allreduce(t, key=key, group=group)
    return (time.perf_counter() - w0) / calls, (time.process_time() - c0) / calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1024,1048576", help="bucket sizes in float32 elements (default 1024,1048576)")
    p.add_argument("--calls", type=int, default=200, help="calls per block (default 200)")
    p.add_argument("--blocks", type=int, default=15, help="blocks per group and size (default 15)")
    p.add_argument("--off-only", action="store_true", help="only the default group (update_stats off)")
    p.add_argument("--json", default=None, metavar="FILE")
    a = p.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    torch.set_num_threads(1)
    store = dist.HashStore()
    dist.init_process_group(
        "delaycomm", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60),
        pg_options=delaycomm.DelayConfig(**STALE),
    )  # fmt: skip
    groups = {"off": dist.group.WORLD}
    if not a.off_only:
        groups["on"] = dist.new_group([0], pg_options=delaycomm.DelayConfig(update_stats=True, **STALE))
    load0 = os.getloadavg()
    blocks: dict[str, dict[str, list]] = {}
    for size in sizes:
        t = torch.randn(size)
        for name, g in groups.items():
            _block(g, t, size, a.calls)  # warm-up (step_ms is fixed: no calibration)
            blocks[f"{size}/{name}"] = {"wall_s": [], "cpu_s": []}
        order = list(groups)
        for b in range(a.blocks):
            for name in order if b % 2 == 0 else order[::-1]:
                wall, cpu = _block(groups[name], t, size, a.calls)
                blocks[f"{size}/{name}"]["wall_s"].append(wall)
                blocks[f"{size}/{name}"]["cpu_s"].append(cpu)
    summary = {k: {m: statistics.median(v) for m, v in b.items()} for k, b in blocks.items()}
    print(f"# update_stats cost per stale step, world size 1, load {load0} -> {os.getloadavg()}")
    print(f"# {'bucket':>10} {'group':<5} {'wall (us)':>10} {'cpu (us)':>10} {'on/off wall':>12}")
    for size in sizes:
        for name in groups:
            s = summary[f"{size}/{name}"]
            ratio = s["wall_s"] / summary[f"{size}/off"]["wall_s"] if name == "on" else None
            print(
                f"  {size:>10} {name:<5} {s['wall_s'] * 1e6:>10.1f} {s['cpu_s'] * 1e6:>10.1f} "
                f"{'' if ratio is None else f'{ratio:.2f}x':>12}"
            )
    if a.json:
        up = {k: v.get("update") for k, v in ((n, delaycomm.stats(g)["staleness"]) for n, g in groups.items())}
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "tool": "bench/update_stats_cost.py",
                    "argv": sys.argv,
                    "settings": {**STALE, "calls": a.calls, "blocks": a.blocks, "sizes": sizes},
                    "loadavg_start": load0,
                    "loadavg_end": os.getloadavg(),
                    "torch": torch.__version__,
                    "median": summary,
                    "blocks": blocks,
                    "update_stats": up,
                },
                f,
                indent=1,
            )
    for g in groups.values():
        delaycomm.flush(g)  # deliver what is still deferred before the groups end
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
