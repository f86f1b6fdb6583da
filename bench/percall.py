"""What delaycomm adds per call: delaycomm vs the raw backend in one process, world size 1, paired blocks.

    python bench/percall.py                                   # CPU (Gloo): 8 B-1 MiB, every path, 3 runs
    python bench/percall.py --device cuda -b 8 -e 256M -f 32  # GPU (NCCL)
    python bench/percall.py --json out.json                   # the record: every block time, environment
    python bench/percall.py -e 8 --compare bench/baselines/cpu-percall.json   # the CI gate (exit 1 = regression)

Each run is a fresh process (``bench/percall_engine.py``): a raw group (gloo, or nccl on cuda) and a delaycomm group
with nothing configured, blocks of ``--calls`` calls alternating between them, ``--blocks`` pairs per (size, path).
A run's figure is the median over its pairs of (delaycomm block - raw block), per call; the reported figure is the
median over ``--runs`` runs of those medians, in process CPU time (wall time too: on a loaded machine it is the
noisier one). The ratio (median of delaycomm / raw per pair) is reported beside it. The gate and its rule:
``docs/benchmark.md`` ("The per-call gate"), and :func:`gate` below.

Exit status: 0 fine; 1 the gate failed; 2 bad input; 3 a run failed (its error is printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from delaycomm._tools import args as argtypes
from delaycomm.bench.gate import count_over, majority_over

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import percall_engine  # noqa: E402  (a sibling file: bench/ is not a package)

FORMAT = "delaycomm-percall/1"
DEFAULT_MAX_ADDED_US = 2.5


class RunFailed(RuntimeError):
    """A measuring process failed (the message holds its error output)."""


# ---- statistics: every figure comes from the block times, by these functions ------------------------------------


def _median(xs):
    return statistics.median(xs) if xs else None


def run_stats(item: dict[str, Any]) -> dict[str, float]:
    """One run's figures for one (size, path): medians over its pairs."""
    pairs = list(zip(item["raw_cpu_us"], item["dc_cpu_us"], item["raw_wall_us"], item["dc_wall_us"]))
    return {
        "raw_cpu_us": _median([p[0] for p in pairs]),
        "dc_cpu_us": _median([p[1] for p in pairs]),
        "added_cpu_us": _median([p[1] - p[0] for p in pairs]),
        "ratio_cpu": _median([p[1] / p[0] for p in pairs if p[0] > 0]),
        "raw_wall_us": _median([p[2] for p in pairs]),
        "added_wall_us": _median([p[3] - p[2] for p in pairs]),
        "ratio_wall": _median([p[3] / p[2] for p in pairs if p[2] > 0]),
    }


def rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (size, path): the median over runs of each run's figures, and the per-run values."""
    keyed: dict[tuple[int, str], list[dict[str, float]]] = {}
    for run in record["runs"]:
        for it in run["items"]:
            keyed.setdefault((it["size_bytes"], it["path"]), []).append(run_stats(it))
    out = []
    for (size, path), per_run in keyed.items():
        row = {"size_bytes": size, "path": path}
        for k in per_run[0]:
            row[k] = _median([r[k] for r in per_run])
            row[f"run_{k}"] = [r[k] for r in per_run]
        out.append(row)
    return out


# ---- the gate --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
    size_bytes: int
    path: str
    baseline_ratio: float
    baseline_added_us: float
    regression_us: float  # median over runs
    run_regression_us: tuple[float, ...]
    limit_us: float

    @property
    def runs_over(self) -> int:
        return count_over(self.run_regression_us, self.limit_us)

    @property
    def failed(self) -> bool:
        """The gate's rule (:func:`delaycomm.bench.gate.majority_over`) over this item's per-run regressions."""
        return majority_over(self.run_regression_us, self.limit_us)


