"""A different job replays a recorded job's profile: does it get, per size class, the latency it has in production?

Four jobs, each 2 ranks under torchrun running this file's DDP training script (--worker), configured only by
DELAYCOMM_* variables. Each training step has the DDP bucket all-reduces of its model, a metric all-reduce of the
loss, and a broadcast of 1 KiB from rank 0:

  A-prod    model A (DDP buckets of about 0.5 MB) under the "production" latency with stats files
  profile   python -m delaycomm profile stats-a-prod/*.json -o profile-a.json
  B-prod    model B (other layer and bucket sizes: about 1.5 MB) under the same production latency, stats files
  B-replay  model B with DELAYCOMM_DELAY=profile:profile-a.json and nothing else

"Production" is a bimodal trace (--prod-trace; by default 80% of the values near 3 ms and 20% near 25 ms), set as
DELAYCOMM_DELAY=trace:FILE alone: its defaults (delay_fraction=0.3, every rank drawing, added to the call).

Judged (docs/profile.md, "A different job"): per (op, size class) of B, B-replay's p50 against B-prod's within
35%, from B-prod's stats made into a profile and `delaycomm.fidelity.compare` of B-replay's stats against it; and
B-replay's mean step time against B-prod's within 10%. OUT/result.json holds every row, OUT/jobs.log each job's
output, OUT/steps-JOB.rankR.json every step's time. Exit status 1 when a check misses.

  python bench/jobpair.py --steps 300 --out bench/results/DATE-vm2core-jobpair
  python bench/jobpair.py --b-model W ...   # job B with ~4 MiB buckets queued one behind the other
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import time

import roundtrip  # this directory's round trip: its job launcher and port helper

MODELS = {
    # layers (in, out) and DDP's bucket_cap_mb: A's buckets are ~0.5 MB, B's ~1.5 MB (other size classes)
    "A": {"width": 256, "layers": 8, "bucket_cap_mb": 0.5},
    "B": {"width": 448, "layers": 6, "bucket_cap_mb": 1.5},
    # W: wide layers, ~4 MiB buckets issued one behind the other (a class A never had, queued behind its peers)
    "W": {"width": 1024, "layers": 3, "bucket_cap_mb": 4.0},
}
P50_TOLERANCE = 0.35
STEP_TOLERANCE = 0.10


def worker(model_name: str, steps: int, warmup: int, out: str) -> None:
    """One rank: an unmodified DDP training loop (options from the environment only)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import delaycomm  # noqa: F401  (registers the backend)

    dist.init_process_group("delaycomm")
    rank = dist.get_rank()
    spec = MODELS[model_name]
    torch.manual_seed(0)
    w = spec["width"]
    layers = []
    for _ in range(spec["layers"]):
        layers += [torch.nn.Linear(w, w), torch.nn.ReLU()]
    model = DDP(torch.nn.Sequential(*layers), bucket_cap_mb=spec["bucket_cap_mb"])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    knob = torch.zeros(256)
    times: list[float] = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        x = torch.randn(32, w, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        metric = loss.detach().clone()
        dist.all_reduce(metric)  # the metric all-reduce
        dist.broadcast(knob, 0)  # a broadcast from rank 0
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    dist.barrier()
    dist.destroy_process_group()
    with open(out.format(rank=rank), "w") as f:
        json.dump({"rank": rank, "model": model_name, "step_s": times}, f)


def _run_job(name: str, model: str, env: dict[str, str], args, log) -> list[float]:
    steps_out = os.path.join(args.out, f"steps-{name}.rank{{rank}}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port"]
    cmd += [str(roundtrip._free_port()), __file__, "--worker", model, "--steps", str(args.steps)]
    cmd += ["--warmup", str(args.warmup), "--steps-out", steps_out]
    roundtrip.run_job("jobpair", name, cmd, env, log, args.job_timeout)
    steps: list[float] = []
    for path in sorted(glob.glob(steps_out.format(rank="*"))):
        with open(path) as f:
            steps.extend(json.load(f)["step_s"])
    return steps


def _profile(stats_dir: str, out: str, log) -> None:
    cmd = [sys.executable, "-m", "delaycomm", "profile", *sorted(glob.glob(os.path.join(stats_dir, "*.json")))]
    cmd += ["-o", out]
    log.write(f"### profile: {' '.join(cmd[1:])}\n")
    log.flush()
    subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)


