"""``python -m delaycomm.bench``: the command line. Parses and checks every flag, then measures, reports, gates.

``python -m delaycomm.bench percall ...`` is the per-call benchmark and CI gate (:mod:`delaycomm.bench.percall`).

Exit status: 0 fine; 1 the gate failed or a result was wrong; 2 bad input (a flag, a baseline file); 3 the run
itself failed (a rank raised, died or hung).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from delaycomm._tools import args as argtypes
from delaycomm._tools import optional
from delaycomm.bench import collectives, units
from delaycomm.bench.settings import RAW_BACKENDS, Backend, Settings

__all__ = ["main", "build_parser"]

_BACKENDS = ("delaycomm",) + RAW_BACKENDS


_size = argtypes.size
_collectives = argtypes.choices_list(collectives.COLLECTIVES, "collective")


def _dtype(text: str) -> str:
    name = collectives.DTYPE_ALIASES.get(text.strip().lower(), text.strip().lower())
    if name not in collectives.DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; expected one of: {', '.join(collectives.DTYPES)}")
    return name


def _backends(text: str) -> tuple[str, ...]:
    names = [n.strip().lower() for n in text.split(",")]
    bad = [n for n in names if n not in _BACKENDS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown backend {', '.join(repr(b) for b in bad) or repr(text)}; expected a comma-separated list of: "
            + ", ".join(_BACKENDS)
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r} names a backend twice")
    if sum(n in RAW_BACKENDS for n in names) > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at most one raw backend (gloo or nccl) per run")
    return tuple(names)


def _profile(text: str) -> str:
    """A profile file, checked by the native loader: the delay spec ``profile:FILE``."""
    return argtypes.delay_spec(f"profile:{text}")


def build_parser() -> argparse.ArgumentParser:
    from delaycomm.bench.plot import PLOT_EXTENSIONS

    p = argparse.ArgumentParser(
        prog="python -m delaycomm.bench",
        description="nccl-tests-style collective microbenchmarks: delaycomm side by side with the raw backend it "
        "wraps (gloo on CPU, nccl on GPU), interleaved repeats, and a CI gate on their ratio.",
        epilog="sizes are binary (4K = 4096 B). Columns and formulas: docs/benchmark.md. Exit status: 0 ok; 1 the gate "
        "failed or a result was wrong; 2 bad input; 3 the run failed. What delaycomm adds per call, and CI's gate on "
        "it: python -m delaycomm.bench percall --help.",
    )
    g = p.add_argument_group("sweep")
    g.add_argument("-b", "--minbytes", type=_size, default=8, metavar="SIZE", help="smallest size (default 8)")
    g.add_argument("-e", "--maxbytes", type=_size, default=64 << 20, metavar="SIZE", help="largest size (default 64M)")
    g.add_argument(
        "-f",
        "--stepfactor",
        type=argtypes.integer(2),
        default=2,
        metavar="F",
        help="multiply the size by F each step (default 2)",
    )
    g.add_argument(
        "-i", "--stepbytes", type=_size, default=None, metavar="SIZE", help="add SIZE each step instead of multiplying"
    )
    g.add_argument(
        "-n",
        "--iters",
        type=argtypes.integer(1),
        default=50,
        metavar="N",
        help="timed calls per size, backend and repeat (default 50)",
    )
    g.add_argument(
        "-w",
        "--warmup-iters",
        type=argtypes.integer(0),
        default=5,
        metavar="N",
        help="untimed calls before each timed batch (default 5)",
    )
    g.add_argument(
        "-r",
        "--repeats",
        type=argtypes.integer(1),
        default=3,
        metavar="R",
        help="repeats of the whole sweep, for the gate's majority rule (default 3)",
    )
    g.add_argument(
        "--interleave",
        choices=("call", "block"),
        default="call",
        help="call: one call of each backend in turn (A B A B, default); block: -n calls of one backend, "
        "then of the next (the order alternates between repeats and sizes)",
    )
    g.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="check results: #wrong (default 1)")
    g.add_argument(
        "-o",
        "--op",
        choices=tuple(collectives.REDOPS),
        default="sum",
        help="reduction op of all_reduce and reduce_scatter (default sum)",
    )
    g.add_argument(
        "-d",
        "--datatype",
        type=_dtype,
        default="float32",
        metavar="DTYPE",
        help="element type: " + ", ".join(collectives.DTYPES) + " (default float32)",
    )
    g.add_argument(
        "-C",
        "--collective",
        type=_collectives,
        default=("all_reduce",),
        metavar="NAMES",
        help="comma-separated: " + ", ".join(collectives.COLLECTIVES) + " (default all_reduce)",
    )
    g.add_argument("--root", type=argtypes.integer(0), default=0, help="broadcast root (default 0)")
    b = p.add_argument_group("backends and ranks")
    b.add_argument(
        "--backends",
        type=_backends,
        default=None,
        metavar="LIST",
        help="comma-separated, side by side (default: delaycomm,gloo on cpu, delaycomm,nccl on cuda)",
    )
    b.add_argument(
        "--nccl-algo",
        action="append",
        default=None,
        metavar="VALUE",
        help="run delaycomm once per value of its nccl_algo option (repeatable: tree, ring, auto...)",
    )
    b.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="tensor device (default auto: cuda when available)",
    )
    b.add_argument(
        "--nproc",
        type=argtypes.integer(1),
        default=None,
        metavar="N",
        help="ranks to spawn (default 2; under torchrun the launcher's ranks are used)",
    )
    b.add_argument(
        "--delay",
        type=argtypes.delay_spec,
        default=None,
        metavar="SPEC",
        help="delaycomm's delay option (e.g. const:5ms, exp:p99=400ms): shows the latency it produces",
    )
    b.add_argument(
        "--profile",
        type=_profile,
        default=None,
        metavar="PROFILE.json",
        help="delaycomm replays this latency profile (delay profile:FILE, docs/profile.md); the table adds the "
        "profile's p50 and p99 per size beside the measured latencies",
    )
    b.add_argument(
        "--delay-fraction",
        type=argtypes.number(0.0),
        default=None,
        metavar="F",
        help="delaycomm's delay_fraction option, in [0, 1]",
    )
    b.add_argument(
        "--delay-mode",
        choices=("add", "match", "auto"),
        default=None,
        help="delaycomm's delay_mode option (default: the option's, auto: match for --profile, else add)",
    )
    b.add_argument(
        "--delay-carrier",
        choices=("all", "one", "auto"),
        default=None,
        help="delaycomm's delay_carrier option (default: the option's, auto: one for --profile, else all)",
    )
    b.add_argument(
        "--timeout",
        type=argtypes.number(1.0),
        default=300.0,
        metavar="S",
        help="process-group timeout in seconds (default 300)",
    )
    o = p.add_argument_group("output and gate")
    o.add_argument(
        "--json",
        nargs="?",
        const="-",
        type=argtypes.output_path(stdout=True),
        default=None,
        metavar="FILE",
        help="write the run record (raw times, statistics, environment) as JSON to FILE, or to stdout "
        "without FILE (then no table)",
    )
    o.add_argument(
        "--plot",
        type=argtypes.output_path(PLOT_EXTENSIONS),
        default=None,
        metavar="FILE.png",
        help="latency and busbw against size, one line per backend",
    )
    o.add_argument(
        "--from-json",
        default=None,
        metavar="FILE",
        help="report (table, --plot, --compare) a saved run instead of measuring",
    )
    o.add_argument(
        "--compare",
        default=None,
        metavar="BASELINE.json",
        help="gate: exit 1 when delaycomm/raw ratios are worse than the baseline's by --max-slowdown",
    )
    o.add_argument(
        "--max-slowdown",
        type=argtypes.number(1.0),
        default=1.10,
        metavar="X",
        help="allowed factor on the baseline ratio (default 1.10)",
    )
    o.add_argument(
        "--confirm",
        type=argtypes.integer(0),
        default=1,
        metavar="N",
        help="measure sizes that fail the gate again, up to N times, in fresh ranks; a size fails only if "
        "it fails every time (default 1; not under torchrun or --from-json)",
    )
    o.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress bar on stderr (default auto: when stderr is a terminal)",
    )
    return p


def _resolve(p: argparse.ArgumentParser, a: argparse.Namespace) -> tuple[Settings, int | None]:
    """Cross-flag checks and the Settings; (settings, ranks to spawn or None under torchrun)."""
    import torch

    import delaycomm
    from delaycomm.bench.launch import torchrun_rank, under_torchrun

    if a.minbytes > a.maxbytes:
        p.error(f"argument -b/--minbytes: {a.minbytes} B is larger than -e/--maxbytes {a.maxbytes} B")
    sizes = units.size_sweep(a.minbytes, a.maxbytes, a.stepfactor, a.stepbytes or 0)
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        p.error("argument --device: cuda was asked for but torch sees no CUDA device")
    names = a.backends or (("delaycomm", "nccl") if device == "cuda" else ("delaycomm", "gloo"))
    if "nccl" in names and device != "cuda":
        p.error("argument --backends: nccl needs --device cuda (on cpu use gloo)")
    if a.op == "avg" and device != "cuda":
        p.error("argument -o/--op: avg is not supported by gloo; use it with --device cuda (nccl), or use sum")
    if a.op == "avg" and not a.datatype.startswith(("float", "bfloat")):
        p.error(f"argument -o/--op: avg needs a floating dtype, got -d {a.datatype}")
    if under_torchrun():
        _, world = torchrun_rank()
        if a.nproc is not None and a.nproc != world:
            p.error(f"argument --nproc: {a.nproc} conflicts with WORLD_SIZE={world} from the launcher")
        nproc = None
    else:
        world = nproc = a.nproc or 2
    if device == "cuda" and world > torch.cuda.device_count():
        p.error(
            f"argument --nproc: {world} ranks need {world} GPUs (NCCL refuses two ranks on one GPU); "
            f"this machine has {torch.cuda.device_count()}"
        )
    if a.root >= world:
        p.error(f"argument --root: {a.root} is not a rank of a {world}-rank run")
    options: dict[str, Any] = {}
    if a.delay is not None and a.profile is not None:
        p.error("argument --profile: not allowed with --delay (a profile is a delay spec: profile:FILE)")
    if a.delay is not None:
        options["delay"] = a.delay
    if a.profile is not None:
        options["delay"] = a.profile
    if a.delay_fraction is not None:
        options["delay_fraction"] = a.delay_fraction
    for name in ("delay_mode", "delay_carrier"):
        if getattr(a, name) is not None:
            options[name] = getattr(a, name)
    variants = [None] if not a.nccl_algo else list(dict.fromkeys(a.nccl_algo))
    if a.nccl_algo and "delaycomm" not in names:
        p.error("argument --nccl-algo: needs delaycomm in --backends")
    backends = []
    for name in names:
        if name != "delaycomm":
            backends.append(Backend(label=name, name=name))
            continue
        for algo in variants:
            opts = dict(options) if algo is None else {**options, "nccl_algo": algo}
            flag = (
                "--nccl-algo"
                if algo is not None
                else "--profile"
                if a.profile is not None
                else "--delay"
                if "delay" in opts
                else "--delay-fraction"
                if "delay_fraction" in opts
                else "--delay-mode or --delay-carrier"
            )
            try:
                delaycomm.DelayConfig(**opts)
            except ValueError as e:
                p.error(f"argument {flag}: {e}")
            except AttributeError as e:  # the option's engine is not in this build of delaycomm
                p.error(f"argument {flag}: this build of delaycomm cannot take it ({e})")
            label = "delaycomm" if algo is None else f"delaycomm[{algo}]"
            backends.append(Backend(label=label, name="delaycomm", options=opts))
    progress = optional.progress_enabled(a.progress, sys.stderr.isatty(), p)
    settings = Settings(
        collectives=a.collective,
        sizes=tuple(sizes),
        dtype=a.datatype,
        redop=a.op,
        iters=a.iters,
        warmup=a.warmup_iters,
        repeats=a.repeats,
        interleave=a.interleave,
        check=a.check,
        root=a.root,
        device=device,
        backends=tuple(backends),
        timeout_s=a.timeout,
        progress=progress,
    )
    if a.compare and (settings.raw is None or not any(b.is_delaycomm for b in backends)):
        p.error("argument --compare: the gate compares delaycomm with a raw backend: --backends needs both")
    return settings, nproc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["percall"]:
        from delaycomm.bench import percall

        return percall.main(argv[1:])
    p = build_parser()
    a = p.parse_args(argv)
    if a.plot:  # before measuring: a missing matplotlib is bad input, not a traceback after the run
        optional.require_for_flag(p, "--plot", "matplotlib")
    from delaycomm.bench import report, results
    from delaycomm.bench.gate import GateError, compare

    baseline = None
    if a.compare:
        try:
            baseline = results.load(a.compare)
        except results.BenchFileError as e:
            p.error(f"argument --compare: {e}")
    nproc = None
    if a.from_json:
        try:
            record = results.load(a.from_json)
        except results.BenchFileError as e:
            p.error(f"argument --from-json: {e}")
    else:
        settings, nproc = _resolve(p, a)
        record = _measure(settings, nproc)
        if record is None:
            return 0  # a torchrun rank other than 0: rank 0 reports
        if isinstance(record, str):
            print(f"error: the benchmark run failed: {record}", file=sys.stderr)
            return 3
        record["argv"] = ["python", "-m", "delaycomm.bench", *argv]
    out = sys.stderr if a.json == "-" else sys.stdout
    text = results.save(record, a.json) if a.json else None
    if a.json == "-":
        print(text)
    else:
        print(report.format_table(record), file=out)
    if a.plot:
        from delaycomm.bench.plot import plot

        plot(record, a.plot)
        print(f"# plot: {a.plot}", file=out)
    status = 0
    wrong = sum(r.wrong or 0 for r in results.row_stats(record))
    if wrong:
        print(f"error: {wrong} wrong result elements (#wrong column): a backend returned wrong data", file=out)
        status = 1
    if baseline is not None:
        try:
            verdict = compare(record, baseline, a.max_slowdown)
        except GateError as e:
            print(f"error: --compare {a.compare}: {e}", file=sys.stderr)
            return 2
        for attempt in range(a.confirm if not a.from_json and nproc is not None else 0):
            if not verdict.to_confirm:
                break
            print(
                f"# gate: {len(verdict.to_confirm)} sizes over the limit; confirmation run {attempt + 1} of "
                f"{a.confirm} on those sizes",
                file=out,
            )
            again = _measure(_only(settings, verdict.to_confirm), nproc)
            if isinstance(again, str):
                print(f"error: the confirmation run failed: {again}", file=sys.stderr)
                return 3
            verdict = verdict.confirmed_by(compare(again, baseline, a.max_slowdown))
        print(verdict.format(), file=out)
        if not verdict.ok:
            status = 1
    return status


def _only(settings: Settings, verdicts) -> Settings:
    """The settings restricted to the collectives and sizes of ``verdicts`` (a confirmation run)."""
    import dataclasses

    return dataclasses.replace(
        settings,
        collectives=tuple(dict.fromkeys(v.collective for v in verdicts)),
        sizes=tuple(sorted({v.size_bytes for v in verdicts})),
    )


def _measure(settings: Settings, nproc: int | None) -> dict[str, Any] | str | None:
    """Rank 0's record; None on other torchrun ranks; the failure text when the run failed."""
    from delaycomm.bench import engine, launch

    if nproc is None:
        rank, world = launch.torchrun_rank()
        try:
            return engine.run_rank(rank, world, settings, "env://")
        except Exception as e:  # noqa: BLE001 - reported with the exit status of a failed run
            import traceback

            return f"rank {rank}: {e}\n{traceback.format_exc()}"
    try:
        return launch.spawn(nproc, settings)
    except launch.RunFailed as e:
        return str(e)