def gate(current: dict[str, Any], baseline: dict[str, Any], max_added_us: float) -> list[Verdict]:
    """Judge ``current`` against ``baseline``: did delaycomm's per-call cost grow by more than ``max_added_us``?

    A run's regression, in µs per call at this machine's speed, is (ratio - baseline ratio) x raw cost, all of this
    run: the baseline contributes only its ratio, a relative figure, so a slower or faster machine neither fails nor
    hides a regression (docs/benchmark.md says why the ratio and not the difference). An item fails by the gate's
    majority rule (:func:`delaycomm.bench.gate.majority_over`): the median over runs is above the limit and a
    majority of runs are.

    Raises:
        ValueError: a different device, or no (size, path) in common.
    """
    for what in ("device", "pin_cpu"):
        a, b = current["settings"].get(what), baseline["settings"].get(what)
        if a != b:
            raise ValueError(
                f"the baseline was measured with {what} {b!r}, this run with {a!r}: measure a baseline "
                "with the same settings (--update-baseline)"
            )
    base = {(r["size_bytes"], r["path"]): r for r in rows(baseline)}
    verdicts = []
    for r in rows(current):
        b = base.get((r["size_bytes"], r["path"]))
        if b is None:
            continue
        per_run = tuple((ratio - b["ratio_cpu"]) * raw for ratio, raw in zip(r["run_ratio_cpu"], r["run_raw_cpu_us"]))
        verdicts.append(
            Verdict(
                size_bytes=r["size_bytes"],
                path=r["path"],
                baseline_ratio=b["ratio_cpu"],
                baseline_added_us=b["added_cpu_us"],
                regression_us=statistics.median(per_run),
                run_regression_us=per_run,
                limit_us=max_added_us,
            )
        )
    if not verdicts:
        raise ValueError("this run and the baseline have no (size, path) in common: run the baseline's sizes and paths")
    return verdicts


def format_gate(verdicts: list[Verdict], max_added_us: float) -> str:
    lines = [
        f"# gate: regression = (ratio - baseline ratio) x raw CPU us per call, per run; fails when the median "
        f"over runs and a majority of runs exceed {max_added_us:g} us/call",
        f"# {'size':>8} {'path':<12} {'base ratio':>10} {'regression':>13} {'runs over':>9}  runs (us)  verdict",
    ]
    for v in verdicts:
        lines.append(
            f"  {_fmt_size(v.size_bytes):>8} {v.path:<12} {v.baseline_ratio:>10.3f} "
            f"{v.regression_us:>+10.2f} us "
            f"{v.runs_over:>5}/{len(v.run_regression_us):<3}  "
            f"{', '.join(f'{x:+.2f}' for x in v.run_regression_us)}  {'FAIL' if v.failed else 'ok'}"
        )
    failed = [v for v in verdicts if v.failed]
    lines.append(
        f"gate: {'FAIL' if failed else 'PASS'}: "
        + (
            f"delaycomm costs more than {max_added_us:g} us/call over its baseline at "
            + ", ".join(f"{_fmt_size(v.size_bytes)} {v.path} ({v.regression_us:+.2f} us)" for v in failed)
            if failed
            else f"no regression beyond {max_added_us:g} us/call at {len(verdicts)} items"
        )
    )
    return "\n".join(lines)


# ---- the table ---------------------------------------------------------------------------------------------------


def _fmt_size(n: int) -> str:
    from delaycomm.bench.units import format_size

    return format_size(n)


COLUMNS: tuple[tuple[str, str, int, Callable[[dict], Any], str], ...] = (
    # header, unit, width, cell, format
    ("size", "(B)", 10, lambda r: r["size_bytes"], "{}"),
    ("path", "", 12, lambda r: r["path"], "{}"),
    ("raw", "(cpu us)", 9, lambda r: r["raw_cpu_us"], "{:.2f}"),
    ("delaycomm", "(cpu us)", 10, lambda r: r["dc_cpu_us"], "{:.2f}"),
    ("added", "(cpu us)", 9, lambda r: r["added_cpu_us"], "{:+.2f}"),
    (
        "runs min..max",
        "(cpu us)",
        15,
        lambda r: f"{min(r['run_added_cpu_us']):+.1f}..{max(r['run_added_cpu_us']):+.1f}",
        "{}",
    ),
    ("ratio", "(cpu)", 7, lambda r: r["ratio_cpu"], "{:.3f}"),
    ("raw", "(wall us)", 10, lambda r: r["raw_wall_us"], "{:.2f}"),
    ("added", "(wall us)", 10, lambda r: r["added_wall_us"], "{:+.2f}"),
    ("ratio", "(wall)", 7, lambda r: r["ratio_wall"], "{:.3f}"),
)


