"""``python -m delaycomm.bench percall``: what delaycomm adds per call, against the raw backend, and the CI gate on it.

    python -m delaycomm.bench percall                                   # CPU (Gloo): 8 B-1 MiB, every path, 3 runs
    python -m delaycomm.bench percall --device cuda -b 8 -e 256M -f 32  # GPU (NCCL)
    python -m delaycomm.bench percall --json out.json                   # the record: every block time, environment
    python -m delaycomm.bench percall -e 8 --compare bench/baselines/cpu-percall.json   # the gate (exit 1 = slower)

Each run is a fresh process (:mod:`~delaycomm.bench.percall_engine`, started by :mod:`delaycomm._tools.launch`), world
size 1: a raw group (gloo, or nccl on cuda) and a delaycomm group with nothing configured, blocks of ``--calls``
calls alternating between them, ``--blocks`` pairs per (size, path). A run's figure is the median over its pairs of
(delaycomm block - raw block), per call; the reported figure is the median over ``--runs`` runs of those medians, in
process CPU time (wall time too: on a loaded machine it is the noisier one). The ratio (median of delaycomm / raw per
pair) is reported beside it. Statistics: :mod:`~delaycomm.bench.percall_results`; the gate and its rule:
:func:`delaycomm.bench.gate.compare_percall`, docs/benchmark.md ("The per-call gate").

Exit status: 0 fine; 1 the gate failed; 2 bad input; 3 a run failed (its error is printed).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from typing import Any

from delaycomm._tools import args as argtypes
from delaycomm._tools import optional
from delaycomm._tools.launch import run_ranks
from delaycomm._tools.table import Column
from delaycomm._tools.table import format_table as format_columns
from delaycomm.bench import gate, percall_engine
from delaycomm.bench.percall_results import FORMAT, PercallFileError, load, rows
from delaycomm.bench.units import format_size

__all__ = ["main", "build_parser", "measure", "format_table", "RunFailed"]


class RunFailed(RuntimeError):
    """A measuring process failed (the message holds its error)."""


# ---- the table ---------------------------------------------------------------------------------------------------

COLUMNS = (
    Column("size", "B", width=8, key="size_bytes"),
    Column("path", "", width=12, key="path"),
    Column("raw", "cpu us", fmt="{:.2f}", width=8, key="raw_cpu_us"),
    Column("delaycomm", "cpu us", fmt="{:.2f}", width=9, key="dc_cpu_us"),
    Column("added", "cpu us", fmt="{:+.2f}", width=8, key="added_cpu_us"),
    Column(
        "runs min..max",
        "cpu us",
        lambda r: f"{min(r['run_added_cpu_us']):+.1f}..{max(r['run_added_cpu_us']):+.1f}",
        width=14,
    ),
    Column("ratio", "cpu", fmt="{:.3f}", width=6, key="ratio_cpu"),
    Column("raw", "wall us", fmt="{:.2f}", width=9, key="raw_wall_us"),
    Column("added", "wall us", fmt="{:+.2f}", width=9, key="added_wall_us"),
    Column("ratio", "wall", fmt="{:.3f}", width=6, key="ratio_wall"),
)


def header_lines(record: dict[str, Any]) -> list[str]:
    """What was measured where: settings, versions, machine and load (without the ``# `` prefix)."""
    s, env = record["settings"], record.get("environment", {})
    m = env.get("machine", {})
    return [
        f"delaycomm per-call cost: world size 1, {s['device']} ({'nccl' if s['device'] == 'cuda' else 'gloo'} vs "
        f"delaycomm, nothing configured), {len(record['runs'])} runs x {s['blocks']} pairs of blocks x {s['calls']} "
        f"calls, float32"
        + (f", each run pinned to CPU {s['pin_cpu']}" if s.get("pin_cpu") is not None else "")
        + (f", INJECTED {s['inject_us']:g} us of work per delaycomm call" if s["inject_us"] else ""),
        f"torch {env.get('torch', '?')}, delaycomm {env.get('delaycomm', '?')}"
        + (f" ({env['delaycomm_commit']})" if env.get("delaycomm_commit") else "")
        + f", NCCL {env.get('nccl') or '-'}; {m.get('hostname', '?')}: {m.get('cpu', '?')}, "
        f"{m.get('cpu_affinity') or m.get('cpu_count', '?')} cores"
        + (f", {m['gpu']}" if m.get("gpu") else "")
        + (f"; load average {record['loadavg'][0]:.1f}" if record.get("loadavg") else ""),
        "per call: cpu = process CPU time (all threads), wall = elapsed; added = median over runs of the run's "
        "median paired difference delaycomm - raw; ratio likewise of delaycomm / raw",
    ]


def format_table(record: dict[str, Any]) -> str:
    """The report of a record: the header, one row per (size, path), the steadiness over runs, the time taken."""
    rs = rows(record)
    out = [format_columns(COLUMNS, rs, header=header_lines(record), sep=" ")]
    if len(record["runs"]) >= 3:
        out.append(
            "# steadiness: standard deviation over runs of each run's figure, in us/call, as a difference "
            "(delaycomm - raw) and in the gate's ratio form ((ratio - median ratio) x the run's raw cost):"
        )
        for r in rs:
            med = statistics.median(r["run_ratio_cpu"])
            ratio_form = [(q - med) * raw for q, raw in zip(r["run_ratio_cpu"], r["run_raw_cpu_us"])]
            out.append(
                f"#   {format_size(r['size_bytes'])} {r['path']}: difference "
                f"{statistics.stdev(r['run_added_cpu_us']):.2f}, ratio form {statistics.stdev(ratio_form):.2f}"
            )
    if "elapsed_s" in record:
        out.append(f"# measured in {record['elapsed_s']:.1f} s")
    return "\n".join(out)


# ---- measuring ---------------------------------------------------------------------------------------------------


def _one_run(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One run in a fresh interpreter (pinned there when the spec says so); its result."""
    t0 = time.monotonic()
    out = run_ranks(percall_engine.run_process, 1, (spec,), deadline_s=timeout_s, name="percall-run")
    if out.timed_out:
        raise RunFailed(f"a measuring process ran past {timeout_s:g} s and was stopped")
    if out.errors:
        raise RunFailed(f"a measuring process failed:\n{str(out.errors[0])[-4000:]}")
    run = out.results[0]
    run["elapsed_s"] = round(time.monotonic() - t0, 2)
    return run


def measure(spec: dict[str, Any], runs: int, progress: bool, timeout_s: float) -> dict[str, Any]:
    """``runs`` runs of ``spec``, each in a fresh process, as one record (``format`` :data:`FORMAT`).

    Raises:
        RunFailed: a run failed or ran past ``timeout_s``.
    """
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.monotonic()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=runs, file=sys.stderr, unit="run", leave=False, desc="per-call cost")
    record: dict[str, Any] = {"format": FORMAT, "settings": spec, "runs": []}
    try:
        for _ in range(runs):
            run = _one_run(spec, timeout_s)
            record.setdefault("environment", run.pop("environment"))
            run.pop("environment", None)
            record["runs"].append(run)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    record["started_utc"] = started.isoformat(timespec="seconds")
    record["elapsed_s"] = round(time.monotonic() - t0, 2)
    if hasattr(os, "getloadavg"):
        record["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return record


# ---- command line ------------------------------------------------------------------------------------------------


def _us(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; expected microseconds >= 0") from None
    if not 0 <= v < 1e6:
        raise argparse.ArgumentTypeError(f"{text} is out of range; expected microseconds in [0, 1e6)")
    return v


_paths = argtypes.choices_list(tuple(percall_engine.PATHS), "path")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m delaycomm.bench percall",
        description="What delaycomm adds per call, against the raw backend it wraps (one process, world size 1, "
        "paired blocks of calls, each run a fresh process), and the CI gate on it.",
        epilog="paths: "
        + "; ".join(f"{k}: {v.what}" for k, v in percall_engine.PATHS.items())
        + ". Sizes are binary (4K = 4096 B). Exit status: 0 ok; 1 the gate failed; 2 bad input; 3 a run failed.",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="cpu",
        help="cpu: gloo vs delaycomm; cuda: nccl vs delaycomm (default cpu)",
    )
    p.add_argument("-b", "--minbytes", type=argtypes.size, default=8, metavar="SIZE", help="smallest size (default 8)")
    p.add_argument(
        "-e", "--maxbytes", type=argtypes.size, default=1 << 20, metavar="SIZE", help="largest size (default 1M)"
    )
    p.add_argument(
        "-f",
        "--stepfactor",
        type=argtypes.integer(2),
        default=128,
        metavar="F",
        help="multiply the size by F each step (default 128)",
    )
    p.add_argument(
        "--paths",
        type=_paths,
        default=list(percall_engine.PATHS),
        metavar="LIST",
        help="comma-separated: " + ", ".join(percall_engine.PATHS) + " (default all)",
    )
    p.add_argument("--calls", type=argtypes.integer(1), default=400, metavar="N", help="calls per block (default 400)")
    p.add_argument(
        "--blocks",
        type=argtypes.integer(1),
        default=30,
        metavar="N",
        help="measured pairs of blocks per size and path in each run (default 30)",
    )
    p.add_argument(
        "--warmup-blocks", type=argtypes.integer(0), default=2, metavar="N", help="unrecorded pairs first (default 2)"
    )
    p.add_argument(
        "--runs",
        type=argtypes.integer(1),
        default=3,
        metavar="N",
        help="runs, each a fresh process; the figure is the median over runs (default 3)",
    )
    p.add_argument(
        "--pin-cpu",
        action="store_true",
        help="run each measuring process on one CPU (the first this process may use), all its threads together: "
        "where the caller and each group's Gloo worker thread land otherwise decides a run's cost (docs/benchmark.md); "
        "what the CI gate does",
    )
    p.add_argument(
        "--inject-us",
        type=_us,
        default=0.0,
        metavar="US",
        help="TESTING THE GATE: add this much work (us of CPU time on this machine, calibrated) before "
        "every delaycomm call, in this harness (not in the library): a known regression",
    )
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="limit per run in seconds (default 600)")
    p.add_argument(
        "--json",
        type=argtypes.output_path(),
        default=None,
        metavar="FILE",
        help="write the record (every block time, the environment)",
    )
    p.add_argument("--from-json", default=None, metavar="FILE", help="report (and gate) a saved record, not measuring")
    p.add_argument(
        "--compare",
        default=None,
        metavar="BASELINE.json",
        help="gate: exit 1 when delaycomm's per-call cost grew by more than --max-added-us",
    )
    p.add_argument(
        "--max-added-us",
        type=_us,
        default=gate.DEFAULT_MAX_ADDED_US,
        metavar="US",
        help=f"the gate's allowance in us per call (default {gate.DEFAULT_MAX_ADDED_US:g})",
    )
    p.add_argument(
        "--confirm",
        type=argtypes.integer(0),
        default=1,
        metavar="N",
        help="measure failing items again up to N times in fresh runs; fail only if every time (default 1)",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress bar on stderr (default auto: when stderr is a terminal)",
    )
    return p


def _load(path: str, flag: str, p: argparse.ArgumentParser) -> dict[str, Any]:
    try:
        return load(path)
    except PercallFileError as e:
        p.error(f"argument {flag}: {e}")


def _spec(a: argparse.Namespace, p: argparse.ArgumentParser) -> dict[str, Any]:
    """The measuring processes' settings from the flags (cross-flag checks: exit 2)."""
    import torch

    from delaycomm.bench.units import size_sweep

    if a.minbytes > a.maxbytes:
        p.error(f"argument -b/--minbytes: {a.minbytes} B is larger than -e/--maxbytes {a.maxbytes} B")
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        p.error("argument --device: cuda was asked for but torch sees no CUDA device")
    return {
        "device": device,
        "sizes": size_sweep(a.minbytes, a.maxbytes, a.stepfactor),
        "paths": list(a.paths),
        "calls": a.calls,
        "blocks": a.blocks,
        "warmup_blocks": a.warmup_blocks,
        "inject_us": a.inject_us,
        "pin_cpu": min(os.sched_getaffinity(0)) if a.pin_cpu else None,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = build_parser()
    a = p.parse_args(argv)
    baseline = _load(a.compare, "--compare", p) if a.compare else None
    if a.from_json:
        record = _load(a.from_json, "--from-json", p)
    else:
        spec = _spec(a, p)
        progress = optional.progress_enabled(a.progress, sys.stderr.isatty(), p)
        try:
            record = measure(spec, a.runs, progress, a.timeout)
        except RunFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 3
        record["argv"] = ["python", "-m", "delaycomm.bench", "percall", *argv]
    record["rows"] = rows(record)
    if a.json:
        from delaycomm._tools.output import write_json

        write_json(a.json, record)
    print(format_table(record))
    if a.json:
        print(f"# record: {a.json}")
    if baseline is None:
        return 0
    return _gate(a, record, baseline)


def _gate(a: argparse.Namespace, record: dict[str, Any], baseline: dict[str, Any]) -> int:
    """Judge the record; measure failing items again (``--confirm``); print the verdict; the exit status."""
    try:
        verdicts = gate.compare_percall(record, baseline, a.max_added_us)
    except gate.GateError as e:
        print(f"error: --compare {a.compare}: {e}", file=sys.stderr)
        return 2
    for attempt in range(a.confirm if not a.from_json else 0):
        failed = [v for v in verdicts if v.failed]
        if not failed:
            break
        print(gate.format_percall(verdicts, a.max_added_us).replace("gate: FAIL:", "# so far: over the limit:"))
        print(f"# gate: {len(failed)} items over the limit; confirmation {attempt + 1} of {a.confirm} in fresh runs")
        spec = dict(
            record["settings"],
            sizes=sorted({v.size_bytes for v in failed}),
            paths=list(dict.fromkeys(v.path for v in failed)),
        )
        try:
            again = measure(spec, len(record["runs"]), False, a.timeout)
        except RunFailed as e:
            print(f"error: the confirmation run failed: {e}", file=sys.stderr)
            return 3
        # a failing item is judged again by its new runs: it fails only if it fails every time
        redo = {(v.size_bytes, v.path): v for v in gate.compare_percall(again, baseline, a.max_added_us)}
        verdicts = [redo.get((v.size_bytes, v.path), v) if v.failed else v for v in verdicts]
        print(format_table(again))
    print(gate.format_percall(verdicts, a.max_added_us))
    return 1 if any(v.failed for v in verdicts) else 0
