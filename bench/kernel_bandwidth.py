"""Bandwidth of the fused pack/blend kernel against the unfused torch ops and a plain copy, in the same run.

    python bench/kernel_bandwidth.py --device cpu --sizes 4M,64M --dtypes float32,bfloat16 --stale 1 --stash
    python bench/kernel_bandwidth.py --device cuda --json blend_h200.json      # 64 MiB .. 1 GiB, float32 + bfloat16

Each row is one (size, dtype) case; three implementations run interleaved, repeat by repeat, so that a busy
machine slows all three alike:

- ``fused``: ``delaycomm._C._fused_blend`` (stash = grad; grad = a * grad + sum_i b_i * stale_i), one pass.
- ``unfused``: the cheapest torch op sequence for the same blend, in place: ``stash.copy_(grad)``,
  ``grad.mul_(a)``, ``grad.add_(stale_i, alpha=b_i)`` per stale tensor. For bfloat16/float16 it rounds after every
  op (the kernel rounds once), so it is the less precise and the faster baseline of the two that torch offers.
- ``unfused_acc``: the torch op sequence with the kernel's precision: for bfloat16/float16 it accumulates in a
  float32 copy (``g.float().mul_(a)``, ``add_(stale_i.float(), alpha=b_i)``, ``g.copy_(acc)``); for
  float32/float64 it is ``unfused``.
- ``copy``: ``dst.copy_(src)`` moving as many bytes (read + written) as the fused kernel does.

The bytes the fused kernel must move (docs/kernels.md): grad read once and written once, each stale tensor read
once, the stash written once: ``(2 + stale + stash) * size``. Every GB/s column divides those same bytes by that
implementation's time (so ``unfused`` GB/s is an effective rate, not the bytes it really moves);
``fused/copy`` is the fraction of the copy bandwidth the kernel reaches, ``unfused/fused`` its speedup.
Times are per call: median (p50) and p90 over ``--iters`` timed repeats, after ``--warmup`` untimed ones.
CUDA times come from CUDA events around each call; CPU times from ``time.perf_counter``.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import delaycomm
from delaycomm import _C
from delaycomm._tools import table as tools_table
from delaycomm._tools.args import size_list
from delaycomm._tools.output import write_json
from delaycomm._tools.table import Column

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
DEFAULT_SIZES = {"cpu": "1M,16M,64M", "cuda": "64M,256M,1G"}
DEFAULT_DTYPES = {"cpu": "float32,bfloat16", "cuda": "float32,bfloat16"}
FRESH_SCALE = 0.9  # (1 - alpha) with the default ema_alpha 0.1
STALE_SCALE = 0.1
NOISE_WARN = 0.15  # (p90 - p50) / p50 above which a row is flagged as noisy


# ---- the three implementations ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """The tensors of one (size, dtype) case; every implementation works on them in place."""

    grad: torch.Tensor
    stale: list[torch.Tensor]
    stash: torch.Tensor | None
    src: torch.Tensor  # the copy's source and destination: together as many bytes as the fused kernel moves
    dst: torch.Tensor

    @property
    def scales(self) -> list[float]:
        return [STALE_SCALE / max(1, len(self.stale))] * len(self.stale)


def fused(case: Case) -> None:
    _C._fused_blend(case.grad, FRESH_SCALE, case.stale, case.scales, case.stash)


def unfused(case: Case) -> None:
    unfused_inplace(case, stash=True)


def unfused_inplace(case: Case, stash: bool) -> None:
    g = case.grad
    if stash and case.stash is not None:
        case.stash.copy_(g)
    g.mul_(FRESH_SCALE)
    for s, b in zip(case.stale, case.scales):
        g.add_(s, alpha=b)


def unfused_acc(case: Case) -> None:
    g = case.grad
    if case.stash is not None:
        case.stash.copy_(g)
    if g.dtype in (torch.float32, torch.float64):
        unfused_inplace(case, stash=False)
        return
    acc = g.float().mul_(FRESH_SCALE)
    for s, b in zip(case.stale, case.scales):
        acc.add_(s.float(), alpha=b)
    g.copy_(acc)


def copy(case: Case) -> None:
    case.dst.copy_(case.src)


IMPLS: dict[str, Callable[[Case], None]] = {
    "fused": fused,
    "unfused": unfused,
    "unfused_acc": unfused_acc,
    "copy": copy,
}


def bytes_moved(numel: int, element_size: int, stale: int, stash: bool) -> int:
    """Bytes the fused kernel reads plus writes: grad read and written, each stale read, the stash written."""
    return (2 + stale + int(stash)) * numel * element_size


def make_case(size_bytes: int, dtype: torch.dtype, stale: int, stash: bool, device: str) -> Case:
    element_size = torch.empty((), dtype=dtype).element_size()
    numel = size_bytes // element_size
    gen = torch.Generator(device=device).manual_seed(0)

    def randn() -> torch.Tensor:
        return torch.randn(numel, dtype=dtype, device=device, generator=gen)

    moved = bytes_moved(numel, element_size, stale, stash)
    src = torch.empty(moved // 2, dtype=torch.uint8, device=device).fill_(1)
    return Case(
        grad=randn(),
        stale=[randn() for _ in range(stale)],
        stash=torch.empty(numel, dtype=dtype, device=device) if stash else None,
        src=src,
        dst=torch.empty_like(src),
    )


# ---- the engine: warm-up, interleaved timed repeats ---------------------------------------------------------------


def time_calls(fn: Callable[[], None], device: str, repeats: int) -> list[float]:
    """Seconds per call, one sample per call."""
    samples = []
    if device == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        samples = [start.elapsed_time(end) * 1e-3 for start, end in events]
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return samples


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def run_case(case: Case, device: str, warmup: int, iters: int, rounds: int) -> dict[str, list[float]]:
    """Interleaves the implementations: `rounds` rounds, each timing iters // rounds calls of each."""
    samples: dict[str, list[float]] = {name: [] for name in IMPLS}
    for impl in IMPLS.values():
        time_calls(lambda impl=impl: impl(case), device, warmup)
    per_round = max(1, iters // rounds)
    for _ in range(rounds):
        for name, impl in IMPLS.items():
            samples[name] += time_calls(lambda impl=impl: impl(case), device, per_round)
    return samples


# ---- reporting: one schema for the table and the JSON -------------------------------------------------------------


# (key, header, unit, format): the table's header, units row and rows are generated from this.
def _bytes_cell(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda row: format_bytes(row[key])


COLUMNS = [
    Column("size", "B", _bytes_cell("size_bytes")),
    Column("type", "", key="dtype"),
    Column("stale", "", key="stale"),
    Column("stash", "", lambda row: "yes" if row["stash"] else "no"),
    Column("moved", "B", _bytes_cell("moved_bytes")),
    Column("fused", "us", key="fused_p50_us", fmt="{:.1f}"),
    Column("unfused", "us", key="unfused_p50_us", fmt="{:.1f}"),
    Column("unf_acc", "us", key="unfused_acc_p50_us", fmt="{:.1f}"),
    Column("copy", "us", key="copy_p50_us", fmt="{:.1f}"),
    Column("fused", "GB/s", key="fused_GBps", fmt="{:.1f}"),
    Column("unfused", "GB/s", key="unfused_GBps", fmt="{:.1f}"),
    Column("copy", "GB/s", key="copy_GBps", fmt="{:.1f}"),
    Column("fused/copy", "", key="fused_over_copy", fmt="{:.2f}"),
    Column("unfused/fused", "", key="unfused_over_fused", fmt="{:.2f}"),
    Column("unf_acc/fused", "", key="unfused_acc_over_fused", fmt="{:.2f}"),
]


def format_bytes(n: int) -> str:
    for suffix, unit in (("G", UNITS["G"]), ("M", UNITS["M"]), ("K", UNITS["K"])):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def summarize(size_bytes: int, dtype: str, stale: int, stash: bool, moved: int, samples: dict) -> dict[str, Any]:
    row: dict[str, Any] = {
        "size_bytes": size_bytes,
        "dtype": dtype,
        "stale": stale,
        "stash": stash,
        "moved_bytes": moved,
    }
    for name, xs in samples.items():
        row[f"{name}_p50_us"] = percentile(xs, 0.5) * 1e6
        row[f"{name}_p90_us"] = percentile(xs, 0.9) * 1e6
        row[f"{name}_min_us"] = min(xs) * 1e6
        row[f"{name}_mean_us"] = statistics.fmean(xs) * 1e6
        row[f"{name}_GBps"] = moved / (row[f"{name}_p50_us"] * 1e-6) / 1e9
    row["fused_over_copy"] = row["fused_GBps"] / row["copy_GBps"]
    row["unfused_over_fused"] = row["unfused_p50_us"] / row["fused_p50_us"]
    row["unfused_acc_over_fused"] = row["unfused_acc_p50_us"] / row["fused_p50_us"]
    row["noisy"] = [name for name in samples if row[f"{name}_p90_us"] > (1 + NOISE_WARN) * row[f"{name}_p50_us"]]
    return row


def format_table(rows: list[dict[str, Any]]) -> str:
    """The header, units row and rows, all from COLUMNS (the tools' table: every column as wide as its widest
    cell)."""
    return tools_table.format_table(COLUMNS, rows, sep=" ")


def settings_header(args: argparse.Namespace, device_name: str) -> dict[str, Any]:
    return {
        "argv": sys.argv,
        "torch": torch.__version__,
        "delaycomm": delaycomm.__version__,
        "python": platform.python_version(),
        "device": args.device,
        "device_name": device_name,
        "cpu_threads": torch.get_num_threads(),
        "cpu_isa": _C._blend_cpu_isa(),
        "cuda_compiled": bool(_C.cuda_compiled),
        "warmup": args.warmup,
        "iters": args.iters,
        "rounds": args.rounds,
        "fresh_scale": FRESH_SCALE,
        "stale_scale": STALE_SCALE,
    }


# ---- command line -------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the tensors live (default: cpu)")
    p.add_argument(
        "--sizes",
        type=size_list,
        help="comma-separated bucket sizes in bytes, K/M/G suffixes (default: 1M,16M,64M on cpu; 64M,256M,1G on cuda)",
    )
    p.add_argument(
        "--dtypes", help="comma-separated dtypes among " + ", ".join(DTYPES) + " (default: float32,bfloat16)"
    )
    p.add_argument("--stale", type=int, default=1, help="stale tensors blended per call (default: 1)")
    p.add_argument(
        "--stash",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also stash the fresh gradient (default: yes)",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed calls of each implementation (default: 3)")
    p.add_argument("--iters", type=int, default=30, help="timed calls of each implementation (default: 30)")
    p.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds the timed calls are split into (default: 5)"
    )
    p.add_argument("--threads", type=int, help="torch intra-op threads on cpu (default: torch's)")
    p.add_argument("--json", metavar="FILE", help="write the settings and every row as JSON")
    args = p.parse_args(argv)
    args.sizes = args.sizes or size_list(DEFAULT_SIZES[args.device])
    names = (args.dtypes or DEFAULT_DTYPES[args.device]).split(",")
    for name in names:
        if name not in DTYPES:
            p.error(f"--dtypes: {name!r} is not one of {', '.join(DTYPES)}")
    args.dtypes = names
    for flag in ("stale", "warmup", "iters", "rounds"):
        minimum = 0 if flag in ("stale", "warmup") else 1
        if getattr(args, flag) < minimum:
            p.error(f"--{flag} must be >= {minimum}, got {getattr(args, flag)}")
    if args.device == "cuda" and not (torch.cuda.is_available() and _C.cuda_compiled):
        p.error(
            "--device cuda needs a CUDA device and a delaycomm built with CUDA "
            f"(torch.cuda.is_available()={torch.cuda.is_available()}, cuda_compiled={_C.cuda_compiled})"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device_name = (
        torch.cuda.get_device_name() if args.device == "cuda" else (platform.processor() or platform.machine())
    )
    settings = settings_header(args, device_name)
    print("# " + " ".join(f"{k}={v}" for k, v in settings.items() if k != "argv"))
    rows = []
    for size in args.sizes:
        for dtype in args.dtypes:
            case = make_case(size, DTYPES[dtype], args.stale, args.stash, args.device)
            samples = run_case(case, args.device, args.warmup, args.iters, args.rounds)
            moved = bytes_moved(case.grad.numel(), case.grad.element_size(), args.stale, args.stash)
            rows.append(summarize(size, dtype, args.stale, args.stash, moved, samples))
            del case
            if args.device == "cuda":
                torch.cuda.empty_cache()
    print(format_table(rows))
    for row in rows:
        for name in row["noisy"]:
            print(
                f"# warning: {format_bytes(row['size_bytes'])} {row['dtype']} {name}: p90 is "
                f"{row[f'{name}_p90_us'] / row[f'{name}_p50_us'] - 1:.0%} over p50; rerun with more --iters "
                "or on a quieter machine",
                file=sys.stderr,
            )
    if args.json:
        write_json(args.json, {"settings": settings, "rows": rows})
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
