"""The multi-seed runner: every config x seed once, each run's record on disk, resumable, with a progress bar.

One loop for every kind of job (a user's script under torchrun, :mod:`delaycomm.experiment.script`; a built-in
task on forked ranks, :mod:`delaycomm.experiment.builtin`). A job runs one (config, seed) and returns a *record*::

    {"status": "ok" | "failed" | "timeout" | "unavailable" | "no effect", "message": str,
     "metrics": {name: float}, "curves": {name: [[step, value], ...]}, "delaycomm": {...} | None,
     "wall_s": float, "detail": {...}}

With an output folder, each record is written to ``<out>/runs/<config>/seed<k>.json`` as soon as its run ends, with
the *fingerprint* of what produced it (the job: script, its arguments and its content's hash, ranks...; the
config's settings; the seed). A later run with the same folder reuses every ``ok`` record whose fingerprint is the
same, and runs the rest again (failed, timed out, missing). A record whose fingerprint differs is never reused
and never overwritten: the run stops before it starts anything, naming the file and the first field that differs.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from delaycomm._tools.output import write_json

__all__ = ["Job", "StudyError", "Interrupted", "run_study", "record_path", "record_problem", "OK"]

OK = "ok"


class StudyError(ValueError):
    """The output folder holds results of another experiment (or cannot be used); nothing was run."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a study: the run in flight was stopped (and not recorded); every finished run is on
    disk. ``signal``: the signal's name; ``running``: the run stopped (``config seed k``) or None; ``finished``,
    ``reused``: runs finished in this call, records reused from the output folder; ``ok``: the ``ok`` records among
    both (what a resume reuses); ``out``: the output folder (set by the command line)."""

    def __init__(
        self, signal: str = "SIGINT", running: str | None = None, finished: int = 0, reused: int = 0, ok: int = 0
    ):
        super().__init__(signal)
        self.signal, self.running, self.finished, self.reused, self.ok = signal, running, finished, reused, ok
        self.out: str | None = None


class Job(Protocol):
    """What :func:`run_study` needs of a job."""

    def fingerprint(self) -> dict[str, Any]: ...

    def config_fingerprint(self, config: Any) -> dict[str, Any]: ...

    def run(self, config: Any, seed: int, rundir: Path | None, progress: Callable[[str], None]) -> dict[str, Any]: ...


def record_path(out: Path, config: str, seed: int) -> Path:
    return out / "runs" / config / f"seed{seed}.json"


def _first_difference(a: Any, b: Any, where: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            d = _first_difference(a.get(k), b.get(k), f"{where}.{k}" if where else k)
            if d:
                return d
        return None
    return None if a == b else f"{where}: {a!r} there, {b!r} now"


def _load(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StudyError(f"{path}: cannot be read as a result ({e}); remove it or give another --out") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("fingerprint"), dict) or "record" not in doc:
        raise StudyError(f"{path}: not a result of delaycomm.experiment; remove it or give another --out")
    return doc


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def record_problem(rec: Any, config: str, seed: int) -> str | None:
    """What makes a stored record unusable for (config, seed), or None: every field the analysis reads, with a
    finite number for every metric and every point of a curve."""
    if not isinstance(rec, dict):
        return f"the record is a {type(rec).__name__}, not an object"
    if rec.get("config") != config or rec.get("seed") != seed:
        return f"the record is of {rec.get('config')!r} seed {rec.get('seed')!r}, not {config!r} seed {seed}"
    if not isinstance(rec.get("message", ""), str) or not _finite(rec.get("wall_s", 0.0)):
        return "its message or wall_s is not of the right type"
    metrics = rec.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        return "it has no metrics"
    for name, v in metrics.items():
        if not _finite(v):
            return f"metric {name!r} is {v!r}, not a finite number"
    curves = rec.get("curves", {})
    if not isinstance(curves, dict):
        return "its curves are not an object"
    for name, points in curves.items():
        ok = isinstance(points, list) and all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and _finite(p[1]) for p in points
        )
        if not ok:
            return f"curve {name!r} is not a list of [step, finite number]"
    for key in ("delaycomm", "detail"):
        if rec.get(key) is not None and not isinstance(rec.get(key), dict):
            return f"its {key} is not an object"
    return None


def _plan(
    job: Job, configs: Sequence[Any], seeds: Sequence[int], out: Path | None, fresh: bool, note: Callable[[str], None]
) -> list:
    """(config, seed, fingerprint, reusable record or None) per run; raises StudyError on a foreign result."""
    plan = []
    common = job.fingerprint()
    for config in configs:
        for seed in seeds:
            fp = {"job": common, "config": job.config_fingerprint(config), "seed": seed}
            reuse = None
            if out is not None and not fresh:
                doc = _load(record_path(out, config.name, seed))
                if doc is not None:
                    diff = _first_difference(doc["fingerprint"], json.loads(json.dumps(fp)))
                    if diff:
                        raise StudyError(
                            f"{record_path(out, config.name, seed)} holds a result of another experiment ({diff}); "
                            "give another --out, or --fresh to run every config and seed again"
                        )
                    rec = doc["record"]
                    if isinstance(rec, dict) and rec.get("status") == OK:
                        problem = record_problem(rec, config.name, seed)
                        if problem is None:
                            reuse = rec
                        else:
                            note(f"{record_path(out, config.name, seed)}: {problem}; running it again")
                    elif not isinstance(rec, dict):
                        note(f"{record_path(out, config.name, seed)}: {record_problem(rec, config.name, seed)}; "
                             "running it again")  # fmt: skip
            plan.append((config, seed, fp, reuse))
    return plan


class _Progress:
    """A tqdm bar over runs on stderr (a line per run when tqdm is not installed); None: only on a terminal."""

    def __init__(self, total: int, enabled: bool | None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bar = None
        if self.enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                self.bar = None
        self.done, self.total = 0, total

    def start(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_description(label)
        elif self.enabled:
            print(f"# [{self.done + 1}/{self.total}] {label}", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)

    def advance(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str("")
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_study(
    job: Job,
    configs: Sequence[Any],
    seeds: Sequence[int],
    out: Path | None = None,
    *,
    fresh: bool = False,
    progress: bool | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Run every (config, seed) not already done in ``out``.

    Returns:
        (records, reused): one record per (config, seed), in config-major order, each with ``config`` and ``seed``
        set; how many came from ``out``.

    Raises:
        StudyError: ``out`` holds a result with another fingerprint, or a file that is not a result.
    """
    plan = _plan(job, configs, seeds, out, fresh, lambda text: print(f"# {text}", file=sys.stderr, flush=True))
    bar = _Progress(len(plan), progress)
    records: list[dict[str, Any]] = []
    reused = 0
    label = None
    try:
        if any(reuse is None for *_, reuse in plan) and hasattr(job, "prepare"):
            job.prepare()
        for config, seed, fp, reuse in plan:
            label = f"{config.name} seed {seed}"
            if reuse is not None:
                records.append(reuse)
                reused += 1
                bar.advance()
                continue
            bar.start(label)
            records.append(_run_one(job, config, seed, fp, out, bar.note))
            bar.advance()
        label = None
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as run_cli turns it into Interrupted
        name = e.signal if isinstance(e, Interrupted) else "SIGINT"
        ok = sum(r.get("status") == OK for r in records)
        raise Interrupted(name, label, len(records) - reused, reused, ok) from None
    finally:
        bar.close()
    return records, reused


def _run_one(job: Job, config: Any, seed: int, fp: dict, out: Path | None, note: Callable[[str], None]) -> dict:
    """One run, its record written to ``out`` as soon as it ends."""
    rundir = None
    if out is not None:
        rundir = out / "runs" / config.name / f"seed{seed}"
        try:
            os.makedirs(rundir, exist_ok=True)
        except OSError as e:
            raise StudyError(f"cannot create {rundir}: {e.strerror or e}") from None
    started = time.monotonic()
    rec = job.run(config, seed, rundir, note)
    rec.setdefault("wall_s", time.monotonic() - started)
    rec = {"config": config.name, "seed": seed, **rec}
    if out is not None:
        path = record_path(out, config.name, seed)
        try:
            write_json(str(path), {"fingerprint": fp, "record": rec})
        except OSError as e:
            raise StudyError(f"cannot write {path}: {e.strerror or e}") from None
    return rec
