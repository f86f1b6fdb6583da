"""The round trip, as a user runs it: record a job's latency, build a profile, replay it with the profile alone.

Every job is 2 ranks under torchrun running this file's timing script (--worker), configured only by DELAYCOMM_*
variables; the script times each call by its own clock (perf_counter around ``all_reduce(async_op=True).wait()``),
1 KiB and 4 MiB all-reduces interleaved, after --warmup untimed calls of each size (docs/delay.md, "Round trip"):

  A  record   DELAYCOMM_DELAY=lognormal:p50=3ms,p99=30ms DELAYCOMM_DELAY_FRACTION=0.5 DELAYCOMM_STATS=OUT/stats-a/
  P  profile  python -m delaycomm profile OUT/stats-a/*.json -o OUT/profile.json
  B  replay   DELAYCOMM_DELAY=profile:OUT/profile.json   (nothing else: a profile's defaults are delay_fraction=1,
              delay_mode=match, delay_carrier=one; docs/profile.md, "Replay")
  C  the same as B with DELAYCOMM_DELAY_MODE=add DELAYCOMM_DELAY_CARRIER=all (every rank draws, added on top)

B's (and C's) p50 / p90 / p99 per size are compared with A's (both ranks' calls pooled); B passes within 25% / 25% /
35%. OUT/result.json holds the quantiles, the ratios and the verdict, OUT/times-JOB.rankR.json every call's time,
OUT/jobs.log each job's output. Exit status 1 when B misses (C is shown beside it, not judged).

  python bench/roundtrip.py --calls 500 --out bench/results/DATE-vm2core-roundtrip
  python bench/roundtrip.py --calls 120 --out /tmp/rt --jobs A,B --quantiles 0.5,0.9   # what the CI test runs
  python bench/roundtrip.py --calls 500 --out /tmp/rt-load --replay-load 1   # the replays under one busy core more
  python bench/roundtrip.py --calls 3000 --jobs A,B --replay-load 1 --load-at 1000 --window 500 --out /tmp/rt-change
      # the load changes during the replay: each window of 500 calls judged against A
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import socket
import subprocess
import sys
import time

SIZES = {"1KiB": 1024, "4MiB": 4 << 20}
TOLERANCE = {0.5: 0.25, 0.9: 0.25, 0.99: 0.35}
RECORD_ENV = {"DELAYCOMM_DELAY": "lognormal:p50=3ms,p99=30ms", "DELAYCOMM_DELAY_FRACTION": "0.5"}


def _hogs(n: int) -> list[subprocess.Popen]:
    """n busy processes, one core each: load on the machine."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stop(hogs: list[subprocess.Popen]) -> None:
    for h in hogs:
        h.kill()
        h.wait()