def _write_trace(path: str) -> None:
    """The default production trace: 80% of the values from 2.5 to 3.5 ms, 20% from 20 to 30 ms (bimodal)."""
    with open(path, "w") as f:
        f.write("# bench/jobpair.py's production latency: bimodal\n")
        for i in range(80):
            f.write(f"{2.5 + i / 79:.4f}ms\n")
        for i in range(20):
            f.write(f"{20 + 10 * i / 19:.4f}ms\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="timed steps per job (default 300)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps first (default 20)")
    ap.add_argument("--out", help="output directory (created)")
    ap.add_argument("--b-model", default="B", choices=sorted(MODELS), help="job B's model (default B)")
    ap.add_argument("--prod-trace", help="the production latency as a trace file (default: a bimodal one)")
    ap.add_argument("--job-timeout", type=float, default=900.0, help="seconds per job")
    ap.add_argument("--worker", metavar="MODEL", choices=sorted(MODELS), help=argparse.SUPPRESS)
    ap.add_argument("--steps-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.steps, args.warmup, args.steps_out)
        return 0
    if not args.out:
        ap.error("--out is required")
    os.makedirs(args.out, exist_ok=True)
    trace = args.prod_trace
    if trace is None:
        trace = os.path.join(args.out, "prod-trace.txt")
        _write_trace(trace)
    prod = {"DELAYCOMM_DELAY": f"trace:{os.path.abspath(trace)}"}
    dirs = {job: os.path.join(args.out, f"stats-{job}", "") for job in ("a-prod", "b-prod", "b-replay")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    profile_a = os.path.join(args.out, "profile-a.json")
    profile_b = os.path.join(args.out, "profile-b-prod.json")
    result: dict = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "load_before": os.getloadavg()},
        "steps": args.steps,
        "warmup": args.warmup,
        "models": {"A": MODELS["A"], "B": MODELS[args.b_model]},
        "production": prod,
        "tolerance": {"p50": P50_TOLERANCE, "mean_step": STEP_TOLERANCE},
    }
    t0 = time.time()
    with open(os.path.join(args.out, "jobs.log"), "w") as log:
        _run_job("A-prod", "A", {**prod, "DELAYCOMM_STATS": dirs["a-prod"]}, args, log)
        _profile(dirs["a-prod"], profile_a, log)
        b_prod = _run_job("B-prod", args.b_model, {**prod, "DELAYCOMM_STATS": dirs["b-prod"]}, args, log)
        replay = {"DELAYCOMM_DELAY": f"profile:{os.path.abspath(profile_a)}"}  # the one knob
        b_replay = _run_job("B-replay", args.b_model, {**replay, "DELAYCOMM_STATS": dirs["b-replay"]}, args, log)
        _profile(dirs["b-prod"], profile_b, log)
    result["load_after"] = os.getloadavg()
    result["wall_s"] = round(time.time() - t0, 1)

    from delaycomm import fidelity  # the parent loads delaycomm only to compare and write the record
    from delaycomm._tools.output import write_json

    rows = fidelity.compare(profile_b, sorted(glob.glob(os.path.join(dirs["b-replay"], "*.json"))))
    judged = [r for r in rows if r["profile_calls"] > 0 and not r["rare"]]
    misses = [r for r in judged if r["err_p50"] is None or abs(r["err_p50"]) > P50_TOLERANCE]
    mean_prod = sum(b_prod) / len(b_prod)
    mean_replay = sum(b_replay) / len(b_replay)
    step_err = mean_replay / mean_prod - 1.0
    result["classes"] = rows
    result["mean_step_ms"] = {"B-prod": round(mean_prod * 1e3, 3), "B-replay": round(mean_replay * 1e3, 3)}
    result["mean_step_err"] = round(step_err, 4)
    ok = not misses and abs(step_err) <= STEP_TOLERANCE and bool(judged)
    result["verdict"] = "pass" if ok else "fail"
    write_json(os.path.join(args.out, "result.json"), result)
    print(fidelity.format_rows(profile_b, rows))
    print(
        f"mean step: B-prod {mean_prod * 1e3:.2f} ms, B-replay {mean_replay * 1e3:.2f} ms ({step_err:+.1%}; "
        f"tolerance {STEP_TOLERANCE:.0%})"
    )
    print(
        f"p50 per (op, size class), B-replay against B-prod: {len(judged) - len(misses)} of {len(judged)} within "
        f"{P50_TOLERANCE:.0%}; verdict: {result['verdict']}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
