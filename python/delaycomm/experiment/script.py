"""A user's training script as a job of the multi-seed runner: unmodified, under the real torchrun, once per
(config, seed) (docs/experiment.md, "Your own job").

Each run is ``python -m torch.distributed.run --standalone --nproc_per_node N --max-restarts 0 --log-dir DIR
--redirects 3 train.py ARGS`` in the caller's working directory, with the caller's environment less every
``DELAYCOMM_*`` variable (``DELAYCOMM_LOG_LEVEL`` kept), plus

- the config's own ``DELAYCOMM_*`` settings (the reference ``gloo``: none);
- ``DELAYCOMM_SEED=<seed>``: the delay schedule's seed, and the seed the script may read for its own data order
  and initial weights (``delaycomm.experiment.seed()``);
- ``DELAYCOMM_STATS=<run folder>/stats/``: every rank writes delaycomm's telemetry there when its group ends.

The run's metrics are rank 0's ``DELAYCOMM_METRIC`` lines (:mod:`delaycomm.experiment.metrics`), read from the
rank's own log (torchrun's ``--redirects``); its wall clock is the launch's, start-up included. Its record says
``failed`` (the exit code and the script's last error line), ``timeout`` (past ``--timeout``: every process of the
launch is stopped), ``no effect`` (a config's setting left no trace in delaycomm's telemetry, or no rank created a
delaycomm group) or ``ok``.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from delaycomm._tools.launch import describe_exit, stop_tree
from delaycomm.experiment.configs import effect_problems
from delaycomm.experiment.metrics import SEED_ENV, MetricLineError, parse
from delaycomm.experiment.metrics import shorten_message as shorten
from delaycomm.experiment.summary import telemetry

__all__ = ["ScriptConfig", "ScriptJob", "option_names", "failure_message", "torchrun_exit"]

_KEEP_ENV = ("DELAYCOMM_LOG_LEVEL",)
_POLL_S = 0.5
_STOP_PATIENCE_S = 5.0


@dataclasses.dataclass(frozen=True)
class ScriptConfig:
    """One config of a user's job: a name and its ``DELAYCOMM_*`` settings.

    Attributes:
        name: the row's name (letters, digits, ``_ . -``).
        env: the ``DELAYCOMM_*`` variables of this config (empty: the reference, nothing configured).
        description: one line for the table.
        source: where it was defined (``the built-in table``, ``FILE:LINE``).
    """

    name: str
    env: Mapping[str, str]
    description: str = ""
    source: str = "the built-in table"


def option_names(env: Mapping[str, str]) -> dict[str, str]:
    """``{"DELAYCOMM_DELAY": "x"}`` -> ``{"delay": "x"}`` (what :func:`effect_problems` reads)."""
    return {k[len("DELAYCOMM_") :].lower(): v for k, v in env.items()}


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _stop(proc: subprocess.Popen) -> None:
    """Stop the launch and everything it started: the agent's session, the ranks' own sessions and what each
    started in its process group (SIGTERM, then SIGKILL; :func:`delaycomm._tools.launch.stop_tree`)."""
    stop_tree(proc.pid, lambda: proc.poll() is not None, own_group=True, patience_s=_STOP_PATIENCE_S)
    proc.wait()


def _rank_log(logs: Path, rank: int, stream: str) -> Path | None:
    """``<logs>/<run id>/attempt_<k>/<rank>/<stream>.log`` of the last attempt (torchrun's layout)."""
    found = sorted(glob.glob(str(logs / "*" / "attempt_*" / str(rank) / f"{stream}.log")))
    return Path(found[-1]) if found else None


def _last_step(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    steps = re.findall(r"DELAYCOMM_METRIC\s+step=(\d+)", tail)
    return f"step {steps[-1]}" if steps else None


_ERROR_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception|Interrupt|Exit)|[\w.]+Error\b)[^\n]*")
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")  # torch's prefix of each line of a rank's stderr
# torchrun's error summary ("Root Cause (first observed failure):" then "rank : 0 (local_rank: 0)", "exitcode : 3")
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def _error_line(path: Path) -> str | None:
    """The last exception line of a rank's stderr (``ValueError: ...``, torch's ``[rankN]: `` prefix read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - (1 << 20)))  # the end of the file: where a traceback ends
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    errors = [s for s in (_RANK_PREFIX.sub("", ln.strip()).strip() for ln in lines) if _ERROR_LINE.match(s)]
    return errors[-1] if errors else None


def torchrun_exit(launcher_log: Path) -> tuple[int, int] | None:
    """(rank, exit code) of the failed rank, from torchrun's error summary in its own output (its root cause)."""
    try:
        lines = launcher_log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    # the root cause: the other failures listed above it are often ranks the agent stopped after it (SIGTERM)
    root = next((i for i, ln in enumerate(lines) if "Root Cause" in ln), 0)
    rank = None
    for ln in lines[root:]:
        m = _SUMMARY_RANK.match(ln)
        if m:
            rank = int(m.group(1))
            continue
        m = _SUMMARY_EXIT.match(ln)
        if m and rank is not None:
            return rank, int(m.group(1))
    return None


