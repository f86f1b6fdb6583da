"""Does a call issued behind others in a step replay its target, or its target behind the earlier calls' draws?

A decisive experiment for docs/delay.md, "Replay into another job". A hand-made profile gives two all-reduce classes
(1 KiB and 64 KiB) the same bimodal latency: 80% of the calls near --fast ms, 20% near --slow ms. Job of 2 ranks
under torchrun, configured by DELAYCOMM_DELAY=profile:FILE alone (a profile's defaults: match mode, one carrier
per call, every call carries a draw). Each step runs one of two patterns, in alternation (so that both see the same
machine load):

  alone    one 64 KiB all-reduce, waited for;
  behind   --ahead 1 KiB all-reduces, then the 64 KiB one, all issued at once (async_op=True, as DDP issues its
           buckets), then waited for.

Each call's experienced latency is timed by the script (from the call to its future completing, on every rank), and
each call's drawn target is computed from the schedule exactly as the backend draws it (every rank computes every
rank's draw: docs/delay.md, "Randomness"). Per pattern and position: the target's p50/p90/mean against the
experienced latency's, and the "stacked" sum of the position's own draw and every earlier draw of its step.
Under overlap (each call's delay counts from its own call) the 64 KiB call behind others experiences the largest
of its step's targets; stacked, their sum; matched to its place, its own target.

  python bench/replay_queue.py --steps 300 --out bench/results/DATE-vm2core-replay-queue/run-1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

import roundtrip  # this directory's job launcher and port helper

BASE = 1.02
SMALL, BIG = 256, 16384  # float32 elements: 1 KiB and 64 KiB


def _bucket(ns: float) -> int:
    return math.floor(math.log(ns) / math.log(BASE))


def write_profile(path: str, fast_ms: float, slow_ms: float, world_size: int = 2) -> None:
    """Both classes: 80 calls spread over [fast, 1.2 fast) ms and 20 over [slow, 1.2 slow) ms (bimodal)."""

    def cls(nbytes: int) -> dict:
        buckets: dict[int, int] = {}
        for i in range(80):
            b = _bucket(fast_ms * 1e6 * (1 + 0.2 * i / 80))
            buckets[b] = buckets.get(b, 0) + 1
        for i in range(20):
            b = _bucket(slow_ms * 1e6 * (1 + 0.2 * i / 20))
            buckets[b] = buckets.get(b, 0) + 1
        return {
            "bytes": nbytes,
            "count": 100,
            "zeros": 0,
            "min_ns": fast_ms * 1e6,
            "max_ns": slow_ms * 1.2e6,
            "buckets": sorted([b, c] for b, c in buckets.items()),
        }

    doc = {
        "format": "delaycomm-profile",
        "version": 1,
        "histogram": {"base": BASE, "unit": "ns"},
        "metadata": {"world_size": world_size, "source": "bench/replay_queue.py (hand-made, bimodal)"},
        "ops": {"allreduce": [cls(SMALL * 4), cls(BIG * 4)]},
    }
    with open(path, "w") as f:
        json.dump(doc, f)


def worker(steps: int, warmup: int, ahead: int, out: str) -> None:
    """One rank: the two patterns in alternation; every call's experienced latency and its drawn target."""
    import torch
    import torch.distributed as dist

    import delaycomm
    from delaycomm import _C

    dist.init_process_group("delaycomm")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = delaycomm.resolve(env=dict(os.environ))
    # The backend's own schedule, rebuilt here (a pure function of the options): every call's carrier and draw.
    sched = _C.DelaySchedule(os.environ["DELAYCOMM_DELAY"], cfg.delay_fraction, seed=cfg.seed, carrier_size=world)
    stream = _allreduce_kind()
    small, big = torch.ones(SMALL), torch.ones(BIG)
    rows = []
    seq = 0  # the group's collective count: the draw's position (DelayBackend::admit)

    def target(nbytes: int, s: int) -> float:
        c = sched.carrier(stream, s)
        return sched.delay_ns(c, stream, s, "allreduce", nbytes) / 1e6 if c >= 0 else 0.0

    for i in range(warmup + steps):
        pattern = "alone" if i % 2 == 0 else "behind"
        tensors = [big] if pattern == "alone" else [small] * ahead + [big]
        done: list[float] = [0.0] * len(tensors)
        calls, seqs, futs = [], [], []
        for j, t in enumerate(tensors):
            seq += 1
            seqs.append(seq)
            calls.append(time.perf_counter())
            fut = dist.all_reduce(t, async_op=True).get_future()
            fut.add_done_callback(lambda _f, j=j, done=done: done.__setitem__(j, time.perf_counter()))
            futs.append(fut)
        for f in futs:
            f.wait()
        deadline = time.perf_counter() + 1.0
        while not all(done) and time.perf_counter() < deadline:
            time.sleep(0.0005)
        targets = [target(t.numel() * 4, s) for t, s in zip(tensors, seqs)]
        for j in range(len(tensors)):
            rows.append(
                {
                    "pattern": pattern,
                    "step": i,
                    "warm": i < warmup,
                    "pos": j,
                    "bytes": tensors[j].numel() * 4,
                    "target_ms": targets[j],
                    # delay_place=step: the draw of the run the step's first call opens, for this call's class
                    "placed_ms": target(tensors[j].numel() * 4, seqs[0]),
                    "stacked_ms": sum(targets[: j + 1]),
                    "largest_ms": max(t0 - (calls[j] - c0) * 1e3 for t0, c0 in zip(targets[: j + 1], calls)),
                    "experienced_ms": (done[j] - calls[j]) * 1e3,
                }
            )
    g = delaycomm.stats(dist.group.WORLD)
    dist.barrier()
    dist.destroy_process_group()
    with open(out.format(rank=rank), "w") as f:
        json.dump({"rank": rank, "rows": rows, "match": g["ops"]["allreduce"]["match"]}, f)