def worker(calls: int, warmup: int, out: str, load: int = 0, load_at: int = -1) -> None:
    """One rank of a job: the user's unmodified timing loop (options come from the environment only). With
    ``load_at`` >= 0, rank 0 starts ``load`` busy processes before timed call ``load_at`` (the bench's load change,
    not the user's)."""
    import torch
    import torch.distributed as dist

    import delaycomm  # noqa: F401  (registers the backend)

    dist.init_process_group("delaycomm")
    rank = dist.get_rank()
    bufs = {name: torch.ones(nbytes // 4) for name, nbytes in SIZES.items()}
    times: dict[str, list[float]] = {name: [] for name in SIZES}
    hogs: list[subprocess.Popen] = []
    try:
        for i in range(warmup + calls):
            if rank == 0 and load_at >= 0 and i == warmup + load_at:
                hogs = _hogs(load)
            for name, t in bufs.items():
                t0 = time.perf_counter()
                dist.all_reduce(t, async_op=True).wait()
                if i >= warmup:
                    times[name].append(time.perf_counter() - t0)
    finally:
        _stop(hogs)
    dist.barrier()
    dist.destroy_process_group()
    with open(out.format(rank=rank), "w") as f:
        json.dump({"rank": rank, "times_s": times}, f)


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    i = min(int(pos), len(s) - 2)
    return s[i] + (pos - i) * (s[i + 1] - s[i])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(tool: str, name: str, cmd: list[str], env: dict[str, str], log, timeout: float) -> None:
    """Run one job's command with ``env`` as its only DELAYCOMM_* settings, its output appended to ``log``; exit
    (naming ``tool`` and the job) when it fails. Shared with bench/jobpair.py."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_")}
    full_env.update(env)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    shown = " ".join(f"{k}={v}" for k, v in env.items())
    log.write(f"### job {name}: {shown} {' '.join(cmd[1:])}\n")
    log.flush()
    t0 = time.time()
    p = subprocess.run(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    log.write(f"### job {name}: exit {p.returncode} after {time.time() - t0:.1f} s\n")
    log.flush()
    if p.returncode != 0:
        raise SystemExit(f"{tool}: job {name} failed (exit {p.returncode}); see {log.name}")


def _run_job(name: str, env: dict[str, str], args, log, load_at: int = -1) -> dict[str, list[list[float]]]:
    """Run one job; each size's timed calls per rank, in call order."""
    times_out = os.path.join(args.out, f"times-{name}.rank{{rank}}.json")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(args.port or _free_port()),
        __file__,
        "--worker",
        "--calls",
        str(args.calls),
        "--warmup",
        str(args.warmup),
        "--times-out",
        times_out,
        "--replay-load",
        str(args.replay_load),
        "--load-at",
        str(load_at),
    ]
    run_job("roundtrip", name, cmd, env, log, args.job_timeout)
    per_rank: dict[str, list[list[float]]] = {s: [] for s in SIZES}
    for path in sorted(glob.glob(times_out.format(rank="*"))):
        with open(path) as f:
            for s, xs in json.load(f)["times_s"].items():
                per_rank[s].append(xs)
    return per_rank


def _pooled(per_rank: dict[str, list[list[float]]]) -> dict[str, list[float]]:
    return {s: [x for xs in ranks for x in xs] for s, ranks in per_rank.items()}


def _windows(per_rank: list[list[float]], ref: list[float], window: int, quantiles: list[float]) -> list[dict]:
    """Quantiles of each window of ``window`` timed calls (both ranks' calls of it pooled), against ``ref``."""
    out = []
    for start in range(0, min(len(xs) for xs in per_rank), window):
        xs = [x for r in per_rank for x in r[start : start + window]]
        mean = sum(xs) / len(xs)
        row: dict = {"calls": [start, start + window], "n": len(xs), "mean_ms": round(mean * 1e3, 3)}
        row["mean_vs_A"] = round(mean / (sum(ref) / len(ref)) - 1.0, 3)
        for q in quantiles:
            got = _quantile(xs, q)
            row[f"p{q * 100:g}_ms"] = round(got * 1e3, 3)
            row[f"p{q * 100:g}_vs_A"] = round(got / _quantile(ref, q) - 1.0, 3)
        out.append(row)
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=500, help="timed calls per size and job (default 500)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls per size first (default 20)")
    ap.add_argument("--out", help="output directory (created)")
    ap.add_argument("--jobs", default="A,B,C", help="jobs to run after A: B (match), C (add); default A,B,C")
    ap.add_argument("--quantiles", default="0.5,0.9,0.99", help="quantiles judged (default 0.5,0.9,0.99)")
    ap.add_argument("--port", type=int, default=0, help="torchrun's master port (default: a free one per job)")
    ap.add_argument("--job-timeout", type=float, default=600.0, help="seconds per job")
    ap.add_argument(
        "--replay-load",
        type=int,
        default=0,
        metavar="N",
        help="run N busy processes (one core each) during the replays B and C, not during A: a replay under other "
        "load than its recording (default 0)",
    )
    ap.add_argument(
        "--load-at",
        type=int,
        default=-1,
        metavar="K",
        help="with --replay-load: the busy processes start before the replays' timed call K (a load change during "
        "the replay), not before the replays (default: before)",
    )
    ap.add_argument(
        "--window",
        type=int,
        default=0,
        metavar="W",
        help="also judge each window of W timed calls per size against A (how a replay follows a load change; "
        "default 0: none)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--times-out", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.calls, args.warmup, args.times_out, args.replay_load, args.load_at)
        return 0
    if not args.out:
        ap.error("--out is required")
    os.makedirs(args.out, exist_ok=True)
    quantiles = [float(q) for q in args.quantiles.split(",")]
    jobs = args.jobs.split(",")
    stats_dir = os.path.join(args.out, "stats-a") + os.sep
    os.makedirs(stats_dir, exist_ok=True)
    profile = os.path.join(args.out, "profile.json")
    replay_env = {"DELAYCOMM_DELAY": f"profile:{profile}"}  # the one knob
    envs = {
        "A": {**RECORD_ENV, "DELAYCOMM_STATS": stats_dir},
        "B": {**replay_env, "DELAYCOMM_STATS": os.path.join(args.out, "stats-b", "")},
        "C": {
            **replay_env,
            "DELAYCOMM_DELAY_MODE": "add",
            "DELAYCOMM_DELAY_CARRIER": "all",
            "DELAYCOMM_STATS": os.path.join(args.out, "stats-c", ""),
        },
    }
    for job in ("B", "C"):
        os.makedirs(envs[job]["DELAYCOMM_STATS"], exist_ok=True)
    result: dict = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "load_before": os.getloadavg()},
        "calls_per_size": args.calls,
        "warmup_per_size": args.warmup,
        "replay_load": args.replay_load,
        "load_at": args.load_at,
        "window": args.window,
        "sizes": SIZES,
        "jobs": {},
        "tolerance": {str(q): TOLERANCE.get(q, 0.25) for q in quantiles},
    }
    t0 = time.time()
    with open(os.path.join(args.out, "jobs.log"), "w") as log:
        times_by_rank = {"A": _run_job("A", envs["A"], args, log)}
        cmd = [sys.executable, "-m", "delaycomm", "profile", *sorted(glob.glob(stats_dir + "*.json")), "-o", profile]
        log.write(f"### profile: {' '.join(cmd[1:])}\n")
        log.flush()
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
        hogs = _hogs(args.replay_load) if args.load_at < 0 else []
        try:
            for job in jobs:
                if job != "A":
                    times_by_rank[job] = _run_job(job, envs[job], args, log, args.load_at)
        finally:
            _stop(hogs)
    times = {job: _pooled(per_rank) for job, per_rank in times_by_rank.items()}
    result["load_after"] = os.getloadavg()
    result["wall_s"] = round(time.time() - t0, 1)
    ok = True
    for job, pooled in times.items():
        entry: dict = {"env": envs[job], "sizes": {}}
        for s, xs in pooled.items():
            row: dict = {"n": len(xs)}
            for q in quantiles:
                got = _quantile(xs, q)
                row[f"p{q * 100:g}_ms"] = round(got * 1e3, 3)
                if job != "A":
                    ref = _quantile(times["A"][s], q)
                    err = got / ref - 1.0
                    row[f"p{q * 100:g}_vs_A"] = round(err, 3)
                    if job == "B" and abs(err) > TOLERANCE.get(q, 0.25):
                        ok = False
            entry["sizes"][s] = row
            if job != "A" and args.window > 0:  # each rank's calls in order: window w holds calls [wW, (w+1)W)
                row["windows"] = _windows(times_by_rank[job][s], times["A"][s], args.window, quantiles)
        if job != "A":  # what each rank's stats say about the replay (delay_mode=match's counters)
            entry["stats"] = {}
            for path in sorted(glob.glob(os.path.join(envs[job]["DELAYCOMM_STATS"], "*.json"))):
                with open(path) as f:
                    ops = json.load(f).get("ops", {})
                ar = ops.get("allreduce", {})
                entry["stats"][os.path.basename(path)] = {
                    "delayed_calls": ar.get("delayed_calls"),
                    **ar.get("match", {}),
                }
        result["jobs"][job] = entry
    result["verdict"] = "pass" if ok else "fail"
    from delaycomm._tools.output import write_json  # the parent loads delaycomm only to write the record

    write_json(os.path.join(args.out, "result.json"), result)
    print(f"{'job':4} {'size':5} " + " ".join(f"{'p' + format(q * 100, 'g'):>16}" for q in quantiles))
    for job, entry in result["jobs"].items():
        for s, row in entry["sizes"].items():
            cells = []
            for q in quantiles:
                k = f"p{q * 100:g}"
                vs = f" ({row[k + '_vs_A']:+.0%})" if k + "_vs_A" in row else ""
                cells.append(f"{row[k + '_ms']:8.2f} ms{vs:>7}")
            print(f"{job:4} {s:5} " + " ".join(f"{c:>16}" for c in cells))
    for job, entry in result["jobs"].items():
        for s, row in entry["sizes"].items():
            for w in row.get("windows", []):
                cells = " ".join(f"{w[f'p{q * 100:g}_vs_A']:>+8.0%}" for q in quantiles)
                print(f"{job:4} {s:5} calls {w['calls'][0]:>5}-{w['calls'][1]:<5} {cells}")
    print(f"B (the profile alone) against A: {result['verdict']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
