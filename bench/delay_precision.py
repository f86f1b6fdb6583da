"""Delay precision and delay=none overhead of delaycomm. JSON on stdout or --json FILE.

  python bench/delay_precision.py                # CPU precision (issuer thread and host sleep) + overhead
  python bench/delay_precision.py --gpu          # + the GPU sleep kernel's precision (CUDA events)

Precision: |actual - requested| for const delays of 1, 10, 100 ms (target, docs/benchmark.md, "Targets": p99 <=
200 us on CPU, <= 10 us on GPU). "issuer": a world-size-1 delaycomm group delays every all_reduce on the network path;
actual = the call's completion time minus the median completion time of the same op without delay (measured in
the same run).
"host_sleep": the precise sleep the host path uses. "gpu_kernel": CUDA events around the sleep kernel.
Overhead: delay=none delaycomm vs raw Gloo, 2 ranks (started by the tools' launcher, delaycomm._tools.launch),
interleaved A/B blocks; the ratio of medians per size (target, docs/benchmark.md, "Targets": <= 1.03 at >= 64 KiB,
<= 1.10 at 8 B-4 KiB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _summary_us(errors_s: list[float]) -> dict[str, float]:
    a = [abs(e) * 1e6 for e in errors_s]
    return {
        "n": len(a),
        "p50_us": _pct(a, 0.5),
        "p99_us": _pct(a, 0.99),
        "max_us": max(a),
        "mean_signed_us": statistics.fmean(errors_s) * 1e6,
    }


def cpu_precision(delays_ms: list[float], n: int) -> dict:
    import delaycomm
    from delaycomm import _C

    out: dict = {"issuer": {}, "host_sleep": {}}
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method=f"file://{d}/s", rank=0, world_size=1)
        t = torch.ones(1)
        base_g = dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(delay="none"))
        for ms in delays_ms:
            g = dist.new_group(
                backend="delaycomm",
                pg_options=delaycomm.DelayConfig(delay=f"const:{ms}ms", delay_fraction=1.0, delay_ops="allreduce"),
            )
            base, got = [], []
            reps = max(10, int(n * min(1.0, 10.0 / ms)))
            for _ in range(reps):
                t0 = time.perf_counter()
                dist.all_reduce(t, group=base_g)
                base.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                dist.all_reduce(t, group=g)
                got.append(time.perf_counter() - t0)
            b = statistics.median(base)
            out["issuer"][f"{ms:g}ms"] = {**_summary_us([x - b - ms * 1e-3 for x in got]), "base_median_us": b * 1e6}
            errs = []
            for _ in range(reps):
                t0 = time.perf_counter()
                _C.sleep_precise(ms * 1e-3)
                errs.append(time.perf_counter() - t0 - ms * 1e-3)
            out["host_sleep"][f"{ms:g}ms"] = _summary_us(errs)
        dist.destroy_process_group()
    return out


def gpu_precision(delays_ms: list[float], n: int) -> dict:
    from delaycomm import _C

    if not torch.cuda.is_available() or not hasattr(_C, "_gpu_sleep"):
        return {"skipped": "no CUDA device or no CUDA sources in this build"}

    def timed(ns: int) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        _C._gpu_sleep(0, ns)
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e-3

    timed(1)  # loads the kernel
    # The events also time the kernel's launch and exit: a 1 ns sleep measures that, subtracted in "corrected".
    launch = statistics.median(timed(1) for _ in range(200))
    out = {"launch_overhead_us": launch * 1e6}
    for ms in [0.01, 0.1] + delays_ms:
        errs = [timed(int(ms * 1e6)) - ms * 1e-3 for _ in range(max(10, int(n * min(1.0, 10.0 / ms))))]
        out[f"{ms:g}ms"] = {"raw": _summary_us(errs), "corrected": _summary_us([e - launch for e in errs])}
    return out


def _overhead_rank(rank: int, world: int, post, init_method: str, sizes: list[int], iters: int, blocks: int) -> dict:
    import delaycomm

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    groups = {
        "delaycomm": dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(delay="none")),
        "gloo": dist.new_group(backend="gloo"),
    }
    res = {}
    for size in sizes:
        t = torch.ones(max(1, size // 4))
        med = {k: [] for k in groups}
        for blk in range(blocks):
            order = list(groups) if blk % 2 == 0 else list(reversed(groups))
            for name in order:
                g = groups[name]
                for _ in range(3):
                    dist.all_reduce(t, group=g)
                times = []
                for _ in range(iters):
                    t0 = time.perf_counter()
                    dist.all_reduce(t, group=g)
                    times.append(time.perf_counter() - t0)
                med[name].append(statistics.median(times))
        ratios = [a / b for a, b in zip(med["delaycomm"], med["gloo"])]
        res[size] = {
            "delaycomm_p50_us": statistics.median(med["delaycomm"]) * 1e6,
            "gloo_p50_us": statistics.median(med["gloo"]) * 1e6,
            "ratio_median": statistics.median(ratios),
            "ratios": ratios,
        }
    dist.destroy_process_group()
    return res


def overhead(world: int, sizes: list[int], iters: int, blocks: int) -> dict:
    from delaycomm._tools.launch import run_ranks

    with tempfile.TemporaryDirectory() as d:
        out = run_ranks(
            _overhead_rank, world, (f"file://{d}/store", sizes, iters, blocks), deadline_s=600.0, name="overhead-rank"
        )
    if out.errors:
        rank = min(out.errors)
        raise RuntimeError(f"overhead: rank {rank} failed:\n{out.errors[rank]}")
    if out.timed_out:
        raise RuntimeError(f"overhead: ranks {sorted(set(range(world)) - set(out.results))} still running after 600 s")
    results = out.results
    return {
        "world_size": world,
        "iters": iters,
        "blocks": blocks,
        "by_size_bytes": {str(s): results[0][s] for s in sizes},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delays-ms", default="1,10,100", help="requested const delays, comma-separated (ms)")
    ap.add_argument("--samples", type=int, default=200, help="samples per delay (fewer for long delays)")
    ap.add_argument("--gpu", action="store_true", help="also measure the GPU sleep kernel")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU precision measurement")
    ap.add_argument("--no-overhead", action="store_true", help="skip the delay=none overhead measurement")
    ap.add_argument("--sizes", default="8,4096,65536,1048576", help="overhead message sizes in bytes")
    ap.add_argument("--iters", type=int, default=100, help="overhead: calls per block")
    ap.add_argument("--blocks", type=int, default=6, help="overhead: interleaved A/B blocks")
    ap.add_argument("--json", metavar="FILE", help="write the JSON here instead of stdout")
    args = ap.parse_args(argv)
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    import delaycomm

    delays = [float(x) for x in args.delays_ms.split(",")]
    out = {
        "argv": sys.argv,
        "torch": torch.__version__,
        "delaycomm": delaycomm.__version__,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
    }
    if not args.no_cpu:
        out["cpu_precision"] = cpu_precision(delays, args.samples)
    if args.gpu:
        out["gpu_precision"] = gpu_precision(delays, args.samples)
    if not args.no_overhead:
        out["overhead_delay_none"] = overhead(2, [int(s) for s in args.sizes.split(",")], args.iters, args.blocks)
    text = json.dumps(out, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
