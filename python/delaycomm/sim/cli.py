"""``python -m delaycomm.sim [{table,scenarios,run}] ...``: the command line (arguments, checks, output).

``table`` (the default: ``python -m delaycomm.sim`` alone runs it) reproduces
seed 002's table (BSP / SSP lead:2 / ASP to the same budget, several seeds,
published numbers alongside and checked); ``scenarios`` goes beyond it
(heavy-tailed network delay, stale policies, step-size rules, short and long
budgets); ``run`` simulates one configuration with every knob.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Iterable, Sequence

from delaycomm._tools import args as argtypes
from delaycomm._tools import optional

from . import experiments as ex
from .engine import SimConfig, parse_jitter
from .models import parse_model
from .policies import POLICIES, STEP_RULES
from .report import COLUMNS, Row, format_table, plot_loss, plot_staleness, result_record, write_json

__all__ = ["build_parser", "main", "with_default_command"]

log = logging.getLogger("delaycomm.sim")


# ----------------------------------------------------------------------------------------- argument types
positive = argtypes.number(0, lo_open=True)
non_negative = argtypes.number(0)
fraction = argtypes.number(0, 1)
unit_open = argtypes.number(0, 1, lo_open=True)
count = argtypes.integer(1)
non_negative_int = argtypes.integer(0)
any_int = argtypes.integer()


def lead_bound_arg(text: str) -> int | None:
    """A lead bound (``lead:S``): an integer >= 1, or ``inf`` (ASP, returned as None)."""
    if text.strip().lower() in ("inf", "infinity"):
        return None
    return count(text)


def lead_arg(text: str) -> str:
    """A lead bound for ``run --lead``, returned as a model label."""
    bound = lead_bound_arg(text)
    return "asp" if bound is None else parse_model(f"lead:{bound}").label


def bounds_list(text: str) -> list[int | None]:
    """Comma-separated lead bounds, e.g. ``2,8,inf``."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list like '2,8,inf', got {text!r}")
    return [lead_bound_arg(p) for p in parts]


def model_arg(text: str) -> str:
    """A consistency-model spec."""
    try:
        return parse_model(text).label
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("parse_model: ")) from None


def jitter_arg(text: str) -> str:
    """A compute-jitter spec."""
    try:
        parse_jitter(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("parse_jitter: ")) from None
    return text


def delay_sampler_class():
    """``delaycomm.DelaySampler``, the backend's C++ sampler (a function, so that tests can put a stand-in there)."""
    from delaycomm import DelaySampler  # the compiled backend's binding

    return DelaySampler


def sampler_factory(spec: str, seed: int, rank: int):
    """Build rank ``rank``'s delay sampler from the backend's binding."""
    return delay_sampler_class()(spec, seed=seed, rank=rank)