def format_table(record: dict[str, Any]) -> str:
    s, env = record["settings"], record.get("environment", {})
    m = env.get("machine", {})
    out = [
        f"# delaycomm per-call cost: world size 1, {s['device']} ({'nccl' if s['device'] == 'cuda' else 'gloo'} vs "
        f"delaycomm, nothing configured), {len(record['runs'])} runs x {s['blocks']} pairs of blocks x {s['calls']} "
        f"calls, float32"
        + (f", each run pinned to CPU {s['pin_cpu']}" if s.get("pin_cpu") is not None else "")
        + (f", INJECTED {s['inject_us']:g} us of work per delaycomm call" if s["inject_us"] else ""),
        f"# torch {env.get('torch', '?')}, delaycomm {env.get('delaycomm', '?')}"
        + (f" ({env['delaycomm_commit']})" if env.get("delaycomm_commit") else "")
        + f", NCCL {env.get('nccl') or '-'}; {m.get('hostname', '?')}: {m.get('cpu', '?')}, "
        f"{m.get('cpu_affinity') or m.get('cpu_count', '?')} cores"
        + (f", {m['gpu']}" if m.get("gpu") else "")
        + (f"; load average {record['loadavg'][0]:.1f}" if record.get("loadavg") else ""),
        "# per call: cpu = process CPU time (all threads), wall = elapsed; added = median over runs of the run's "
        "median paired difference delaycomm - raw; ratio likewise of delaycomm / raw",
        "#" + " ".join(f"{c[0]:>{c[2]}}" for c in COLUMNS)[1:],
        "#" + " ".join(f"{c[1]:>{c[2]}}" for c in COLUMNS)[1:],
    ]
    rs = rows(record)
    for r in rs:
        out.append(" ".join(f"{c[4].format(c[3](r)):>{c[2]}}" for c in COLUMNS))
    if len(record["runs"]) >= 3:
        out.append(
            "# steadiness: standard deviation over runs of each run's figure, in us/call, as a difference "
            "(delaycomm - raw) and in the gate's ratio form ((ratio - median ratio) x the run's raw cost):"
        )
        for r in rs:
            med = statistics.median(r["run_ratio_cpu"])
            ratio_form = [(q - med) * raw for q, raw in zip(r["run_ratio_cpu"], r["run_raw_cpu_us"])]
            out.append(
                f"#   {_fmt_size(r['size_bytes'])} {r['path']}: difference "
                f"{statistics.stdev(r['run_added_cpu_us']):.2f}, ratio form {statistics.stdev(ratio_form):.2f}"
            )
    if "elapsed_s" in record:
        out.append(f"# measured in {record['elapsed_s']:.1f} s")
    return "\n".join(out)


# ---- measuring ---------------------------------------------------------------------------------------------------


def _one_run(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="delaycomm-percall-") as d:
        out = os.path.join(d, "run.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--_worker", json.dumps(spec), out]
        t0 = time.monotonic()
        try:
            cpu = spec.get("pin_cpu")
            proc = subprocess.run(
                cmd,
                env=percall_engine.worker_environment(),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                # every thread the run starts (the caller, each group's Gloo worker) inherits the one CPU
                preexec_fn=None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu})),
            )
        except subprocess.TimeoutExpired:
            raise RunFailed(f"a measuring process ran past {timeout_s:g} s and was stopped") from None
        if proc.returncode != 0 or not os.path.exists(out):
            raise RunFailed(f"a measuring process exited with status {proc.returncode}:\n{proc.stderr[-4000:]}")
        with open(out) as f:
            run = json.load(f)
        run["elapsed_s"] = round(time.monotonic() - t0, 2)
        return run


def measure(spec: dict[str, Any], runs: int, progress: bool, timeout_s: float) -> dict[str, Any]:
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


