"""Stress the exit path: many short DDP jobs (init -> train -> destroy -> exit), counting the ranks that abort.

Each run launches 2 real ranks (processes, real Gloo, a file store) that train a small DDP model for a few steps,
leave a few all-reduces in flight, call destroy_process_group() and exit. With --kill-peer, rank 1 kills itself
(SIGKILL) mid-training; rank 0 must then fail cleanly (a Python exception it catches), destroy its group and exit 0.
The backends are interleaved run by run, so each sees the same machine load. A rank "aborts" when it dies by
SIGABRT or prints "terminate called"; a run "hangs" when a rank outlives --run-timeout. Not a CI test (minutes).

  python bench/stress_exit.py --runs 200                      # delaycomm vs gloo, 200 runs each
  python bench/stress_exit.py --runs 50 --kill-peer           # the same with a peer killed mid-training
  python bench/stress_exit.py --runs 20 --json out.json       # machine-readable record

delaycomm runs with network delay (the issuer thread holds ops back, some still held at destroy) unless
--delaycomm-env says otherwise: a JSON object of DELAYCOMM_* variables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

DEFAULT_ENV = {"DELAYCOMM_DELAY": "exp:p99=20ms", "DELAYCOMM_DELAY_FRACTION": "0.5"}


def worker(rank: int, world_size: int, init_method: str, backend: str, kill_peer: bool, steps: int) -> int:
    """One rank: DDP training, a few async all-reduces left in flight, destroy, exit."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if backend == "delaycomm":
        import delaycomm  # noqa: F401 - registers the backend

    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=20)
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    failed = None
    try:
        for step in range(steps):
            if kill_peer and rank == 1 and step == steps // 2:
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        works = [dist.all_reduce(torch.ones(256), async_op=True) for _ in range(4)]  # in flight at destroy
        del works
    except Exception as e:  # noqa: BLE001 - the peer's death, expected with --kill-peer
        failed = f"{type(e).__name__}: {str(e)[:160]}"
    try:
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        failed = failed or f"destroy: {type(e).__name__}: {str(e)[:160]}"
    if failed and not kill_peer:
        print(f"rank {rank}: {failed}", file=sys.stderr)
        return 1
    return 0