# ------------------------------------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("run control")
    g.add_argument("--seed", type=any_int, default=0, help="first run seed; seeds SEED..SEED+K-1 are run (default 0)")
    g.add_argument(
        "--seeds",
        type=count,
        default=None,
        metavar="K",
        help="runs per row, one per seed (default: table 8, scenarios 4, run 1)",
    )
    g.add_argument("--json", metavar="FILE", help="write the measurements as JSON to FILE ('-' for stdout)")
    g.add_argument("--plot", metavar="DIR", help="write PNG plots (loss vs wall clock, staleness histograms) into DIR")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    g.add_argument("-v", "--verbose", action="store_true", help="log each run at DEBUG level")
    c = common.add_argument_group("cluster (defaults: seed 002's inferred setting, see docs/sim.md)")
    c.add_argument("--workers", type=count, help="number of workers N (default 8)")
    c.add_argument("--budget", type=positive, metavar="SECONDS", help="simulated wall-clock budget (default 400)")
    c.add_argument(
        "--straggler", type=positive, metavar="FACTOR", help="compute-time factor of the straggler(s) (default 4)"
    )
    c.add_argument("--stragglers", type=non_negative_int, metavar="K", help="ranks 0..K-1 are stragglers (default 1)")
    c.add_argument(
        "--base-time",
        type=positive,
        metavar="SECONDS",
        help="mean compute time of a normal worker's gradient (default 0.92)",
    )
    c.add_argument(
        "--comm",
        type=non_negative,
        metavar="SECONDS",
        help="fixed push+pull time per step, paid by the worker (default 0.07)",
    )
    c.add_argument(
        "--comm-model",
        metavar="FILE",
        help="price --comm as the all-reduce of --comm-bytes over the workers by this cost model (a profile made "
        "with 'python -m delaycomm profile ... --ranks N', or its metadata.costmodel; docs/costmodel.md)",
    )
    c.add_argument("--comm-bytes", type=argtypes.size, metavar="SIZE", help="bytes each worker all-reduces per step")
    c.add_argument("--comm-nodes", type=count, metavar="M", help="nodes the workers span, for --comm-model (default 1)")
    c.add_argument(
        "--jitter",
        type=jitter_arg,
        metavar="SPEC",
        help="compute-time jitter: none, lognormal:SIGMA, exp:FRAC, uniform:W (default lognormal:0.2)",
    )
    c.add_argument("--lr", type=positive, help="base learning rate (default 1.0)")
    c.add_argument("--batch", type=count, help="mini-batch rows per gradient (default 64)")

    parser = argparse.ArgumentParser(
        prog="python -m delaycomm.sim",
        description="Offline NumPy discrete-event simulator of BSP / SSP (lead:S) / ASP training of a logistic "
        "regression with stragglers and network delay (delaycomm). Without a command it runs 'table'.",
        epilog="Bad input exits with status 2 and names the option. Design notes: docs/sim.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{table,scenarios,run}")

    t = sub.add_parser(
        "table",
        parents=[common],
        help="reproduce seed 002's table (and the max-staleness sweep); the default command",
        description="Run BSP, SSP(s) and ASP to the same wall-clock budget and print seed 002's "
        "table, with the published numbers and whether each is within seed-to-seed noise.",
    )
    t.add_argument(
        "--lead", type=count, default=2, metavar="S", help="lead bound of the table's SSP row, lead:S (default 2)"
    )
    t.add_argument(
        "--sweep",
        type=bounds_list,
        default=[2, 8, None],
        metavar="LIST",
        help="lead bounds of the max-staleness sweep (default 2,8,inf)",
    )

    s = sub.add_parser(
        "scenarios",
        parents=[common],
        help="heavy-tailed delay, stale policies, step-size rules",
        description="Beyond the seed: the models, the stale policies and the step-size rules under a "
        "heavy-tailed worker-to-server delay, judged at a short and a long budget.",
    )
    s.add_argument(
        "--delay",
        type=argtypes.delay_spec,
        default=ex.HEAVY_TAIL_DELAY,
        metavar="SPEC",
        help=f"network delay of every update (default {ex.HEAVY_TAIL_DELAY})",
    )
    s.add_argument(
        "--short-budget",
        type=positive,
        default=50.0,
        metavar="SECONDS",
        help="the short budget the losses are also read at (default 50)",
    )

    r = sub.add_parser(
        "run",
        parents=[common],
        help="simulate one configuration",
        description="Simulate one configuration (every knob) and print its row.",
    )
    which = r.add_mutually_exclusive_group()
    # default None, not "asp": argparse does not notice a conflict when a value is the default object.
    which.add_argument(
        "--model",
        type=model_arg,
        default=None,
        help="bsp, asp, lead:S (SSP: a worker at most S >= 1 applied steps ahead of the slowest; not "
        "the backend's ssp:S, see docs/sim.md) or lead:inf (default asp)",
    )
    which.add_argument("--lead", type=lead_arg, metavar="S", help="shorthand for --model lead:S (S >= 1 or inf)")
    r.add_argument(
        "--delay",
        type=argtypes.delay_spec,
        default="none",
        metavar="SPEC",
        help="network delay of each update, the backend's syntax: exp:p99=400ms, exp:mean=400ms, "
        "lognormal:p50=60ms,p99=400ms, pareto:p50=..,p99=.., const:50ms, trace:FILE, none (default "
        "none)",
    )
    r.add_argument(
        "--delay-fraction",
        type=fraction,
        default=1.0,
        metavar="P",
        help="fraction of updates delayed, in [0, 1] (default 1)",
    )
    r.add_argument(
        "--delay-where",
        choices=("network", "host"),
        default="network",
        help="network: the worker goes on while its update is in flight; host: it waits (default network)",
    )
    r.add_argument("--policy", choices=POLICIES, default="apply", help="stale policy (default apply)")
    r.add_argument(
        "--alpha", type=unit_open, default=0.1, help="EMA blend weight of stale contributions, in (0, 1] (default 0.1)"
    )
    r.add_argument(
        "--stale-after",
        type=non_negative_int,
        metavar="TAU",
        help="largest staleness counted as fresh by drop/ema (default N-1)",
    )
    r.add_argument("--step", choices=STEP_RULES, default="const", help="step-size rule (default const)")
    r.add_argument(
        "--dc-lambda",
        type=non_negative,
        default=0.04,
        help="DC-ASGD lambda (dcasgd) or lambda0 (dcasgd-a) (default 0.04)",
    )
    r.add_argument("--radius", type=positive, default=10.0, help="projection radius R of the anytime rule (default 10)")
    t.set_defaults(handler=cmd_table, subparser=t)
    s.set_defaults(handler=cmd_scenarios, subparser=s)
    r.set_defaults(handler=cmd_run, subparser=r)
    return parser


