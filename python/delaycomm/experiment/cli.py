"""``python -m delaycomm.experiment``: the command line (arguments, checks, output)."""

from __future__ import annotations

import argparse
import sys

from delaycomm._tools import args as argtypes
from delaycomm._tools.output import write_json
from delaycomm.experiment.configs import CONFIGS, DEFAULT_DELAY, ExperimentConfig, select_configs
from delaycomm.experiment.run_cli import add_knobs, add_outputs
from delaycomm.experiment.runner import Hyper
from delaycomm.experiment.tasks import TASKS
from delaycomm.experiment.worker import MODELS

__all__ = ["build_parser", "parse_args", "main"]

DEFAULT_EPOCHS = 30
QUICK_EPOCHS = 2
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
        help="the first seed (of the split, the initial weights, the shuffling and the delay schedule; default: 0)",
    )
    p.add_argument(
        "--seeds",
        type=argtypes.integer(1, 1000),
        default=1,
        help="run every config with seeds SEED..SEED+N-1 and add the statistics: mean and 95%% interval per config, "
        "paired comparison with gloo (default: 1)",
    )
    p.add_argument("--task", choices=tuple(TASKS), default="digits", help="built-in task (default: digits)")
    add_knobs(p, DEFAULT_DELAY)
    p.add_argument(
        "--warmup",
        type=argtypes.integer(0),
        default=0,
        metavar="STEPS",
        help="learning-rate warmup restarted every epoch (delaycomm.schedule.EpochWarmup), at most the steps per "
        "epoch (default: 0, none)",
    )
    p.add_argument(
        "--measure-updates",
        action="store_true",
        help="measure the applied update against the fresh and the full-batch gradient at every step (rank 0): "
        "update_noise_ratio, update_deviation, effective_lr, oscillation (DDP configs only)",
    )
    p.add_argument(
        "--measure-every",
        type=argtypes.integer(1),
        default=1,
        metavar="K",
        help="with --measure-updates, the full-batch gradient every K-th step (the training loss: every step; "
        "default: 1)",
    )
    p.add_argument(
        "--oscillation-steps",
        type=argtypes.integer(1),
        default=200,
        metavar="K",
        help="the loss oscillation counts the first K steps (default: 200)",
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
    p.add_argument("--out", metavar="DIR", default=None, help="keep each run's record here and reuse it (resumable)")
    add_outputs(p, _PLOT_SUFFIXES)
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
        task=a.task,
        fraction=a.fraction,
        ema_alpha=a.ema_alpha,
        warmup_steps=a.warmup,
        measure=a.measure_updates,
        measure_every=a.measure_every,
        oscillation_steps=a.oscillation_steps,
    )
    if hp.measure and any(c.parallel != "ddp" for c in configs):
        bad = ", ".join(c.name for c in configs if c.parallel != "ddp")
        raise ValueError(f"argument --measure-updates: measures DDP configs only; leave out {bad} (--configs)")
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
    """``python -m delaycomm.experiment [run | claims] ...``. The built-in task: print the table (and, with
    ``--seeds`` > 1, the statistics). Exit status: 0 every run ok (or not available in this build), 1 a run failed
    or timed out, 2 bad arguments or a missing extra."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        from delaycomm.experiment.run_cli import main_run

        return main_run(argv[1:])
    from delaycomm.experiment.run_cli import interrupted_line, interruptible
    from delaycomm.experiment.study import Interrupted

    prog = "python -m delaycomm.experiment" + (" claims" if argv[:1] == ["claims"] else "")
    try:
        with interruptible():  # Ctrl-C, SIGTERM: the ranks in flight are stopped, the finished runs kept
            if argv[:1] == ["claims"]:
                from delaycomm.experiment.claims import main_claims

                return main_claims(argv[1:])
            return _main_builtin(argv)
    except Interrupted as e:
        print(interrupted_line(e, prog), file=sys.stderr, flush=True)
        return 130
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130


def _main_builtin(argv: list[str]) -> int:
    try:
        hp, configs, ns = parse_args(argv)
    except ValueError as e:
        print(f"python -m delaycomm.experiment: error: {e}", file=sys.stderr)
        return 2
    if ns.list_configs:
        print(_list_configs(hp.delay, hp.seed, hp.step_ms))
        return 0

    from delaycomm.experiment.analysis import format_delaycomm, format_errors, format_stats, plot_study
    from delaycomm.experiment.run import header_lines, run_experiment
    from delaycomm.experiment.summary import format_table, plot
    from delaycomm.experiment.tasks import MissingExtra, require_matplotlib, require_sklearn

    try:
        require_sklearn()
        if ns.plot:
            require_matplotlib()
        doc = run_experiment(
            hp,
            configs,
            progress=False if ns.no_progress else None,
            seeds=ns.seeds,
            out=ns.out,
            fresh=ns.fresh,
            delay_cap=ns.delay_cap,
        )
    except (ValueError, MissingExtra) as e:
        print(f"python -m delaycomm.experiment: error: {e}", file=sys.stderr)
        return 2
    header = header_lines(doc)
    print(format_table(doc["configs"], header))
    if ns.seeds > 1:
        print(format_stats(doc["analysis"], [f"statistics over seeds {hp.seed}..{hp.seed + ns.seeds - 1}"]))
        print(format_delaycomm(doc["analysis"]))
        for line in format_errors(doc["runs"]):
            print(line)
    print(f"# duration {doc['duration_s']:.1f} s" + (f"; {doc['reused']} runs reused from {ns.out}" if ns.out else ""))
    if ns.json:
        write_json(ns.json, doc)
        print(f"# wrote {ns.json}")
    if ns.plot:
        if ns.seeds > 1:
            plot_study(doc["analysis"], ns.plot, header[0])
        else:
            plot(doc["configs"], ns.plot, header[0])
        print(f"# wrote {ns.plot}")
    failed = [r for r in doc["runs"] if r["status"] in ("failed", "timeout")]
    return 1 if failed else 0
