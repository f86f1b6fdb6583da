"""Ranks as fresh processes, each reporting to the parent: the one launcher of the bench and the experiment.

:func:`run_ranks` starts ``nproc`` processes; rank ``r`` calls ``target(r, nproc, post, *args)``. The rank's return
value is its result; an exception is its error (the traceback, or the payload of a :class:`RankError`); ``post(kind,
payload)`` sends anything else on the way (progress, "ready"), handed to ``on_message`` in the parent. The parent
returns when every rank has reported, when ``grace_s`` has passed since the first error (the others are likely
waiting for the failed one in a collective), or at the deadline; then stops what is still running. A rank that
exits without a report (killed, crashed in native code) is an error of its own, noticed within half a second, unless
``expect_exit`` names that exit (a fault injected on purpose). The outcome holds every rank's result or error, its
process's exit code, and which ranks had to be stopped.

Rendezvous is the caller's: it passes a store address (``file://``, a TCPStore port it hosts) in ``args``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue as queue_module
import signal
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "RankError",
    "Outcome",
    "run_ranks",
    "describe_exit",
    "under_torchrun",
    "torchrun_rank",
    "descendants",
    "stop_tree",
]

# How long the parent reads a dead rank's pipe for a last message before judging it dead without a report.
_LAST_WORDS_S = 0.2
# How long a rank that reported gets to exit (its teardown, its interpreter's) before it is stopped.
_EXIT_PATIENCE_S = 10.0


class RankError(Exception):
    """Raised by a rank's target to report ``payload`` (any picklable value) as its error instead of a traceback."""

    def __init__(self, payload: Any) -> None:
        super().__init__(payload)
        self.payload = payload


@dataclasses.dataclass
class Outcome:
    """What the ranks reported, and how their processes ended.

    Attributes:
        results: rank -> the target's return value.
        errors: rank -> the traceback text, a :class:`RankError`'s payload, or why the process died.
        timed_out: the deadline passed before every rank reported (and no rank had failed).
        elapsed_s: from the first start to the last report.
        exitcodes: rank -> its process's exit code once the run ended (negative: the signal that killed it, the
            launcher's own stop included; None: never started).
        stopped: the ranks still running when the run ended, which the launcher stopped.
    """

    results: dict[int, Any]
    errors: dict[int, Any]
    timed_out: bool
    elapsed_s: float
    exitcodes: dict[int, int | None] = dataclasses.field(default_factory=dict)
    stopped: set[int] = dataclasses.field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.timed_out