def one_run(backend: str, kill_peer: bool, steps: int, run_timeout: float, env: dict) -> dict:
    """Launch the 2 ranks of one job; classify how each ended."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stress-exit-") as d:
        procs = []
        for rank in range(2):
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                str(rank),
                "--backend",
                backend,
                "--init",
                f"file://{d}/store",
                "--steps",
                str(steps),
            ] + (["--kill-peer"] if kill_peer else [])
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        deadline = time.monotonic() + run_timeout
        ranks = []
        for rank, p in enumerate(procs):
            try:
                _, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                hung = False
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
                hung = True
            text = err.decode(errors="replace")
            rc = p.returncode
            expected_kill = kill_peer and rank == 1 and rc == -signal.SIGKILL
            aborted = rc == -signal.SIGABRT or "terminate called" in text
            ranks.append(
                {
                    "rank": rank,
                    "rc": rc,
                    "hung": hung,
                    "aborted": aborted,
                    "ok": rc == 0 or expected_kill,
                    "stderr_tail": "" if (rc == 0 or expected_kill) and not aborted else text[-600:],
                }
            )
    return {
        "backend": backend,
        "kill_peer": kill_peer,
        "ranks": ranks,
        "elapsed_s": time.monotonic() - t0,
        "aborts": sum(r["aborted"] for r in ranks),
        "hangs": sum(r["hung"] for r in ranks),
        "failures": sum(not r["ok"] for r in ranks),
    }


def report(args, backends: list[str], runs: list[dict], elapsed: float, final: bool) -> None:
    """The table (final only) and the JSON record (after every pair of runs, so a stopped loop keeps its data)."""
    import torch

    summary = {}
    for b in backends:
        mine = [r for r in runs if r["backend"] == b]
        summary[b] = {
            "runs": len(mine),
            "rank_aborts": sum(r["aborts"] for r in mine),
            "rank_hangs": sum(r["hangs"] for r in mine),
            "runs_with_a_failure": sum(r["failures"] > 0 for r in mine),
        }
    if final:
        n = max(s["runs"] for s in summary.values())
        print(
            f"# stress_exit: {n} runs per backend, kill_peer={args.kill_peer}, steps={args.steps}, "
            f"{elapsed:.0f} s, load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, "
            f"torch {torch.__version__}, Python {platform.python_version()}"
        )
        print(f"{'backend':<10} {'runs':>5} {'rank aborts':>12} {'rank hangs':>11} {'failed runs':>12}")
        for b, s in summary.items():
            print(f"{b:<10} {s['runs']:>5} {s['rank_aborts']:>12} {s['rank_hangs']:>11} {s['runs_with_a_failure']:>12}")
    if args.json:
        from delaycomm._tools.output import write_json  # the parent loads delaycomm only to write the record

        write_json(
            args.json,
            {
                "argv": sys.argv,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "machine": platform.platform(),
                "cpus": os.cpu_count(),
                "elapsed_s": elapsed,
                "load_average": os.getloadavg(),
                "delaycomm_env": json.loads(args.delaycomm_env),
                "summary": summary,
                "runs": runs,
            },
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200, help="runs per backend (default 200)")
    ap.add_argument("--backends", default="delaycomm,gloo", help="comma-separated, interleaved (default both)")
    ap.add_argument("--kill-peer", action="store_true", help="rank 1 kills itself (SIGKILL) mid-training")
    ap.add_argument("--steps", type=int, default=12, help="DDP steps per run (default 12)")
    ap.add_argument(
        "--run-timeout",
        type=float,
        default=300.0,
        help="seconds before a run counts as hung (default 300: on a loaded 2-core machine starting two "
        "ranks alone can take a minute)",
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="stop after the pair of runs that crosses this many minutes (0: no limit); the report says "
        "how many runs were made",
    )
    ap.add_argument(
        "--delaycomm-env",
        default=json.dumps(DEFAULT_ENV),
        help="JSON object of DELAYCOMM_* variables for the delaycomm runs",
    )
    ap.add_argument("--json", help="write the record (argv, versions, settings, every run) to this file")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        return worker(args.worker, 2, args.init, args.backend, args.kill_peer, args.steps)

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_")}
    base_env.setdefault("OMP_NUM_THREADS", "1")
    envs = {b: dict(base_env, **(json.loads(args.delaycomm_env) if b == "delaycomm" else {})) for b in backends}
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience
        tqdm = None
    total = args.runs * len(backends)
    bar = tqdm(total=total, unit="run", file=sys.stderr) if tqdm else None
    runs: list[dict] = []
    t0 = time.monotonic()
    for i in range(args.runs):
        for b in backends:
            r = one_run(b, args.kill_peer, args.steps, args.run_timeout, envs[b])
            runs.append(r)
            if bar:
                bar.update(1)
                bar.set_postfix({x: sum(q["aborts"] for q in runs if q["backend"] == x) for x in backends})
            for rk in r["ranks"]:
                if rk["aborted"] or rk["hung"] or not rk["ok"]:
                    print(
                        f"# run {i} {b} rank {rk['rank']}: rc={rk['rc']} hung={rk['hung']} "
                        f"aborted={rk['aborted']}: {rk['stderr_tail'][-300:]!r}",
                        file=sys.stderr,
                    )
        report(args, backends, runs, time.monotonic() - t0, final=False)
        if args.max_minutes and time.monotonic() - t0 > 60 * args.max_minutes:
            print(
                f"# stopping after {i + 1} runs per backend: --max-minutes {args.max_minutes:g} reached",
                file=sys.stderr,
            )
            break
    if bar:
        bar.close()
    report(args, backends, runs, time.monotonic() - t0, final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