def _allreduce_kind() -> int:
    from delaycomm import _ops

    return int(_ops.BY_NAME["allreduce"].kind)


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = q * (len(s) - 1)
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(rows: list[dict]) -> list[dict]:
    """Per (pattern, position): p50/p90/mean of the target, the experienced latency, the stacked sum, the largest."""
    out = []
    rows = [r for r in rows if not r["warm"]]
    for key in sorted({(r["pattern"], r["pos"]) for r in rows}):
        sel = [r for r in rows if (r["pattern"], r["pos"]) == key]
        row: dict = {"pattern": key[0], "pos": key[1], "bytes": sel[0]["bytes"], "calls": len(sel)}
        for field in ("target_ms", "placed_ms", "experienced_ms", "largest_ms", "stacked_ms"):
            xs = [r[field] for r in sel]
            row[field] = {
                "p50": round(_q(xs, 0.5), 3),
                "p90": round(_q(xs, 0.9), 3),
                "mean": round(sum(xs) / len(xs), 3),
            }
        # Per call: experienced minus its own target (what the call got beyond its draw).
        excess = [r["experienced_ms"] - r["target_ms"] for r in sel]
        row["excess_over_target_ms"] = {"p50": round(_q(excess, 0.5), 3), "mean": round(sum(excess) / len(excess), 3)}
        excess = [r["experienced_ms"] - r["placed_ms"] for r in sel]
        row["excess_over_placed_ms"] = {"p50": round(_q(excess, 0.5), 3), "mean": round(sum(excess) / len(excess), 3)}
        out.append(row)
    return out


def before_calibration(rows: list[dict], first: int = 16) -> list[dict]:
    """Per size class, the first `first` steps' calls of the class (its estimate is calibrated after 16 of the
    carrier's observations: docs/delay.md, "Match mode") against the calibrated calls: experienced minus target."""
    out = []
    for nbytes in sorted({r["bytes"] for r in rows}):
        sel = [r for r in rows if r["bytes"] == nbytes and r["pos"] == 0]  # nothing issued ahead of it
        early = [r["experienced_ms"] - r["target_ms"] for r in sel if r["step"] < first]
        late = [r["experienced_ms"] - r["target_ms"] for r in sel if not r["warm"]]
        out.append(
            {
                "bytes": nbytes,
                "early_calls": len(early),
                "early_excess_ms": {"p50": round(_q(early, 0.5), 3), "max": round(max(early), 3)},
                "calibrated_excess_ms": {"p50": round(_q(late, 0.5), 3), "p90": round(_q(late, 0.9), 3)},
            }
        )
    return out


