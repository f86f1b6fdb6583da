"""Stress the option agreement when rank 0 hosts the store: count the ranks that get a network error instead of
the option's ValueError.

Each run starts --world ranks as processes forked from this one (torch imported once), with env:// and no
torchrun agent, so rank 0 hosts the TCPStore as under mp.spawn or a hand-started job. One rank (each in turn)
gives a different DELAYCOMM_SEED, or on every --rejected-every-th run an invalid one; every rank calls
init_process_group("delaycomm") as an unmodified script does and exits at once with what it raised (rank 0's
store goes with it). Every rank must report the ValueError. Not a CI test (tests/backend/test_agreement.py runs 22
attempts inside one set of ranks).

  python bench/stress_agree.py --runs 100                  # 100 runs of 4 ranks
  python bench/stress_agree.py --runs 50 --json out.json   # machine-readable record
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import socket
import sys
import time
from collections import Counter
from datetime import timedelta


def _rank(rank: int, world: int, port: int, seed: str, conn) -> None:
    import torch.distributed as dist

    import delaycomm  # noqa: F401 - registers the backend

    os.environ.update(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DELAYCOMM_SEED": seed, "OMP_NUM_THREADS": "1"}
    )
    try:
        dist.init_process_group("delaycomm", rank=rank, world_size=world, timeout=timedelta(seconds=30))
        outcome = "created"
        dist.destroy_process_group()
    except ValueError:
        outcome = "ValueError"
    except Exception as e:  # noqa: BLE001 - the type is the point
        outcome = type(e).__name__
    conn.send(outcome)
    conn.close()
    os._exit(0)  # as a script that ends with the error: the process, and rank 0's store, go at once


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50, help="number of runs (default 50)")
    p.add_argument("--world", type=int, default=4, help="ranks per run (default 4)")
    p.add_argument("--rejected-every", type=int, default=5, help="every Nth run gives an invalid seed (default 5)")
    p.add_argument("--json", help="write the record here")
    a = p.parse_args(argv)
    import torch

    import delaycomm

    for k in [k for k in os.environ if k.startswith("DELAYCOMM_") or k.startswith("TORCHELASTIC_")]:
        del os.environ[k]
    ctx = multiprocessing.get_context("fork")
    outcomes: Counter[str] = Counter()
    bad_runs = []
    t0 = time.monotonic()
    for run in range(a.runs):
        odd = run % a.world
        rejected = a.rejected_every > 0 and run % a.rejected_every == a.rejected_every - 1
        port = _free_port()
        pipes, procs = [], []
        for r in range(a.world):
            seed = ("-1" if rejected else "7") if r == odd else "3"
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_rank, args=(r, a.world, port, seed, child), daemon=True)
            proc.start()
            child.close()
            pipes.append(parent)
            procs.append(proc)
        got = []
        for conn, proc in zip(pipes, procs):
            got.append(conn.recv() if conn.poll(90) else "no report")
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        outcomes.update(got)
        if any(g != "ValueError" for g in got):
            bad_runs.append({"run": run, "rejected": rejected, "odd_rank": odd, "outcomes": got})
        print(f"run {run:3d} {'rejected' if rejected else 'mismatch'} rank {odd}: {' '.join(got)}", flush=True)
    record = {
        "argv": sys.argv,
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "delaycomm": getattr(delaycomm, "__version__", "?"),
        "delaycomm_path": os.path.dirname(delaycomm.__file__),
        "runs": a.runs,
        "world": a.world,
        "rank_outcomes": dict(outcomes),
        "runs_with_a_rank_not_getting_the_value_error": len(bad_runs),
        "bad_runs": bad_runs,
        "seconds": round(time.monotonic() - t0, 1),
    }
    print(
        f"# {a.runs} runs x {a.world} ranks: {dict(outcomes)}; runs where a rank did not get the ValueError: "
        f"{len(bad_runs)} ({record['seconds']} s)"
    )
    if a.json:
        from delaycomm._tools.output import write_json

        write_json(a.json, record)
    return 1 if bad_runs else 0


if __name__ == "__main__":
    sys.exit(main())
