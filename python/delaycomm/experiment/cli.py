"""``python -m delaycomm.experiment``: the command line (arguments, checks, output)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from delaycomm.experiment.configs import CONFIGS, DEFAULT_DELAY, ExperimentConfig, select_configs
from delaycomm.experiment.runner import Hyper
from delaycomm.experiment.worker import MODELS

__all__ = ["build_parser", "parse_args", "main"]

DEFAULT_EPOCHS = 30
QUICK_EPOCHS = 4
DEFAULT_TIMEOUT_S = 600.0
QUICK_TIMEOUT_S = 120.0
_PLOT_SUFFIXES = (".png", ".pdf", ".svg")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises ValueError (main turns it into exit status 2) instead of exiting."""

    def error(self, message: str):  # noqa: D102
        raise ValueError(message)


def build_parser() -> argparse.ArgumentParser:
    configs = "\n".join(f"  {c.name:<11} {c.description}" for c in CONFIGS)
    p = _Parser(
        prog="python -m delaycomm.experiment",
        description="A controlled comparison: one small model on scikit-learn's digits, trained under several "
                    "delay / staleness configs with identical hyper-parameters and seeds, through real processes "
                    "and the real backend (CPU, Gloo underneath).",
        epilog="configs:\n" + configs, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", metavar="NAMES",
                   help="comma-separated configs to run, in this order (default: all; see below)")
    p.add_argument("--list-configs", action="store_true", help="print the configs and their options, then exit")
    p.add_argument("--model", default="mlp", help=f"model: {', '.join(MODELS)} (default: mlp)")
    p.add_argument("--nproc", type=int, default=2, help="ranks per config, each a process (default: 2)")
    p.add_argument("--epochs", type=int, default=None,
                   help=f"epochs per config (default: {DEFAULT_EPOCHS}; --quick: {QUICK_EPOCHS}; "
                        f"with --budget: until the budget is spent)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="wall-clock training budget per config: stop at the first step past it")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default: 32)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default: 0.05)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the split, the initial weights, the shuffling and the delay schedule (default: 0)")
    p.add_argument("--delay", default=DEFAULT_DELAY, metavar="SPEC",
                   help=f"delay distribution of the delayed configs (default: {DEFAULT_DELAY}); any delaycomm "
                        f"spec, e.g. lognormal:p50=5ms,p99=40ms")
    p.add_argument("--step-ms", type=float, default=None, metavar="MS",
                   help="step time that turns a delay into steps of staleness (default: calibrated by the backend "
                        "at init; set it to make the stale configs reproducible run to run)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help=f"limit per config, startup included (default: {DEFAULT_TIMEOUT_S:g}; "
                        f"--quick: {QUICK_TIMEOUT_S:g})")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_EPOCHS} epochs per config: a few minutes at most on a 2-core machine (for CI)")
    p.add_argument("--json", metavar="FILE", help="write every measurement, the curves and the settings as JSON")
    p.add_argument("--plot", metavar="FILE", help="write loss vs step / vs wall clock and test accuracy "
                                                  f"({', '.join(_PLOT_SUFFIXES)})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _check_output(flag: str, path: str | None, suffixes: tuple[str, ...] = ()) -> None:
    if path is None:
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{flag}: directory {parent!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{flag}: {path!r} is a directory; expected a file name")
    if suffixes and not path.lower().endswith(suffixes):
        raise ValueError(f"{flag}: expected a file name ending in {', '.join(suffixes)}, got {path!r}")


def _finite(flag: str, v: float, lo: float, lo_open: bool, hi: float = math.inf, hi_open: bool = True) -> None:
    bad = (not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi))
    if bad:
        lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
        raise ValueError(f"{flag}: expected a finite number in {lb}{lo:g}, {hi:g}{rb}, got {v:g}")


def parse_args(argv: list[str] | None = None) -> tuple[Hyper, list[ExperimentConfig], argparse.Namespace]:
    """Parse and check the command line.

    Returns:
        The hyper-parameters, the configs to run, and the parsed namespace (output paths, flags).

    Raises:
        ValueError: a bad argument, naming the flag, what is accepted and what came.
    """
    args = build_parser().parse_args(argv)
    names = None if args.configs is None else [n.strip() for n in args.configs.split(",")]
    configs = select_configs(names)
    if args.model not in MODELS:
        raise ValueError(f"--model: unknown model {args.model!r}; accepted: {', '.join(MODELS)}")
    if not 2 <= args.nproc <= 64:
        raise ValueError(f"--nproc: expected an integer in [2, 64] (a comparison of communication needs two "
                         f"ranks or more), got {args.nproc}")
    if args.epochs is not None and args.epochs < 1:
        raise ValueError(f"--epochs: expected an integer >= 1, got {args.epochs}")
    if args.budget is not None:
        _finite("--budget", args.budget, 0.0, True)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size: expected an integer >= 1, got {args.batch_size}")
    _finite("--lr", args.lr, 0.0, True)
    _finite("--momentum", args.momentum, 0.0, False, 1.0, True)
    if not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed: expected an integer in [0, 2^63), got {args.seed}")
    if args.timeout is not None:
        _finite("--timeout", args.timeout, 0.0, True)
    if args.step_ms is not None:
        _finite("--step-ms", args.step_ms, 0.0, True)
    _check_output("--json", args.json)
    _check_output("--plot", args.plot, _PLOT_SUFFIXES)
    delay = _check_delay(args.delay)
    if args.epochs is not None:
        epochs = args.epochs
    elif args.budget is not None:
        epochs = 1_000_000  # the budget decides
    else:
        epochs = QUICK_EPOCHS if args.quick else DEFAULT_EPOCHS
    timeout = args.timeout if args.timeout is not None else (QUICK_TIMEOUT_S if args.quick else DEFAULT_TIMEOUT_S)
    hp = Hyper(model=args.model, epochs=epochs, batch_size=args.batch_size, lr=args.lr, momentum=args.momentum,
               seed=args.seed, nproc=args.nproc, delay=delay, budget_s=args.budget, timeout_s=timeout,
               step_ms=args.step_ms)
    return hp, configs, args


def _check_delay(spec: str) -> str:
    import delaycomm

    if spec.strip().lower() in ("", "none", "off", "0"):
        raise ValueError(f"--delay: expected a delay distribution for the delayed configs, got {spec!r}; to "
                         f"compare without delay, run --configs gloo,bsp")
    try:
        delaycomm.DelayConfig(delay=spec)
    except ValueError as e:
        raise ValueError(f"--delay: {e}") from None
    return spec.strip()


def _list_configs(delay: str, seed: int, step_ms: float | None) -> str:
    from delaycomm.experiment.configs import resolved_options

    lines = [f"# {'config':<11} {'backend':<10} {'DelayConfig keywords':<60} description"]
    for c in CONFIGS:
        opts = resolved_options(c, delay, seed, step_ms)
        kw = ", ".join(f"{k}={v!r}" for k, v in opts.items()) or "-"
        lines.append(f"  {c.name:<11} {c.backend:<10} {kw:<60} {c.description}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the experiment; print the table. Exit status: 0 every config ran (or is not available in this build),
    1 a config failed or timed out, 2 bad arguments."""
    try:
        hp, configs, args = parse_args(argv)
    except ValueError as e:
        print(f"python -m delaycomm.experiment: error: {e}", file=sys.stderr)
        return 2
    if args.list_configs:
        print(_list_configs(hp.delay, hp.seed, hp.step_ms))
        return 0

    from delaycomm.experiment.report import format_table, plot
    from delaycomm.experiment.run import header_lines, run_experiment

    try:
        doc = run_experiment(hp, configs, progress=False if args.no_progress else None)
    except ValueError as e:
        print(f"python -m delaycomm.experiment: error: {e}", file=sys.stderr)
        return 2
    header = header_lines(doc)
    print(format_table(doc["configs"], header))
    print(f"# duration {doc['duration_s']:.1f} s")
    if args.json:
        _write_json(args.json, doc)
        print(f"# wrote {args.json}")
    if args.plot:
        plot(doc["configs"], args.plot, header[0])
        print(f"# wrote {args.plot}")
    failed = [c["name"] for c in doc["configs"] if c["status"] in ("failed", "timeout")]
    return 1 if failed else 0


def _write_json(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False, default=_jsonable)
    os.replace(tmp, path)


def _jsonable(v: Any) -> Any:
    import numpy as np

    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")