def _overrides(args: argparse.Namespace) -> dict:
    """SimConfig fields the user set explicitly."""
    out: dict = {}
    for name in ("workers", "budget", "straggler", "stragglers", "base_time", "comm", "jitter"):
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    if getattr(args, "comm_model", None) is not None:
        out["comm"] = _modelled_comm(args, out.get("workers", ex.seed002_config().workers))
    elif getattr(args, "comm_bytes", None) is not None or getattr(args, "comm_nodes", None) is not None:
        raise ValueError("--comm-bytes and --comm-nodes need --comm-model FILE")
    base = ex.seed002_config()
    if args.lr is not None:
        out["step"] = dataclasses.replace(base.step, lr=args.lr)
    if args.batch is not None:
        out["problem"] = dataclasses.replace(base.problem, batch=args.batch)
    return out


def _modelled_comm(args: argparse.Namespace, workers: int) -> float:
    """--comm from the cost model: the all-reduce of --comm-bytes over the workers, as NCCL would pick it."""
    from delaycomm import costmodel

    if args.comm is not None:
        raise ValueError("--comm and --comm-model both set the step's communication time: give one")
    if args.comm_bytes is None:
        raise ValueError("--comm-model needs --comm-bytes SIZE (the bytes each worker all-reduces per step)")
    nodes = args.comm_nodes or 1
    try:
        model = costmodel.load(args.comm_model)
        return model.seconds("all_reduce", args.comm_bytes, costmodel.Topology(workers, nodes))
    except costmodel.ModelError as e:
        raise ValueError(f"--comm-model: {e}") from None


def _progress(args: argparse.Namespace, desc: str):
    def wrap(items: Sequence[SimConfig]) -> Iterable[SimConfig]:
        # without tqdm (an optional module: docs/sim.md), no bar, as when stderr is not a terminal
        if args.no_progress or not optional.progress_enabled("auto", sys.stderr.isatty()):
            return items
        from tqdm import tqdm

        # disable=None: no bar when stderr is not a terminal (logs, CI).
        return tqdm(items, desc=desc, unit="run", file=sys.stderr, delay=2.0, leave=False, disable=None)

    return wrap


def _rows(specs, results, progress_offset=0) -> list[Row]:
    rows, k = [], progress_offset
    for name, cfgs, published in specs:
        runs = results[k : k + len(cfgs)]
        k += len(cfgs)
        rows.append(Row(name, runs, published if isinstance(published, dict) else None))
    return rows


def _summary(row: Row) -> dict:
    out = {}
    for col in COLUMNS:
        v = row.values(col)
        out[col.key] = {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if v.size > 1 else None}
    return out


