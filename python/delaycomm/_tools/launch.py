"""Ranks as fresh processes, each reporting to the parent: the one launcher of the bench and the experiment.

:func:`run_ranks` starts ``nproc`` processes; rank ``r`` calls ``target(r, nproc, post, *args)``. The rank's return
value is its result; an exception is its error (the traceback, or the payload of a :class:`RankError`); ``post(kind,
payload)`` sends anything else on the way (progress, "ready"), handed to ``on_message`` in the parent. The parent
returns when every rank has reported, when ``grace_s`` has passed since the first error (the others are likely
waiting for the failed one in a collective), or at the deadline; then stops what is still running. A rank that
exits without a report (killed, crashed in native code) is an error of its own, noticed within half a second.

Rendezvous is the caller's: it passes a store address (``file://``, a TCPStore port it hosts) in ``args``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue as queue_module
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["RankError", "Outcome", "run_ranks", "under_torchrun", "torchrun_rank"]

# How long the parent reads a dead rank's pipe for a last message before judging it dead without a report.
_LAST_WORDS_S = 0.2


class RankError(Exception):
    """Raised by a rank's target to report ``payload`` (any picklable value) as its error instead of a traceback."""

    def __init__(self, payload: Any) -> None:
        super().__init__(payload)
        self.payload = payload


@dataclasses.dataclass
class Outcome:
    """What the ranks reported.

    Attributes:
        results: rank -> the target's return value.
        errors: rank -> the traceback text, a :class:`RankError`'s payload, or why the process died.
        timed_out: the deadline passed before every rank reported (and no rank had failed).
        elapsed_s: from the first start to the last report.
    """

    results: dict[int, Any]
    errors: dict[int, Any]
    timed_out: bool
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return not self.errors and not self.timed_out


def under_torchrun() -> bool:
    """True when this process is one rank of a torchrun (or any env:// launcher) job."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def torchrun_rank() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment."""
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def _rank_main(target: Callable[..., Any], rank: int, nproc: int, args: tuple, messages, env: dict[str, str]) -> None:
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
        messages.join_thread()


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
            target=_rank_main, args=(target, r, nproc, tuple(args), messages, rank_env), name=f"{name}{r}", daemon=True
        )
        for r in range(nproc)
    ]
    started = time.monotonic()
    deadline = started + deadline_s if deadline_s is not None else float("inf")
    results: dict[int, Any] = {}
    errors: dict[int, Any] = {}

    def handle(msg: tuple[str, int, Any]) -> None:
        nonlocal deadline
        kind, rank, payload = msg
        if kind == "result":
            results[rank] = payload
        elif kind == "error":
            errors[rank] = payload
            deadline = min(deadline, time.monotonic() + grace_s)
        elif on_message is not None:
            on_message(kind, rank, payload)

    timed_out = False
    done = False
    try:
        for p in procs:
            p.start()
        while len(results) + len(errors) < nproc:
            now = time.monotonic()
            if now >= deadline:
                timed_out = not errors
                break
            try:
                handle(messages.get(timeout=min(0.5, deadline - now)))
            except queue_module.Empty:
                for rank, p in enumerate(procs):
                    if p.exitcode is None or rank in results or rank in errors:
                        continue
                    try:  # its last message may still be in the pipe: read what is there before judging
                        while True:
                            handle(messages.get(timeout=_LAST_WORDS_S))
                    except queue_module.Empty:
                        pass
                    if rank not in results and rank not in errors:
                        handle(("error", rank, f"process exited with code {p.exitcode} without a report"))
        done = not errors and not timed_out
        return Outcome(results, errors, timed_out, time.monotonic() - started)
    finally:
        _stop(procs, 5.0 if done else 0.0)
        messages.close()


def _stop(procs: list, patience_s: float) -> None:
    """Join each rank (up to ``patience_s`` each: ranks that reported are exiting), then terminate, then kill."""
    for p in procs:
        if p.pid is not None and patience_s > 0:
            p.join(timeout=patience_s)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=5.0)
        if p.is_alive():
            p.kill()
            p.join()
