"""How long the staleness engine's waits last when something should end them early: destroy_process_group, a
timeout lowered by set_timeout, a member of the group that dies; beside how fast plain Gloo notices a dead peer.

Each scenario starts 2 ranks (3 for "death-calibration") as processes forked from this one (torch imported once),
rendezvous through a TCPStore this process hosts (as torchrun's agent does; "death-flush" lets rank 0 host it, as
env:// and mp.spawn do), and measures on the rank that waits:

  destroy-calibration, destroy-flush   rank 0 waits in the step_ms=auto agreement / flush's exchange (rank 1 never
                                       comes); another thread destroys the group: seconds from destroy to the end
  destroy-gate                         rank 1 waits 20 s at the ssp:2 gate; it destroys the group: the same
  timeout-calibration, timeout-flush   the group was created with --timeout, then set_timeout(1 s): seconds waited
  timeout-gate                         a 3 s gate wait after set_timeout(1 s): seconds waited, and the outcome
  death-calibration, death-gate        a rank dies (os._exit) while the others wait in the agreement (3 ranks) /
                                       wait out an SSP gate timeout: seconds from its death to the survivors' error
  death-flush                          rank 0, the store's host, dies while rank 1 waits in flush: the same
  gloo-death                           plain Gloo: rank 1 dies while rank 0 waits in an all_reduce: the same

Run it with this checkout's build and with another one to compare (the script only needs delaycomm installed):

  python bench/engine_waits.py --runs 5 --json after.json
  /path/to/other/venv/bin/python bench/engine_waits.py --runs 1 --json before.json   # e.g. main's build
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta

# scenario -> (ranks, the rank that waits and measures, the rank that dies or -1)
ROLES = {
    "destroy-calibration": (2, 0, -1),
    "destroy-flush": (2, 0, -1),
    "destroy-gate": (2, 1, -1),
    "timeout-calibration": (2, 0, -1),
    "timeout-flush": (2, 0, -1),
    "timeout-gate": (2, 1, -1),
    "death-calibration": (3, 0, 2),
    "death-gate": (2, 0, 1),
    "death-flush": (2, 1, 0),
    "gloo-death": (2, 0, 1),
}
SCENARIOS = list(ROLES)
SET_TIMEOUT_S = 1.0


def gate_seed(delay: str, late: int = 1) -> int:
    """A seed under which rank `late` is not delayed at its first all-reduces (a stream's first step pays its delay
    as under bsp: docs/staleness.md) and is late by `delay` at key 0's second step (so a gate wait comes there).
    Also used by tests/stale/test_engine_waits.py."""
    from delaycomm import _C, _ops

    op = int(_ops.BY_NAME["allreduce"].kind)
    for seed in range(1000):
        s = _C.DelaySchedule(delay, 0.5, seed, [late])
        if all(s.delay_ns(late, op, q) == 0 for q in range(4)) and s.delay_ns(late, s.key_stream(0), 1) > 0:
            return seed
    raise AssertionError("no seed found")


def _timed(fn) -> dict:
    t0 = time.monotonic()
    try:
        fn()
        outcome = "ok"
    except Exception as e:  # noqa: BLE001 - reported
        outcome = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return {"waited_s": time.monotonic() - t0, "end": time.monotonic(), "wall": time.time(), "outcome": outcome}


def _scenario(rank: int, world: int, name: str, timeout_s: float, died_at) -> dict | None:
    """One rank of scenario `name`; returns what the waiting rank measured (None on the others)."""
    import torch
    import torch.distributed as dist

    import delaycomm

    timeout = timedelta(seconds=timeout_s)
    kind, what = name.split("-")
    _, waiter, dying = ROLES[name]
    dist.init_process_group("gloo", timeout=timeout if kind == "gloo" else timedelta(seconds=max(60.0, 2 * timeout_s)))
    g = torch.zeros(8)
    options = {"delay": "exp:p99=5ms", "delay_fraction": 0.3, "seed": 1, "staleness": "ssp:2"}
    if what == "gate":  # rank 1 is late at key 0's second step: a gate wait (destroy, timeout) or a gate timeout
        delay = {"destroy": "const:20s", "timeout": "const:3s", "death": f"const:{3 * timeout_s:g}s"}[kind]
        options.update(delay=delay, delay_fraction=0.5, seed=gate_seed(delay), delay_ranks=[1], step_ms=10.0)
        options["staleness"] = "ssp:1" if kind == "timeout" else "ssp:2"
    group = None
    if kind != "gloo":
        cfg = delaycomm.DelayConfig(**options)
        group = dist.new_group(backend="delaycomm", pg_options=cfg, timeout=timeout)
    for _ in range({"calibration": 5, "flush": 12, "gate": 1, "death": 0}[what]):
        delaycomm.stale_allreduce(g, key=0, group=group)
    wait = {
        "calibration": lambda: delaycomm.stale_allreduce(g, key=0, group=group),  # the 6th call: the agreement
        "flush": lambda: delaycomm.flush(group),
        "gate": lambda: delaycomm.stale_allreduce(g, key=0, group=group),
        "death": lambda: dist.all_reduce(g),
    }[what]
    if kind == "timeout":
        group.set_timeout(timedelta(seconds=SET_TIMEOUT_S))
    if rank == dying:

        def die():
            time.sleep(1.0)
            died_at.value = time.time()
            os._exit(3)

        threading.Thread(target=die, daemon=True).start()
        if what != "gate":
            time.sleep(3 * timeout_s)  # stays away from the wait, and dies meanwhile
    elif rank != waiter and what != "gate" and kind in ("destroy", "timeout"):
        time.sleep(3.0 if kind == "destroy" else SET_TIMEOUT_S + 2.0)  # stays away from the wait
        return None
    if kind == "destroy":
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(_timed(wait)))
        thread.start()
        time.sleep(1.5 if rank == waiter else 2.0)  # the waiter's destroy comes first
        destroyed = time.monotonic()
        dist.destroy_process_group(group)
        thread.join(3 * timeout_s)
        return {**result, "measured_s": result.get("end", float("nan")) - destroyed} if rank == waiter else None
    r = _timed(wait)
    if rank != waiter:
        return None
    return {**r, "measured_s": r["waited_s"] if kind == "timeout" else r["wall"] - died_at.value}


def _rank_main(rank, world, port, name, timeout_s, died_at, queue, host_store) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "False" if host_store else "True",
            "OMP_NUM_THREADS": "1",
        }
    )
    try:
        queue.put((rank, _scenario(rank, world, name, timeout_s, died_at)))
    except BaseException as e:  # noqa: BLE001 - reported
        queue.put((rank, {"outcome": f"rank failed: {e!r}"}))
    queue.close()
    queue.join_thread()  # the report is sent before the process goes
    os._exit(0)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(name: str, timeout_s: float) -> dict:
    import torch.distributed as dist

    world = ROLES[name][0]
    host_store = name == "death-flush"  # rank 0 hosts the store, as env:// and mp.spawn do
    store = None
    if host_store:
        port = _free_port()
    else:
        store = dist.TCPStore("127.0.0.1", 0, world, True, timedelta(seconds=60), wait_for_workers=False)
        port = store.port
    ctx = multiprocessing.get_context("fork")
    queue, died_at = ctx.Queue(), ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, name, timeout_s, died_at, queue, host_store))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 4 * timeout_s + 30
    results = {}
    while len(results) < world and time.monotonic() < deadline:
        try:
            rank, value = queue.get(timeout=1.0)
            results[rank] = value
        except Exception:  # noqa: BLE001 - queue.Empty: the dying rank never reports
            if all(not p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
    del store
    return next((v for v in results.values() if v is not None and "measured_s" in v), {"outcome": repr(results)})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="runs of each scenario")
    p.add_argument("--timeout", type=float, default=30.0, help="the groups' timeout in seconds (default 30)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of: " + ", ".join(SCENARIOS))
    p.add_argument("--json", help="write the record here")
    a = p.parse_args(argv)
    import torch

    import delaycomm

    names = [s for s in a.scenarios.split(",") if s]
    bad = [s for s in names if s not in SCENARIOS]
    if bad:
        p.error(f"--scenarios: unknown {', '.join(bad)}; expected some of {', '.join(SCENARIOS)}")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(
        f"# engine_waits: torch {torch.__version__}, delaycomm from {os.path.dirname(delaycomm.__file__)}, "
        f"timeout {a.timeout:g} s, load average {' '.join(load)}"
    )
    print(f"# {'scenario':<22}{'runs':>5}{'median_s':>10}{'max_s':>9}  outcome (last run)")
    rows = []
    for name in names:
        runs = [run_once(name, a.timeout) for _ in range(a.runs)]
        seconds = [r["measured_s"] for r in runs if "measured_s" in r]
        row = {
            "scenario": name,
            "runs": len(runs),
            "measured_s": seconds,
            "median_s": statistics.median(seconds) if seconds else None,
            "max_s": max(seconds) if seconds else None,
            "outcomes": [r["outcome"] for r in runs],
        }
        rows.append(row)
        med = f"{row['median_s']:.3f}" if seconds else "-"
        mx = f"{row['max_s']:.3f}" if seconds else "-"
        print(f"  {name:<22}{len(runs):>5}{med:>10}{mx:>9}  {row['outcomes'][-1][:110]}", flush=True)
    if a.json:
        from delaycomm._tools.output import write_json

        record = {
            "argv": sys.argv,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "delaycomm": os.path.dirname(delaycomm.__file__),
            "timeout_s": a.timeout,
            "loadavg": load,
            "rows": rows,
        }
        write_json(a.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