# ------------------------------------------------------------------------------------------------ commands
def cmd_table(args: argparse.Namespace) -> int:
    k = args.seeds or 8
    seeds = list(range(args.seed, args.seed + k))
    overrides = _overrides(args)
    specs = ex.seed002_rows(seeds, args.lead, overrides)
    sweep = ex.staleness_sweep_rows(seeds, args.sweep, overrides)
    configs = [c for _, cfgs, _ in specs + sweep for c in cfgs]
    t0 = time.perf_counter()
    results = ex.run_configs(configs, None, _progress(args, "table"))
    elapsed = time.perf_counter() - t0
    rows = _rows(specs, results)
    for row in rows:
        row.name = row.runs[0].title
    sweep_rows = _rows([(m, c, None) for m, c, _ in sweep], results, sum(len(c) for _, c, _ in specs))
    cfg = rows[0].runs[0].config
    print(
        f"# delaycomm.sim table: N={cfg.workers}, {cfg.stragglers} straggler(s) at {cfg.straggler:g}x, "
        f"budget {cfg.budget:g} s, seeds {seeds[0]}..{seeds[-1]} ({k} run(s) per row, mean ±sd)"
    )
    print(format_table(rows, title="consistency model"))
    print()
    sweep_cols = [c for c in COLUMNS if c.key in ("mean_staleness", "max_staleness")]
    for (model, _, pub), row in zip(sweep, sweep_rows):
        row.name = "lead:inf (ASP)" if model == "asp" else model
        row.published = None if pub is None else {"max_staleness": pub}
    print(format_table(sweep_rows, sweep_cols, title="max staleness vs lead"))
    checks = []
    if k >= 2 and not overrides:
        checks = ex.check_published(rows) + ex.check_published(sweep_rows)
        bad = [c for c in checks if not c.ok]
        print()
        print(
            f"# published numbers within noise (|mean - published| <= max(2 sd, floor)): "
            f"{len(checks) - len(bad)}/{len(checks)}"
        )
        for c in bad:
            print(
                f"#   MISS {c.row} {c.column}: published {c.published:g}, ours {c.mean:.4g} ±{c.sd:.2g}, "
                f"off by {abs(c.mean - c.published):.3g} > tolerance {c.tolerance:.3g}"
            )
    elif overrides:
        print("\n# settings differ from seed 002's: published numbers not compared")
    print(f"# {len(set(configs))} distinct runs in {elapsed:.1f} s")
    if args.plot:
        series = [(r.name, r.runs) for r in rows]
        opt = _optimum(rows[0].runs[0].config)
        print("# plot:", plot_loss(series, f"{args.plot}/table_loss.png", "loss vs wall clock (seed 002 setting)", opt))
        print("# plot:", plot_staleness(series, f"{args.plot}/table_staleness.png", "staleness per model"))
        print(
            "# plot:",
            plot_staleness(
                [(r.name, r.runs) for r in sweep_rows], f"{args.plot}/sweep_staleness.png", "staleness vs lead bound"
            ),
        )
    if args.json:
        write_json(
            args.json,
            {
                "command": "table",
                "seeds": seeds,
                "elapsed_s": elapsed,
                "rows": [
                    {
                        "name": r.name,
                        "model": r.runs[0].label,
                        "published": r.published,
                        "summary": _summary(r),
                        "runs": [result_record(x) for x in r.runs],
                    }
                    for r in rows
                ],
                "sweep": [
                    {
                        "name": r.name,
                        "model": r.runs[0].label,
                        "published": r.published,
                        "summary": _summary(r),
                        "max_staleness": [x.max_staleness for x in r.runs],
                    }
                    for r in sweep_rows
                ],
                "checks": [dataclasses.asdict(c) for c in checks],
            },
        )
    return 0


def _optimum(cfg: SimConfig) -> float:
    from .problem import LogisticProblem

    return LogisticProblem(cfg.problem, cfg.workers).optimum()[1]