def format_table(summary: list[dict]) -> str:
    lines = [
        "| pattern | pos | bytes | calls | own draw p50/p90/mean (ms) | run's draw (step) p50/p90/mean | experienced "
        "p50/p90/mean | largest of the step's own draws p50/mean | stacked sum p50/mean | experienced - own draw "
        "p50/mean | experienced - run's draw p50/mean |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        t, pl, e, lg, st = (r[k] for k in ("target_ms", "placed_ms", "experienced_ms", "largest_ms", "stacked_ms"))
        x, y = r["excess_over_target_ms"], r["excess_over_placed_ms"]
        lines.append(
            f"| {r['pattern']} | {r['pos']} | {r['bytes']} | {r['calls']} | {t['p50']:.2f} / {t['p90']:.2f} / "
            f"{t['mean']:.2f} | {pl['p50']:.2f} / {pl['p90']:.2f} / {pl['mean']:.2f} | {e['p50']:.2f} / "
            f"{e['p90']:.2f} / {e['mean']:.2f} | {lg['p50']:.2f} / {lg['mean']:.2f} | {st['p50']:.2f} / "
            f"{st['mean']:.2f} | {x['p50']:+.2f} / {x['mean']:+.2f} | {y['p50']:+.2f} / {y['mean']:+.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="timed steps (both patterns together; default 300)")
    ap.add_argument("--warmup", type=int, default=40, help="untimed steps first (calibration; default 40)")
    ap.add_argument("--ahead", type=int, default=3, help="1 KiB calls issued ahead of the 64 KiB one (default 3)")
    ap.add_argument("--fast", type=float, default=3.0, help="the fast mode of the bimodal profile, ms (default 3)")
    ap.add_argument("--slow", type=float, default=30.0, help="the slow mode, ms (default 30)")
    ap.add_argument("--out", help="output directory (created)")
    ap.add_argument(
        "--places",
        default="step,call",
        help="delay_place values to run, one job each, side by side (default step,call: after and before the fix)",
    )
    ap.add_argument("--env", action="append", default=[], help="extra DELAYCOMM_X=V for the job (repeatable)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rows-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.steps, args.warmup, args.ahead, args.rows_out)
        return 0
    if not args.out:
        ap.error("--out is required")
    os.makedirs(args.out, exist_ok=True)
    profile = os.path.abspath(os.path.join(args.out, "profile.json"))
    write_profile(profile, args.fast, args.slow)
    for place in [p for p in args.places.split(",") if p]:
        out = os.path.join(args.out, f"place-{place}")
        os.makedirs(out, exist_ok=True)
        env = {"DELAYCOMM_DELAY": f"profile:{profile}", "DELAYCOMM_DELAY_PLACE": place}
        for kv in args.env:
            k, _, v = kv.partition("=")
            env[k] = v
        rows_out = os.path.join(out, "rows.rank{rank}.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port"]
        cmd += [str(roundtrip._free_port()), __file__, "--worker", "--steps", str(args.steps)]
        cmd += ["--warmup", str(args.warmup), "--ahead", str(args.ahead), "--rows-out", rows_out]
        load_before = os.getloadavg()
        t0 = time.time()
        with open(os.path.join(out, "job.log"), "w") as log:
            roundtrip.run_job("replay_queue", f"place-{place}", cmd, env, log, 900.0)
        meta = {
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "wall_s": round(time.time() - t0, 1),
            "env": env,
            "args": {k: v for k, v in vars(args).items() if k not in ("worker", "rows_out")},
        }
        with open(os.path.join(out, "meta.json"), "w") as f:
            json.dump(meta, f)
        print(f"## delay_place={place}")
        report(out)
    return 0


def report(out: str) -> int:
    """Summarises a finished run's rows into OUT/result.json and prints its table."""
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    rows_out = os.path.join(out, "rows.rank{rank}.json")
    rows, match = [], []
    for r in range(2):
        with open(rows_out.format(rank=r)) as f:
            doc = json.load(f)
        rows += [{**x, "rank": r} for x in doc["rows"]]
        match.append(doc["match"])
    summary = summarize(rows)
    early = before_calibration(rows)
    result = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count()},
        **meta,
        "match_counts_by_rank": match,
        "summary": summary,
        "before_calibration": early,
    }
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(format_table(summary))
    for e in early:
        print(f"before calibration, {e['bytes']} B (first steps' calls at no queue): {e}")
    print(f"load {meta['load_before'][0]:.1f} -> {meta['load_after'][0]:.1f}; {meta['wall_s']} s")
    return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
