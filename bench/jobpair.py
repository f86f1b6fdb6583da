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

With --replays step,call, B-replay runs twice side by side: with the profile's defaults (delay_place=step: a call
issued behind others takes its run's draw, docs/delay.md "Replay into another job") and with
DELAYCOMM_DELAY_PLACE=call (every call its own draw, the replay before delay_place), each judged against B-prod
(also the median step: within 25%).

  python bench/jobpair.py --steps 300 --out bench/results/DATE-vm2core-jobpair
  python bench/jobpair.py --b-model W ...   # job B with ~4 MiB buckets queued one behind the other
  python bench/jobpair.py --a-model F --b-model D ...   # A is FSDP2; B is DDP with a broadcast every 5th step
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
    # F: FSDP2 (fully_shard per layer: all-gathers and reduce-scatters, the metric all-reduce, no broadcast)
    "F": {"width": 384, "layers": 6, "fsdp2": True, "broadcast_every": 0},
    # D: DDP (~1 MB buckets) with the metric all-reduce and a broadcast every 5th step (an op F never has)
    "D": {"width": 384, "layers": 6, "bucket_cap_mb": 1.0, "broadcast_every": 5},
}
P50_TOLERANCE = 0.35
STEP_TOLERANCE = 0.10
STEP_P50_TOLERANCE = 0.25
# The replays --replays can run, side by side: (job name suffix, their DELAYCOMM_* beyond the profile). "step" is
# the profile's defaults (delay_place=step: docs/delay.md, "Replay into another job"); "call" every call its own draw
# (the replay before delay_place).
REPLAYS = {"step": ("", {}), "call": ("-call", {"DELAYCOMM_DELAY_PLACE": "call"})}


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
    if spec.get("fsdp2"):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
        model = torch.nn.Sequential(*layers)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = DDP(torch.nn.Sequential(*layers), bucket_cap_mb=spec["bucket_cap_mb"])
    every = spec.get("broadcast_every", 1)
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
        if every and i % every == 0:
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
    ap.add_argument("--a-model", default="A", choices=sorted(MODELS), help="job A's model (default A)")
    ap.add_argument("--b-model", default="B", choices=sorted(MODELS), help="job B's model (default B)")
    ap.add_argument(
        "--replays",
        default="step",
        help="the replays of B to run side by side, comma-separated: step (the profile's defaults), call "
        "(DELAYCOMM_DELAY_PLACE=call: every call its own draw); default step",
    )
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
    variants = [v for v in args.replays.split(",") if v]
    for v in variants:
        if v not in REPLAYS:
            ap.error(f"--replays: unknown replay {v!r} (expected some of {', '.join(REPLAYS)})")
    jobs = ["a-prod", "b-prod"] + [f"b-replay{REPLAYS[v][0]}" for v in variants]
    dirs = {job: os.path.join(args.out, f"stats-{job}", "") for job in jobs}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    profile_a = os.path.join(args.out, "profile-a.json")
    profile_b = os.path.join(args.out, "profile-b-prod.json")
    result: dict = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "load_before": os.getloadavg()},
        "steps": args.steps,
        "warmup": args.warmup,
        "models": {"A": MODELS[args.a_model], "B": MODELS[args.b_model]},
        "production": prod,
        "tolerance": {"p50": P50_TOLERANCE, "mean_step": STEP_TOLERANCE, "p50_step": STEP_P50_TOLERANCE},
    }
    t0 = time.time()
    steps: dict[str, list[float]] = {}
    with open(os.path.join(args.out, "jobs.log"), "w") as log:
        _run_job("A-prod", args.a_model, {**prod, "DELAYCOMM_STATS": dirs["a-prod"]}, args, log)
        _profile(dirs["a-prod"], profile_a, log)
        steps["B-prod"] = _run_job("B-prod", args.b_model, {**prod, "DELAYCOMM_STATS": dirs["b-prod"]}, args, log)
        for v in variants:
            suffix, extra = REPLAYS[v]
            replay = {"DELAYCOMM_DELAY": f"profile:{os.path.abspath(profile_a)}", **extra}  # the one knob (+ extra)
            name = f"B-replay{suffix}"
            env = {**replay, "DELAYCOMM_STATS": dirs[name.lower()]}
            steps[name] = _run_job(name, args.b_model, env, args, log)
        _profile(dirs["b-prod"], profile_b, log)
    result["load_after"] = os.getloadavg()
    result["wall_s"] = round(time.time() - t0, 1)
    return _judge(result, variants, steps, dirs, profile_b, args.out)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _judge(result: dict, variants: list[str], steps: dict, dirs: dict, profile_b: str, out: str) -> int:
    """Each replay against B in production: per class (fidelity.compare), the mean and median step."""
    from delaycomm import fidelity  # the parent loads delaycomm only to compare and write the record
    from delaycomm._tools.output import write_json

    b_prod = steps["B-prod"]
    mean_prod, p50_prod = sum(b_prod) / len(b_prod), _median(b_prod)
    result["replays"] = {}
    ok_all = True
    for v in variants:
        name = f"B-replay{REPLAYS[v][0]}"
        rows = fidelity.compare(profile_b, sorted(glob.glob(os.path.join(dirs[name.lower()], "*.json"))))
        judged = [r for r in rows if r["profile_calls"] > 0 and not r["rare"]]
        misses = [r for r in judged if r["err_p50"] is None or abs(r["err_p50"]) > P50_TOLERANCE]
        b_replay = steps[name]
        mean_replay, p50_replay = sum(b_replay) / len(b_replay), _median(b_replay)
        step_err, p50_err = mean_replay / mean_prod - 1.0, p50_replay / p50_prod - 1.0
        ok = not misses and abs(step_err) <= STEP_TOLERANCE and abs(p50_err) <= STEP_P50_TOLERANCE and bool(judged)
        ok_all = ok_all and ok
        entry = {
            "job": name,
            "env": REPLAYS[v][1],
            "classes": rows,
            "mean_step_ms": {"B-prod": round(mean_prod * 1e3, 3), name: round(mean_replay * 1e3, 3)},
            "mean_step_err": round(step_err, 4),
            "p50_step_ms": {"B-prod": round(p50_prod * 1e3, 3), name: round(p50_replay * 1e3, 3)},
            "p50_step_err": round(p50_err, 4),
            "verdict": "pass" if ok else "fail",
        }
        result["replays"][v] = entry
        if v == variants[0]:  # the first replay's figures at the top level too (as before --replays)
            result.update({k: entry[k] for k in ("classes", "mean_step_err", "verdict")})
            result["mean_step_ms"] = {"B-prod": round(mean_prod * 1e3, 3), "B-replay": round(mean_replay * 1e3, 3)}
        print(f"## {name} ({v}): {' '.join(f'{k}={x}' for k, x in REPLAYS[v][1].items()) or 'the one knob'}")
        print(fidelity.format_rows(profile_b, rows))
        print(
            f"step: B-prod mean {mean_prod * 1e3:.2f} ms / p50 {p50_prod * 1e3:.2f} ms, {name} mean "
            f"{mean_replay * 1e3:.2f} ms ({step_err:+.1%}; tolerance {STEP_TOLERANCE:.0%}) / p50 "
            f"{p50_replay * 1e3:.2f} ms ({p50_err:+.1%}; tolerance {STEP_P50_TOLERANCE:.0%})"
        )
        print(
            f"p50 per (op, size class), {name} against B-prod: {len(judged) - len(misses)} of {len(judged)} within "
            f"{P50_TOLERANCE:.0%}; verdict: {entry['verdict']}"
        )
    result["verdict"] = "pass" if ok_all else "fail"
    write_json(os.path.join(out, "result.json"), result)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