def under_torchrun() -> bool:
    """True when this process is one rank of a torchrun (or any env:// launcher) job."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def torchrun_rank() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment."""
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def describe_exit(code: int | None) -> str:
    """A process's exit code in words: ``exited with code 3``, ``killed by signal 9 (SIGKILL)``."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _rank_main(
    target: Callable[..., Any],
    rank: int,
    nproc: int,
    args: tuple,
    messages,
    env: dict[str, str],
    teardown: Callable[[], None] | None,
) -> None:
    # The caller's environment at the call, whatever the start method (a fork server's children would otherwise
    # have the environment the server started with).
    os.environ.clear()
    os.environ.update(env)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc)})

    def post(kind: str, payload: Any = None) -> None:
        if kind in ("result", "error"):
            raise ValueError(f"post: {kind!r} is reserved for the rank's return value and exception")
        messages.put((kind, rank, payload))

    try:
        try:
            value = target(rank, nproc, post, *args)
        except RankError as e:
            messages.put(("error", rank, e.payload))
        except BaseException:  # noqa: BLE001 - every failure goes to the parent, with its traceback
            messages.put(("error", rank, traceback.format_exc()))
        else:
            messages.put(("result", rank, value))
    finally:
        messages.close()
        messages.join_thread()  # the report is in the pipe: nothing the teardown does can lose it
    if teardown is not None:
        # After the report: a teardown that blocks (a peer wedged in a collective) or crashes cannot hold back or
        # lose the rank's outcome; the parent sees how the process ended, and stops it if it has to.
        try:
            teardown()
        except BaseException:  # noqa: BLE001 - the rank's outcome is reported already
            pass


def run_ranks(
    target: Callable[..., Any],
    nproc: int,
    args: Sequence[Any] = (),
    *,
    start_method: str = "spawn",
    preload: Sequence[str] = (),
    env: dict[str, str] | None = None,
    deadline_s: float | None = None,
    grace_s: float = 0.0,
    on_message: Callable[[str, int, Any], None] | None = None,
    name: str = "rank",
    expect_exit: Mapping[int, int] | None = None,
    teardown: Callable[[], None] | None = None,
) -> Outcome:
    """Run ``target`` in ``nproc`` fresh processes and collect what each reports.

    Args:
        target: a module-level function ``target(rank, nproc, post, *args)`` (picklable by reference).
        nproc: number of ranks (>= 1).
        args: more arguments of ``target`` (picklable).
        start_method: ``spawn`` or ``forkserver`` (never ``fork``: the parent may hold threads of torch's).
        preload: modules the fork server imports once (``forkserver`` only): each rank then starts without
            importing torch again.
        env: environment variables set in each rank before ``target`` runs, over the caller's environment at the
            call (RANK, LOCAL_RANK and WORLD_SIZE are set too).
        deadline_s: stop every rank after this many seconds (None: no deadline).
        grace_s: after the first error, how long the other ranks get to report before they are stopped.
        on_message: called in the parent with ``(kind, rank, payload)`` for each :func:`post` of a rank.
        name: the processes' name prefix (``<name><rank>``).
        expect_exit: ``{rank: exit code}`` of ranks meant to exit with that code without a report (a fault
            injected on purpose): that exit ends the rank's part, with no error and no grace for the others;
            another code without a report is an error as usual.
        teardown: a module-level function each rank calls after its report is sent (destroying its process
            group, say); what it raises is ignored.

    Returns:
        The :class:`Outcome`.

    Raises:
        ValueError: ``nproc < 1``, an unknown ``start_method``, ``preload`` without ``forkserver``.
    """
    if nproc < 1:
        raise ValueError(f"run_ranks: nproc must be >= 1, got {nproc}")
    if start_method not in ("spawn", "forkserver"):
        raise ValueError(f"run_ranks: start_method must be 'spawn' or 'forkserver', got {start_method!r}")
    if preload and start_method != "forkserver":
        raise ValueError("run_ranks: preload needs start_method='forkserver'")
    ctx = multiprocessing.get_context(start_method)
    if preload:
        ctx.set_forkserver_preload(list(preload))
    messages = ctx.Queue()
    rank_env = {**os.environ, **(env or {})}
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(target, r, nproc, tuple(args), messages, rank_env, teardown),
            name=f"{name}{r}",
            daemon=True,
        )
        for r in range(nproc)
    ]
    started = time.monotonic()
    deadline = started + deadline_s if deadline_s is not None else float("inf")
    reports = _Reports(procs, messages, deadline, grace_s, on_message, dict(expect_exit or {}))
    try:
        for p in procs:
            p.start()
        reports.collect()
    finally:
        stopped = _stop(procs, _EXIT_PATIENCE_S if reports.ok else 0.0)
        messages.close()
    exitcodes = {r: p.exitcode for r, p in enumerate(procs)}
    elapsed_s = reports.ended - started
    return Outcome(reports.results, reports.errors, reports.timed_out, elapsed_s, exitcodes, stopped)


class _Reports:
    """The parent's side of a run: reads the ranks' messages until every rank has reported (or exited as
    expected), the grace after the first error has passed, or the deadline."""

    def __init__(self, procs: list, messages, deadline: float, grace_s: float, on_message, expect_exit: dict) -> None:
        self.procs, self.messages, self.deadline, self.grace_s = procs, messages, deadline, grace_s
        self.on_message, self.expect_exit = on_message, expect_exit
        self.results: dict[int, Any] = {}
        self.errors: dict[int, Any] = {}
        self.exited: set[int] = set()  # ranks that exited as expect_exit says
        self.timed_out = False
        self.ok = False
        self.ended = time.monotonic()

    def _handle(self, msg: tuple[str, int, Any]) -> None:
        kind, rank, payload = msg
        if kind == "result":
            self.results[rank] = payload
        elif kind == "error":
            self.errors[rank] = payload
            self.deadline = min(self.deadline, time.monotonic() + self.grace_s)
        elif self.on_message is not None:
            self.on_message(kind, rank, payload)

    def _pending(self, rank: int) -> bool:
        return rank not in self.results and rank not in self.errors and rank not in self.exited

    def collect(self) -> None:
        while any(self._pending(r) for r in range(len(self.procs))):
            now = time.monotonic()
            if now >= self.deadline:
                self.timed_out = not self.errors
                break
            try:
                self._handle(self.messages.get(timeout=min(0.5, self.deadline - now)))
            except queue_module.Empty:
                self._judge_dead()
        self.ended = time.monotonic()
        self.ok = not self.errors and not self.timed_out

    def _judge_dead(self) -> None:
        """Ranks whose process ended without a report: an error, or the exit ``expect_exit`` names."""
        for rank, p in enumerate(self.procs):
            if p.exitcode is None or not self._pending(rank):
                continue
            try:  # its last message may still be in the pipe: read what is there before judging
                while True:
                    self._handle(self.messages.get(timeout=_LAST_WORDS_S))
            except queue_module.Empty:
                pass
            if not self._pending(rank):
                continue
            if self.expect_exit.get(rank) == p.exitcode:
                self.exited.add(rank)
                continue
            expected = f" (expected to exit with code {self.expect_exit[rank]})" if rank in self.expect_exit else ""
            self._handle(("error", rank, f"process {describe_exit(p.exitcode)} without a report{expected}"))


def _stop(procs: list, patience_s: float) -> set[int]:
    """Join each rank (up to ``patience_s`` each: ranks that reported are exiting), then stop what is left with
    everything it started (:func:`stop_tree`); return the ranks that had to be stopped."""
    for p in procs:
        if p.pid is not None and patience_s > 0:
            p.join(timeout=patience_s)
    stopped = set()
    for rank, p in enumerate(procs):
        if p.is_alive():
            stopped.add(rank)
            stop_tree(p.pid, lambda p=p: p.join(timeout=0.05) or p.exitcode is not None, own_group=False)
            p.join()
    return stopped


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process this user can see (Linux ``/proc``; empty elsewhere)."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            continue  # it ended meanwhile
        fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
        if len(fields) >= 3 and fields[0] != "Z":
            table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def descendants(pid: int) -> tuple[set[int], set[int]]:
    """The processes ``pid`` started, recursively, still attached to it (pids), and their process groups.

    A process that detached itself (a daemon that double-forked: its parent is gone, it was re-parented) is not
    found: it is no longer part of this tree (docs/experiment.md, "Stopping a run").
    """
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found, {table[p][1] for p in found if p in table}


def _signal_all(pids: set[int], groups: set[int], sig: signal.Signals) -> None:
    mine = os.getpgrp()
    for g in groups - {mine}:
        try:
            os.killpg(g, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_tree(pid: int, ended: Callable[[], bool], *, own_group: bool, patience_s: float = 5.0) -> None:
    """Stop process ``pid`` and every process it started, with their process groups: SIGTERM (a torchrun agent
    then stops its workers itself), up to ``patience_s`` for ``pid`` to end, then SIGKILL to everything found
    before or after (ranks run in sessions of their own: a signal to the agent's group does not reach them).

    Args:
        pid: the root (a launch's agent, a rank).
        ended: True once the root has ended (and was reaped by its parent: its ``wait``/``join``).
        own_group: the root leads a process group of its own (``start_new_session``): signal that group too.
        patience_s: how long SIGTERM has before SIGKILL.
    """
    pids, groups = descendants(pid)
    pids.add(pid)
    if own_group:
        groups.add(pid)
    _signal_all(pids, groups, signal.SIGTERM)
    deadline = time.monotonic() + patience_s
    while not ended() and time.monotonic() < deadline:
        more, more_groups = descendants(pid)  # what the root started since (a worker it was starting)
        pids |= more
        groups |= more_groups
        time.sleep(0.05)
    more, more_groups = descendants(pid)
    if ended():
        pids.discard(pid)  # reaped: its pid may be another process's by now
    _signal_all(pids | more, groups | more_groups, signal.SIGKILL)