def failure_message(logs: Path, nproc: int, launcher_log: Path, returncode: int | None) -> tuple[int | None, str]:
    """(exit code, message) of a failed launch: the job's own last error line of the first rank that has one, else
    the failed rank's own exit code from torchrun's summary (torchrun itself exits 1), with the log to read."""
    summary = torchrun_exit(launcher_log)
    code = summary[1] if summary else returncode
    first = [summary[0]] if summary else []  # the failed rank first
    ranks = first + [r for r in range(nproc) if r not in first]
    for rank in ranks:
        path = _rank_log(logs, rank, "stderr")
        line = _error_line(path) if path else None
        if line:
            return code, f"rank {rank}: {shorten(line)} (log: {path})"
    if summary:
        rank, c = summary
        path = _rank_log(logs, rank, "stderr")
        return c, f"rank {rank} {describe_exit(c)} with no error line (log: {path or launcher_log})"
    try:
        lines = [ln.strip() for ln in launcher_log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    return code, f"{shorten(lines[-1]) if lines else 'no output'} (log: {launcher_log})"


def _read_stats(stats_dir: Path, nproc: int) -> list[dict] | None:
    """Each rank's stats file of the default group (``stats.rank<r>.json``; ``stats.json`` for one rank), or None
    when no rank wrote one (the script created no delaycomm group)."""
    names = ["stats.json"] if nproc == 1 else [f"stats.rank{r}.json" for r in range(nproc)]
    found = []
    for name in names:
        path = stats_dir / name
        if path.exists():
            with open(path, encoding="utf-8") as f:
                found.append(json.load(f))
    return found or None


@dataclasses.dataclass(frozen=True)
class ScriptJob:
    """The user's script, its arguments and how it is launched (the same for every config and seed)."""

    script: str
    args: tuple[str, ...]
    nproc: int
    timeout_s: float
    cwd: str
    launcher: str = "torchrun"
    python: str = sys.executable

    def fingerprint(self) -> dict[str, Any]:
        return {
            "kind": "script",
            "script": os.path.abspath(self.script),
            "sha256": _sha256(self.script),
            "args": list(self.args),
            "nproc": self.nproc,
            "launcher": self.launcher,
        }

    def prepare(self) -> None:
        """Before the first run: the forked launcher's fork server imports torch now, not in a run's wall clock."""
        if self.launcher == "forked":
            from delaycomm.experiment.forked import start_fork_server

            start_fork_server()

    def config_fingerprint(self, config: ScriptConfig) -> dict[str, Any]:
        return {"env": dict(sorted(config.env.items()))}

    def command(self, logs: Path) -> list[str]:
        return [
            self.python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(self.nproc),
            "--max-restarts",
            "0",
            "--log-dir",
            str(logs),
            "--redirects",
            "3",
            self.script,
            *self.args,
        ]

    def environment(self, config: ScriptConfig, seed: int, stats_dir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_") or k in _KEEP_ENV}
        env.update(config.env)
        env[SEED_ENV] = str(seed)
        env["DELAYCOMM_STATS"] = str(stats_dir) + os.sep
        return env

    def run(self, config: ScriptConfig, seed: int, rundir: Path | None, note: Callable[[str], None]) -> dict:
        """One launch; returns its record (:mod:`delaycomm.experiment.study`)."""
        assert rundir is not None, "a script job needs an output folder"
        logs, stats_dir, launcher_log = rundir / "logs", rundir / "stats", rundir / "torchrun.log"
        for d in (logs, stats_dir):
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
        started = time.monotonic()
        env = self.environment(config, seed, stats_dir)
        if self.launcher == "forked":
            from delaycomm.experiment.forked import run_forked

            status, returncode, failure = run_forked(
                self.script, list(self.args), self.nproc, self.cwd, env, logs, self.timeout_s
            )
            timed_out = status == "timeout"
        else:
            timed_out, returncode = self._torchrun(env, logs, launcher_log, started, note)
            failure = ""
            if not timed_out and returncode != 0:
                returncode, failure = failure_message(logs, self.nproc, launcher_log, returncode)
        wall_s = time.monotonic() - started
        rec: dict[str, Any] = {"status": "ok", "message": "", "metrics": {}, "curves": {}, "delaycomm": None}
        rec["wall_s"] = wall_s
        rec["detail"] = {"returncode": returncode, "rundir": str(rundir), "launcher": self.launcher}
        if timed_out:
            return {**rec, "status": "timeout", "message": f"ran past --timeout {self.timeout_s:g} s; stopped"}
        if returncode != 0:
            code = "" if returncode is None else f"exit code {returncode}: "
            return {**rec, "status": "failed", "message": f"{code}{failure}"}
        stdout = _rank_log(logs, 0, "stdout")
        try:
            parsed = parse(stdout.read_text(errors="replace").splitlines(), "rank 0's stdout") if stdout else None
        except MetricLineError as e:
            return {**rec, "status": "failed", "message": f"bad metric line: {e}"}
        if parsed is None or not parsed.final:
            return {
                **rec,
                "status": "failed",
                "message": "the script reported no metric: print 'DELAYCOMM_METRIC name=value' on rank 0, or call "
                "delaycomm.experiment.report(name=value)",
            }
        rec["metrics"] = {**parsed.final, "wall_s": wall_s}
        rec["curves"] = {k: [list(p) for p in v] for k, v in parsed.curves.items()}
        return self._with_telemetry(rec, config, stats_dir)

    def _torchrun(
        self, env: dict[str, str], logs: Path, launcher_log: Path, started: float, note: Callable[[str], None]
    ) -> tuple[bool, int | None]:
        """Launch under torchrun; (timed out, exit code)."""
        with open(launcher_log, "w") as out:
            proc = subprocess.Popen(
                self.command(logs),
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                timed_out = self._wait(proc, started, logs, note)
            except BaseException:  # Ctrl-C, SIGTERM (delaycomm.experiment.run_cli): the run in flight stops too
                _stop(proc)
                raise
        return timed_out, proc.returncode

    def _wait(self, proc: subprocess.Popen, started: float, logs: Path, note: Callable[[str], None]) -> bool:
        """Wait for the launch, noting rank 0's last reported step; True when it ran past the timeout."""
        stdout = None
        while True:
            try:
                proc.wait(timeout=_POLL_S)
                return False
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() - started > self.timeout_s:
                _stop(proc)
                return True
            stdout = stdout or _rank_log(logs, 0, "stdout")
            step = _last_step(stdout)
            if step:
                note(step)

    def _with_telemetry(self, rec: dict, config: ScriptConfig, stats_dir: Path) -> dict:
        stats = _read_stats(stats_dir, self.nproc)
        if stats is None:
            rec["detail"]["backend"] = "not delaycomm (no rank wrote DELAYCOMM_STATS)"
            if config.env:
                rec["status"] = "no effect"
                rec["message"] = (
                    "no rank wrote delaycomm's stats (DELAYCOMM_STATS): the script created no delaycomm process "
                    f"group, so {', '.join(sorted(config.env))} had no effect; use "
                    "init_process_group(backend='delaycomm')"
                )
            return rec
        rec["detail"]["backend"] = "delaycomm"
        rec["delaycomm"] = telemetry(stats)
        problems = effect_problems("delaycomm", option_names(config.env), stats)
        if problems:
            rec["status"] = "no effect"
            rec["message"] = "; ".join(problems)
        return rec
