"""``python -m delaycomm.experiment run [options] -- train.py ARGS``: the user's own job under each config, several
seeds, with statistics (docs/experiment.md, "Your own job")."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from delaycomm._tools import args as argtypes
from delaycomm._tools.output import write_json

__all__ = [
    "build_run_parser",
    "parse_run_args",
    "main_run",
    "table_configs",
    "RUN_DEFAULT_CONFIGS",
    "interruptible",
    "interrupted_line",
]

RUN_DEFAULT_CONFIGS = ("gloo", "bsp-delay", "straggler", "ssp2-ema", "asp-apply", "asp-drop")
DEFAULT_SEEDS = 5
DEFAULT_RUN_TIMEOUT_S = 600.0
REFERENCE_DESCRIPTION = (
    "the reference: nothing configured; delaycomm forwards every collective to Gloo unchanged (bitwise Gloo)"
)
PROG = "python -m delaycomm.experiment run"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ValueError(message)


def add_knobs(p: argparse.ArgumentParser, delay_default: str) -> None:
    """The knobs the built-in tasks and ``run`` share (applied to the table's configs)."""
    p.add_argument(
        "--delay",
        type=argtypes.delay_spec,
        default=delay_default,
        metavar="SPEC",
        help=f"delay of the delayed configs (default: {delay_default}); any delaycomm spec",
    )
    p.add_argument(
        "--fraction",
        type=argtypes.number(0.0, 1.0),
        default=None,
        help="delay_fraction of the delayed configs, in [0, 1] (default: the backend's, 0.3)",
    )
    p.add_argument(
        "--ema-alpha",
        type=argtypes.number(0.0, 1.0, lo_open=True),
        default=None,
        metavar="ALPHA",
        help="ema_alpha of the stale configs, in (0, 1] (default: the backend's, 0.1)",
    )
    p.add_argument(
        "--delay-cap",
        metavar="CAP",
        default=None,
        help="cap the delay's tail: 'mean' (at the spec's mean) or a duration such as 25ms; the capped distribution "
        "is replayed as a trace file (docs/experiment.md)",
    )
    p.add_argument(
        "--step-ms",
        type=argtypes.number(0.0, lo_open=True),
        default=None,
        metavar="MS",
        help="step time that turns a delay into steps of staleness (default: calibrated by the backend)",
    )


def add_outputs(p: argparse.ArgumentParser, plot_suffixes: tuple[str, ...]) -> None:
    p.add_argument("--json", type=argtypes.output_path(), metavar="FILE", help="write every run and the statistics")
    p.add_argument(
        "--plot",
        type=argtypes.output_path(plot_suffixes),
        metavar="FILE",
        help="metric per config with 95%% interval bars, curves per config with a 95%% band",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--fresh", action="store_true", help="run everything again, ignoring the results in --out")


def build_run_parser() -> argparse.ArgumentParser:
    from delaycomm.experiment.configs import DEFAULT_DELAY

    p = _Parser(
        prog=PROG + " [options] -- train.py [ARGS]",
        description="Your own training script, unmodified, under torchrun once per config and seed; the metrics "
        "it prints on rank 0 (DELAYCOMM_METRIC name=value, or delaycomm.experiment.report(...)) and delaycomm's "
        "own stats, with a mean and 95%% interval per config and a paired comparison with the baseline.",
    )
    p.add_argument(
        "--configs", metavar="NAMES", help=f"configs of the table (default: {','.join(RUN_DEFAULT_CONFIGS)})"
    )
    p.add_argument("--config-file", metavar="FILE", help="configs as sections of DELAYCOMM_* settings (instead)")
    p.add_argument("--baseline", default="gloo", metavar="NAME", help="the config compared with (default: gloo)")
    p.add_argument("--seeds", type=argtypes.integer(1, 1000), default=DEFAULT_SEEDS, help="seeds 0..N-1 (default 5)")
    p.add_argument("--nproc", type=argtypes.integer(1, 1024), default=2, help="ranks (torchrun's --nproc_per_node)")
    p.add_argument(
        "--launcher",
        choices=("torchrun", "forked"),
        default="torchrun",
        help="torchrun (default: python -m torch.distributed.run, as you run it) or forked (ranks forked from one "
        "process that imported torch once: the same script, seconds faster per run; docs/experiment.md)",
    )
    p.add_argument(
        "--timeout",
        type=argtypes.number(0.0, lo_open=True),
        default=DEFAULT_RUN_TIMEOUT_S,
        metavar="SECONDS",
        help=f"limit per run, start-up included (default: {DEFAULT_RUN_TIMEOUT_S:g})",
    )
    p.add_argument("--out", default="delaycomm-experiment", metavar="DIR", help="results folder, resumable")
    p.add_argument("--lower-better", default="", metavar="NAMES", help="metrics where lower is better")
    p.add_argument("--higher-better", default="", metavar="NAMES", help="metrics where higher is better")
    p.add_argument(
        "--update-stats",
        action="store_true",
        help="DELAYCOMM_UPDATE_STATS=1 for the stale configs: delaycomm measures each rank's contribution against its "
        "BSP one (an extra pass per stale step; docs/telemetry.md)",
    )
    p.add_argument("--list-configs", action="store_true", help="print the configs and their settings, then exit")
    add_knobs(p, DEFAULT_DELAY)
    add_outputs(p, (".png", ".pdf", ".svg"))
    return p


def _env_value(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def table_configs(ns: argparse.Namespace, names: list[str] | None, trace_dir: str) -> list:
    """The table's configs as environment settings (only the DDP rows: the parallelism is the script's)."""
    from delaycomm.experiment.configs import CONFIGS, resolved_options
    from delaycomm.experiment.families import capped_trace
    from delaycomm.experiment.script import ScriptConfig

    usable = {c.name: c for c in CONFIGS if c.parallel == "ddp"}
    chosen = names or list(RUN_DEFAULT_CONFIGS)
    for n in chosen:
        if n not in usable:
            raise ValueError(f"argument --configs: unknown config {n!r}; accepted: {', '.join(usable)}")
    if len(set(chosen)) != len(chosen):
        raise ValueError("argument --configs: a config is listed twice")
    delay = ns.delay
    if ns.delay_cap is not None:
        os.makedirs(trace_dir, exist_ok=True)
        try:
            delay = capped_trace(ns.delay, ns.delay_cap, trace_dir)
        except ValueError as e:
            raise ValueError(f"argument --delay-cap: {e}") from None
    out = []
    for n in chosen:
        c = usable[n]
        opts = resolved_options(c, delay, None, ns.step_ms, ns.fraction, ns.ema_alpha)
        env = {f"DELAYCOMM_{k.upper()}": _env_value(v) for k, v in opts.items()}
        if getattr(ns, "update_stats", False) and str(opts.get("staleness", "bsp")) not in ("bsp", "ssp:0"):
            env["DELAYCOMM_UPDATE_STATS"] = "1"
        desc = REFERENCE_DESCRIPTION if not env else c.description
        out.append(ScriptConfig(n, env, desc))
    return out


def parse_run_args(argv: list[str]) -> tuple[argparse.Namespace, list, Any]:
    """Parse ``run``'s command line: (namespace, configs, job). Raises ValueError naming the flag."""
    from delaycomm.experiment.configfile import parse_config_file
    from delaycomm.experiment.script import ScriptConfig, ScriptJob

    if "--" in argv:
        i = argv.index("--")
        opts, command = argv[:i], argv[i + 1 :]
    else:
        opts, command = argv, []
    ns = build_run_parser().parse_args(opts)
    if ns.list_configs:
        return ns, table_configs(ns, list(RUN_DEFAULT_CONFIGS) + ["bsp"], os.path.join(ns.out, "delays")), None
    if not command:
        raise ValueError(f"give the script after --: {PROG} [options] -- train.py [ARGS]")
    if not os.path.isfile(command[0]):
        raise ValueError(f"the script {command[0]!r} is not a file")
    _check_out(ns.out)
    if ns.config_file:
        knobs = [f for f in ("fraction", "ema_alpha", "delay_cap", "step_ms") if getattr(ns, f) is not None]
        knobs += ["update_stats"] if ns.update_stats else []
        if knobs:
            raise ValueError(
                f"argument --config-file: --{knobs[0].replace('_', '-')} applies to the built-in table's configs; "
                "with --config-file, set it in the file (DELAYCOMM_*)"
            )
        if ns.configs:
            raise ValueError("argument --config-file: give either --configs or --config-file")
        configs = parse_config_file(ns.config_file)
        if ns.baseline not in {c.name for c in configs}:
            if ns.baseline != "gloo":
                raise ValueError(f"argument --baseline: {ns.baseline!r} is not a config of {ns.config_file}")
            configs.insert(0, ScriptConfig("gloo", {}, REFERENCE_DESCRIPTION))
    else:
        names = None if ns.configs is None else [n.strip() for n in ns.configs.split(",")]
        configs = table_configs(ns, names, os.path.join(ns.out, "delays"))
        if ns.baseline not in {c.name for c in configs}:
            raise ValueError(f"argument --baseline: {ns.baseline!r} is not among the configs run")
    if ns.plot:
        from delaycomm.experiment.tasks import require_matplotlib

        require_matplotlib()
    job = ScriptJob(command[0], tuple(command[1:]), ns.nproc, ns.timeout, os.getcwd(), ns.launcher)
    return ns, configs, job


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _check_out(out: str) -> None:
    """The results folder can be created and written, before any run starts."""
    from delaycomm._tools.output import check_writable

    try:
        os.makedirs(out, exist_ok=True)
        check_writable(os.path.join(out, "runs"))
    except OSError as e:
        raise ValueError(f"argument --out: cannot write results in {out!r}: {e.strerror or e}") from None


@contextlib.contextmanager
def interruptible():
    """SIGTERM as Ctrl-C: both raise :class:`delaycomm.experiment.study.Interrupted` in the main thread; once one
    arrived, the next are ignored until the run in flight is stopped (a second Ctrl-C cannot leave it running)."""
    from delaycomm.experiment.study import Interrupted

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signal.Signals(signum).name)

    saved = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def interrupted_line(e: Any, prog: str = PROG) -> str:
    """The one line that an interrupted study prints: what was stopped, what was kept, how to resume."""
    if e.out is None:  # not in a study (before it, or after it while the results are written)
        return f"{prog}: interrupted by {e.signal}; every finished run is in its results folder (--out)"
    stopped = f"stopped {e.running} (not recorded)" if e.running else "no run was in flight"
    return (
        f"{prog}: interrupted by {e.signal}: {stopped}; {e.ok} ok run(s) kept in {e.out or 'the results folder'} "
        f"({e.finished} finished now, {e.reused} reused); run the same command again to resume (the failed and "
        "the missing runs run again)"
    )


def main_run(argv: list[str]) -> int:
    """``run``: exit 0 when every run is ok, 1 when a run failed, timed out or had no effect, 2 for bad arguments,
    130 when interrupted (Ctrl-C or SIGTERM: the run in flight is stopped, the finished ones are kept)."""
    from delaycomm.experiment.study import Interrupted

    try:
        with interruptible():
            return _main_run(argv)
    except Interrupted as e:
        print(interrupted_line(e), file=sys.stderr, flush=True)
        return 130
    except KeyboardInterrupt:  # raised by code that ignored the handler's exception type
        print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
        return 130


def _main_run(argv: list[str]) -> int:
    """``run``: exit 0 when every run is ok, 1 when a run failed, timed out or had no effect, 2 for bad arguments."""
    from delaycomm._tools.machine import machine_info, versions
    from delaycomm.experiment.analysis import analyze, format_delaycomm, format_errors, format_stats, plot_study
    from delaycomm.experiment.configs import command_line
    from delaycomm.experiment.study import Interrupted, StudyError, run_study
    from delaycomm.experiment.tasks import MissingExtra

    try:
        ns, configs, job = parse_run_args(argv)
        if job is None:  # --list-configs
            for c in configs:
                print(f"  {c.name:<11} {' '.join(f'{k}={v}' for k, v in c.env.items()) or '-'}  ({c.description})")
            return 0
        started = time.monotonic()
        try:
            records, reused = run_study(
                job,
                configs,
                list(range(ns.seeds)),
                Path(ns.out),
                fresh=ns.fresh,
                progress=False if ns.no_progress else None,
            )
        except Interrupted as e:
            e.out = ns.out
            raise
    except (ValueError, StudyError, MissingExtra) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    doc = analyze(records, [c.name for c in configs], ns.baseline, _names(ns.lower_better), _names(ns.higher_better))
    m, v = machine_info(), versions(("torch",))
    header = [
        f"delaycomm.experiment run: {' '.join([job.script, *job.args])}, {job.nproc} rank(s) ({job.launcher}), "
        f"seeds 0..{ns.seeds - 1}",
        f"baseline {ns.baseline}; paired by seed; {int(doc['confidence'] * 100)}% t intervals; results in {ns.out}",
        f"machine: {m['hostname']}, {m['cpu_count']} CPUs ({m['cpu']}), load {m['loadavg']}, torch {v['torch']}",
    ]
    print(format_stats(doc, header))
    print(format_delaycomm(doc))
    for line in format_errors(records):
        print(line)
    print(f"# {len(records)} runs, {reused} reused from {ns.out}; duration {time.monotonic() - started:.1f} s")
    out = {
        "tool": "delaycomm.experiment run",
        "argv": command_line(),
        "machine": m,
        "versions": v,
        "job": job.fingerprint(),
        "configs": [
            {"name": c.name, "env": dict(c.env), "description": c.description, "source": c.source} for c in configs
        ],
        "seeds": list(range(ns.seeds)),
        "runs": records,
        "analysis": doc,
    }
    if ns.json:
        write_json(ns.json, out)
        print(f"# wrote {ns.json}")
    if ns.plot:
        plot_study(doc, ns.plot, header[0])
        print(f"# wrote {ns.plot}")
    return 0 if all(r["status"] == "ok" for r in records) else 1