def _worker(spec_json: str, out: str) -> int:
    spec = json.loads(spec_json)
    result = percall_engine.measure(spec)
    from delaycomm.bench.environment import environment

    result["environment"] = environment(argparse.Namespace(device=spec["device"]))
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


# ---- command line ------------------------------------------------------------------------------------------------


def _us(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; expected microseconds >= 0") from None
    if not 0 <= v < 1e6:
        raise argparse.ArgumentTypeError(f"{text} is out of range; expected microseconds in [0, 1e6)")
    return v


def _paths(text: str) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in text.split(",")))
    bad = [n for n in names if n not in percall_engine.PATHS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown path {', '.join(map(repr, bad)) or repr(text)}; expected a "
            f"comma-separated list of: {', '.join(percall_engine.PATHS)}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python bench/percall.py",
        description=__doc__.split("\n\n")[0],
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
    p.add_argument("--json", default=None, metavar="FILE", help="write the record (every block time, the environment)")
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
        default=DEFAULT_MAX_ADDED_US,
        metavar="US",
        help=f"the gate's allowance in us per call (default {DEFAULT_MAX_ADDED_US:g})",
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


def load(path: str, flag: str, p: argparse.ArgumentParser) -> dict[str, Any]:
    try:
        with open(path) as f:
            rec = json.load(f)
    except FileNotFoundError:
        p.error(f"argument {flag}: {path}: no such file (a baseline is made with --json, see --help)")
    except (OSError, ValueError) as e:
        p.error(f"argument {flag}: {path}: cannot be read as JSON: {e}")
    if not isinstance(rec, dict) or rec.get("format") != FORMAT or not rec.get("runs"):
        p.error(f"argument {flag}: {path}: not a per-call record ('format' must be {FORMAT!r}, with runs)")
    return rec


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_worker"]:
        return _worker(argv[1], argv[2])
    p = build_parser()
    a = p.parse_args(argv)
    baseline = load(a.compare, "--compare", p) if a.compare else None
    if a.from_json:
        record = load(a.from_json, "--from-json", p)
    else:
        import torch

        from delaycomm.bench.units import size_sweep

        if a.minbytes > a.maxbytes:
            p.error(f"argument -b/--minbytes: {a.minbytes} B is larger than -e/--maxbytes {a.maxbytes} B")
        device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cuda" and not torch.cuda.is_available():
            p.error("argument --device: cuda was asked for but torch sees no CUDA device")
        spec = {
            "device": device,
            "sizes": size_sweep(a.minbytes, a.maxbytes, a.stepfactor),
            "paths": a.paths,
            "calls": a.calls,
            "blocks": a.blocks,
            "warmup_blocks": a.warmup_blocks,
            "inject_us": a.inject_us,
            "pin_cpu": min(os.sched_getaffinity(0)) if a.pin_cpu else None,
        }
        progress = a.progress == "on" or (a.progress == "auto" and sys.stderr.isatty())
        try:
            record = measure(spec, a.runs, progress, a.timeout)
        except RunFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 3
        record["argv"] = ["python", "bench/percall.py", *argv]
    record["rows"] = rows(record)
    if a.json:
        from delaycomm._tools.output import write_json

        write_json(a.json, record)
    print(format_table(record))
    if a.json:
        print(f"# record: {a.json}")
    if baseline is None:
        return 0
    try:
        verdicts = gate(record, baseline, a.max_added_us)
    except ValueError as e:
        print(f"error: --compare {a.compare}: {e}", file=sys.stderr)
        return 2
    for attempt in range(a.confirm if not a.from_json else 0):
        failed = [v for v in verdicts if v.failed]
        if not failed:
            break
        print(format_gate(verdicts, a.max_added_us).replace("gate: FAIL:", "# so far: over the limit:"))
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
        redo = {(v.size_bytes, v.path): v for v in gate(again, baseline, a.max_added_us)}
        verdicts = [redo.get((v.size_bytes, v.path), v) if v.failed else v for v in verdicts]
        print(format_table(again))
    print(format_gate(verdicts, a.max_added_us))
    return 1 if any(v.failed for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