def cmd_scenarios(args: argparse.Namespace) -> int:
    k = args.seeds or 4
    seeds = list(range(args.seed, args.seed + k))
    overrides = _overrides(args)
    long_budget = overrides.pop("budget", 400.0)
    if args.short_budget >= long_budget:
        raise ValueError(f"--short-budget ({args.short_budget:g}) must be below --budget ({long_budget:g})")
    groups = ex.scenario_groups(seeds, args.delay, long_budget, overrides)
    configs = [c for _, rows in groups for _, cfgs in rows for c in cfgs]
    t0 = time.perf_counter()
    results = ex.run_configs(configs, sampler_factory, _progress(args, "scenarios"))
    elapsed = time.perf_counter() - t0
    budgets = (args.short_budget, long_budget)
    extra_cols = [c for c in COLUMNS if c.key in ("updates", "mean_staleness", "max_staleness")]
    print(f"# delaycomm.sim scenarios: seed 002's cluster, seeds {seeds[0]}..{seeds[-1]} ({k} runs per row, mean ±sd)")
    payload = {"command": "scenarios", "seeds": seeds, "delay": args.delay, "budgets_s": list(budgets), "groups": []}
    offset = 0
    for title, specs in groups:
        rows = _rows([(n, c, None) for n, c in specs], results, offset)
        offset += sum(len(c) for _, c in specs)
        for row in rows:
            row.extra["dropped"] = ("dropped", "count", [x.dropped for x in row.runs], 0)
            for b in budgets:
                row.extra[f"loss_{b:g}"] = (f"loss@{b:g}s", "log-loss", [ex.loss_at(x, b) for x in row.runs], 4)
            # The worst loss of the second half: a very stale update at a large step shows up as a spike.
            row.extra["peak_loss"] = (
                "peak, 2nd half",
                "log-loss",
                [ex.peak_loss(x, long_budget / 2) for x in row.runs],
                4,
            )
        print(f"\n## {title}")
        print(format_table(rows, extra_cols, title="configuration"))
        verdicts = ex.winners(rows, budgets)
        for v in verdicts:
            tied = f"; not distinguishable (2 SE): {', '.join(v.ties)}" if v.ties else ""
            kind = "short" if v.budget == budgets[0] else "long"
            print(f"#   best at {v.budget:g} s ({kind} budget): {v.best} (mean loss {v.loss:.4f}){tied}")
        payload["groups"].append(
            {
                "title": title,
                "verdicts": [dataclasses.asdict(v) for v in verdicts],
                "rows": [
                    {"name": r.name, "summary": _summary(r), "runs": [result_record(x) for x in r.runs]} for r in rows
                ],
            }
        )
        if args.plot:
            slug = title.split(",")[0].split(" (")[0].replace(" ", "_").replace("-", "_")
            print(
                "# plot:",
                plot_loss(
                    [(r.name, r.runs) for r in rows],
                    f"{args.plot}/scenario_{slug}_loss.png",
                    title,
                    _optimum(rows[0].runs[0].config),
                ),
            )
            print(
                "# plot:",
                plot_staleness([(r.name, r.runs) for r in rows], f"{args.plot}/scenario_{slug}_staleness.png", title),
            )
    print(f"\n# {len(set(configs))} distinct runs in {elapsed:.1f} s")
    if args.json:
        payload["elapsed_s"] = elapsed
        write_json(args.json, payload)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    k = args.seeds or 1
    seeds = list(range(args.seed, args.seed + k))
    model = args.lead or args.model or "asp"
    overrides = _overrides(args)
    step = dataclasses.replace(
        overrides.get("step", ex.seed002_config().step), rule=args.step, dc_lambda=args.dc_lambda, radius=args.radius
    )
    overrides.update(
        step=step,
        delay=args.delay,
        delay_fraction=args.delay_fraction,
        delay_where=args.delay_where,
        policy=args.policy,
        alpha=args.alpha,
        stale_after=args.stale_after,
    )
    configs = [ex.seed002_config(model, s, **overrides) for s in seeds]
    t0 = time.perf_counter()
    results = ex.run_configs(configs, sampler_factory, _progress(args, "run"))
    elapsed = time.perf_counter() - t0
    row = Row(results[0].title, results)
    row.extra["dropped"] = ("dropped", "count", [x.dropped for x in results], 0)
    bound = results[0].bound
    print(
        f"# delaycomm.sim run: {model}, policy {args.policy}, step {args.step}, delay {args.delay}, "
        f"seeds {seeds[0]}..{seeds[-1]}; staleness bound {'none' if bound == float('inf') else int(bound)}"
    )
    print(format_table([row], title="consistency model"))
    print(f"# {len(configs)} run(s) in {elapsed:.1f} s")
    if args.plot:
        print("# plot:", plot_loss([(row.name, results)], f"{args.plot}/run_loss.png", row.name, _optimum(configs[0])))
        print("# plot:", plot_staleness([(row.name, results)], f"{args.plot}/run_staleness.png", row.name))
    if args.json:
        write_json(
            args.json,
            {
                "command": "run",
                "seeds": seeds,
                "elapsed_s": elapsed,
                "summary": _summary(row),
                "runs": [result_record(x) for x in results],
            },
        )
    return 0


def with_default_command(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``table`` put first when it names no command (``python -m delaycomm.sim [--seeds 2]``)."""
    argv = list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        return ["table", *argv]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point.

    Args:
        argv: Arguments (default ``sys.argv[1:]``); without a command, ``table`` runs.

    Returns:
        The exit status (argument errors exit with 2 via argparse).
    """
    parser = build_parser()
    args = parser.parse_args(with_default_command(sys.argv[1:] if argv is None else argv))
    if args.plot:  # before simulating: a missing matplotlib is bad input, not a traceback after the runs
        optional.require_for_flag(args.subparser, "--plot", "matplotlib")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.handler(args)
    except ValueError as exc:
        args.subparser.error(str(exc))  # exits with status 2
    return 2
