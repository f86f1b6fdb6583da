"""What ``stale_check=1`` costs (docs/staleness.md, "The check (stale_check)").

A DDP training step of a float32 MLP (``--width`` wide, 4 layers, batch 64) with GradScaler, on the real backend
with one rank (world size 1: the engine, the check and their passes run as with many; no peer to wait for) under
``ssp:2``, ``stale_policy=apply``, ``const:5ms`` on 30% of the calls. Each configuration runs in a fresh process
(the check's optimizer hooks are process-wide): off, on, off, on, ... ``--rounds`` times. Per process: the median
wall time of the steps after ``--warmup``, and the wall time of the final flush. Prints the medians per
configuration and the ratio on / off; ``--json`` writes every process's figures.

    .venv/bin/python bench/stale_check_cost.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _worker(width: int, steps: int, warmup: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import delaycomm

    dist.init_process_group("delaycomm", rank=0, world_size=1)
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", growth_interval=4)
    x, y = torch.randn(64, width), torch.randn(64, width)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(ddp(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        times.append(time.perf_counter() - t0)
    opt.zero_grad()
    t0 = time.perf_counter()
    result = delaycomm.flush(into_grad=True)
    flush_s = time.perf_counter() - t0
    if result.grads:
        scaler.step(opt)
    stale = delaycomm.stats(dist.group.WORLD)["staleness"]["stale"]
    dist.destroy_process_group()
    params = sum(p.numel() for p in model.parameters())
    return {"step_s": statistics.median(times[warmup:]), "flush_s": flush_s, "stale": stale, "params": params}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.width, args.steps, args.warmup)))
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_")}
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29533",
        DELAYCOMM_STALENESS="ssp:2",
        DELAYCOMM_STALE_POLICY="apply",
        DELAYCOMM_DELAY="const:5ms",
        DELAYCOMM_DELAY_FRACTION="0.3",
        OMP_NUM_THREADS="1",
    )
    runs = []
    for r in range(args.rounds):
        for check in ("0", "1"):
            cmd = [sys.executable, __file__, "--worker", "--width", str(args.width), "--steps", str(args.steps)]
            cmd += ["--warmup", str(args.warmup)]
            out = subprocess.run(cmd, env={**env, "DELAYCOMM_STALE_CHECK": check}, capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            fig = json.loads(out.stdout.strip().splitlines()[-1])
            fig.update(check=check, round=r)
            runs.append(fig)
            print(
                f"round {r} stale_check={check}: step {fig['step_s'] * 1e3:.2f} ms, "
                f"flush {fig['flush_s'] * 1e3:.1f} ms, "
                f"{fig['stale']} stale contributions, {fig['params']} parameters",
                flush=True,
            )
    med = {
        c: {k: statistics.median(f[k] for f in runs if f["check"] == c) for k in ("step_s", "flush_s")} for c in "01"
    }
    print(
        f"median step: off {med['0']['step_s'] * 1e3:.2f} ms, on {med['1']['step_s'] * 1e3:.2f} ms, "
        f"ratio {med['1']['step_s'] / med['0']['step_s']:.3f}; flush: off {med['0']['flush_s'] * 1e3:.1f} ms, "
        f"on {med['1']['flush_s'] * 1e3:.1f} ms"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "median": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
