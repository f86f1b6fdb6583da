"""``python -m delaycomm.experiment``: the command line (arguments, checks, output)."""

from __future__ import annotations

import argparse
import sys

from delaycomm._tools import args as argtypes
from delaycomm._tools.output import write_json
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

    def error(self, message: str):
        raise ValueError(message)


def build_parser() -> argparse.ArgumentParser:
    configs = "\n".join(f"  {c.name:<11} {c.description}" for c in CONFIGS)
    p = _Parser(
        prog="python -m delaycomm.experiment",
        description="A controlled comparison: one small model on scikit-learn's digits, trained under several "
        "delay / staleness configs with identical hyper-parameters and seeds, through real processes "
        "and the real backend (CPU, Gloo underneath).",
        epilog="configs:\n" + configs,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--configs", metavar="NAMES", help="comma-separated configs to run, in this order (default: all; see below)"
    )
    p.add_argument("--list-configs", action="store_true", help="print the configs and their options, then exit")
    p.add_argument("--model", choices=tuple(MODELS), default="mlp", help="model (default: mlp)")
    p.add_argument(
        "--nproc",
        type=argtypes.integer(2, 64),
        default=2,
        help="ranks per config, each a process; a comparison of communication needs two (default: 2)",
    )
    p.add_argument(
        "--epochs",
        type=argtypes.integer(1),
        default=None,
        help=f"epochs per config (default: {DEFAULT_EPOCHS}; --quick: {QUICK_EPOCHS}; "
        f"with --budget: until the budget is spent)",
    )
    p.add_argument(
        "--budget",
        type=argtypes.number(0.0, lo_open=True),
        default=None,
        metavar="SECONDS",
        help="wall-clock training budget per config: stop at the first step past it",
    )
    p.add_argument("--batch-size", type=argtypes.integer(1), default=32, help="samples per rank per step (default: 32)")
    p.add_argument(
        "--lr", type=argtypes.number(0.0, lo_open=True), default=0.05, help="SGD learning rate (default: 0.05)"
    )
    p.add_argument(
        "--momentum",
        type=argtypes.number(0.0, 1.0, hi_open=True),
        default=0.9,
        help="SGD momentum, in [0, 1) (default: 0.9)",
    )
    p.add_argument(
        "--seed",
        type=argtypes.integer(0, 2**63 - 1),
        default=0,
        help="seed of the split, the initial weights, the shuffling and the delay schedule (default: 0)",
    )
    p.add_argument(
        "--delay",
        type=argtypes.delay_spec,
        default=DEFAULT_DELAY,
        metavar="SPEC",
        help=f"delay distribution of the delayed configs (default: {DEFAULT_DELAY}); any delaycomm "
        f"spec, e.g. lognormal:p50=5ms,p99=40ms",
    )
    p.add_argument(
        "--step-ms",
        type=argtypes.number(0.0, lo_open=True),
        default=None,
        metavar="MS",
        help="step time that turns a delay into steps of staleness (default: calibrated by the backend "
        "at init; set it to make the stale configs reproducible run to run)",
    )
    p.add_argument(
        "--timeout",
        type=argtypes.number(0.0, lo_open=True),
        default=None,
        metavar="SECONDS",
        help=f"limit per config, startup included (default: {DEFAULT_TIMEOUT_S:g}; --quick: {QUICK_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_EPOCHS} epochs per config: a few minutes at most on a 2-core machine (for CI)",
    )
    p.add_argument(
        "--json",
        type=argtypes.output_path(),
        metavar="FILE",
        help="write every measurement, the curves and the settings as JSON",
    )
    p.add_argument(
        "--plot",
        type=argtypes.output_path(_PLOT_SUFFIXES),
        metavar="FILE",
        help=f"write loss vs step / vs wall clock and test accuracy ({', '.join(_PLOT_SUFFIXES)})",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def parse_args(argv: list[str] | None = None) -> tuple[Hyper, list[ExperimentConfig], argparse.Namespace]:
    """Parse and check the command line.

    Returns:
        The hyper-parameters, the configs to run, and the parsed namespace (output paths, flags).

    Raises:
        ValueError: a bad argument, naming the flag, what is accepted and what came.
    """
    a = build_parser().parse_args(argv)
    names = None if a.configs is None else [n.strip() for n in a.configs.split(",")]
    try:
        configs = select_configs(names)
    except ValueError as e:
        raise ValueError(f"argument {e}") from None
    if a.delay == "none":
        raise ValueError(
            "argument --delay: expected a delay distribution for the delayed configs, got 'none'; to "
            "compare without delay, run --configs gloo,bsp"
        )
    if a.epochs is not None:
        epochs = a.epochs
    elif a.budget is not None:
        epochs = 1_000_000  # the budget decides
    else:
        epochs = QUICK_EPOCHS if a.quick else DEFAULT_EPOCHS
    timeout = a.timeout if a.timeout is not None else (QUICK_TIMEOUT_S if a.quick else DEFAULT_TIMEOUT_S)
    hp = Hyper(
        model=a.model,
        epochs=epochs,
        batch_size=a.batch_size,
        lr=a.lr,
        momentum=a.momentum,
        seed=a.seed,
        nproc=a.nproc,
        delay=a.delay,
        budget_s=a.budget,
        timeout_s=timeout,
        step_ms=a.step_ms,
    )
    return hp, configs, a


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
        hp, configs, ns = parse_args(argv)
    except ValueError as e:
        print(f"python -m delaycomm.experiment: error: {e}", file=sys.stderr)
        return 2
    if ns.list_configs:
        print(_list_configs(hp.delay, hp.seed, hp.step_ms))
        return 0

    from delaycomm.experiment.report import format_table, plot
    from delaycomm.experiment.run import header_lines, run_experiment

    try:
        doc = run_experiment(hp, configs, progress=False if ns.no_progress else None)
    except ValueError as e:
        print(f"python -m delaycomm.experiment: error: {e}", file=sys.stderr)
        return 2
    header = header_lines(doc)
    print(format_table(doc["configs"], header))
    print(f"# duration {doc['duration_s']:.1f} s")
    if ns.json:
        write_json(ns.json, doc)
        print(f"# wrote {ns.json}")
    if ns.plot:
        plot(doc["configs"], ns.plot, header[0])
        print(f"# wrote {ns.plot}")
    failed = [c["name"] for c in doc["configs"] if c["status"] in ("failed", "timeout")]
    return 1 if failed else 0
