"""Ranks as real processes, for what needs a process of its own, and commands run as a user runs them.

:func:`run_procs` forks each rank from a fork server that imported torch, delaycomm and the training stack once
(a fresh interpreter that imports torch costs seconds per rank on a small machine). Each rank gets the
environment torchrun gives (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so
``dist.init_process_group("delaycomm")`` works unchanged; the rendezvous store is hosted by the test process on a
port the OS picks (as torchrun's agent hosts it), so there is no free-port race. The rank's environment is the
test process's environment at the call (plus ``env``), not the fork server's.

The run fails with every rank's traceback when a rank raises, when a rank exits with a code other than 0 (or than
the one ``expect_exit`` names for it), or when a rank has not finished at the deadline (then every rank is
killed). :func:`run_command` runs a command (a script, a tool) with a timeout and returns its result;
:func:`run_cli` runs one in a fresh interpreter (``python [-m module] argv``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from delaycomm._tools.launch import Outcome, RankError, describe_exit, run_ranks
from delaycomm.experiment.forked import PRELOAD as _FORKED_PRELOAD

__all__ = [
    "run_procs",
    "run_in_child",
    "run_cli",
    "run_command",
    "CommandTimeout",
    "free_port",
    "start_fork_server",
    "wait_fork_server",
    "started_command",
    "PRELOAD",
]

# What the fork server imports once. NOTE: DDP and FSDP import torch._dynamo and friends the first time they are
# used (seconds); importing them starts no thread, so forking after it is safe (as delaycomm.experiment does).
# pytest too: a rank imports its function's test module, and that module imports pytest (a second or two per rank
# on a loaded 2-core machine).
PRELOAD = ["pytest", *_FORKED_PRELOAD]  # the experiment's fork server imports the same (one list)

# After a rank fails, how long the others get to report before they are stopped.
_GRACE_S = 5.0


def start_fork_server() -> None:
    """Start the fork server now (it preloads in the background); the first run_procs would otherwise."""
    import multiprocessing.forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()


def wait_fork_server() -> None:
    """Wait until the fork server started by :func:`start_fork_server` has done its imports: a probe is forked from
    it only then (on a loaded machine the imports take a minute, which the first multi-rank test's timeout would
    otherwise count)."""
    import multiprocessing

    probe = multiprocessing.get_context("forkserver").Process(target=os.getpid)
    probe.start()
    probe.join()


def _rank(rank: int, world_size: int, post, fn: Callable[..., Any], args: tuple) -> Any:
    """A rank of :func:`run_procs` (a target of :func:`~delaycomm._tools.launch.run_ranks`)."""
    if "TORCH_DISTRIBUTED_DEBUG" in os.environ:
        import torch.distributed as dist

        dist.set_debug_level_from_env()  # torch read the variable when the fork server imported it
    try:
        return fn(rank, world_size, *args)
    except BaseException:  # noqa: BLE001 - tagged, so that the report says the rank raised (not that it died)
        raise RankError(("raised", traceback.format_exc())) from None


def _destroy_group() -> None:
    """Each rank's teardown, after its report: the default group, if the rank left one."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def run_procs(
    fn: Callable[..., Any],
    world_size: int = 2,
    *args: Any,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    expect_exit: dict[int, int] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes; return the results by rank.

    The ranks are started, waited for and stopped by the tools' launcher
    (:func:`delaycomm._tools.launch.run_ranks`), forked from the harness's fork server.

    Args:
        fn: a module-level function (it is pickled by reference); its return value must be picklable.
        world_size: number of ranks.
        *args: picklable arguments for every rank.
        timeout: seconds before every rank still running is killed and the test fails.
        env: extra environment variables for every rank.
        expect_exit: ``{rank: exit code}`` of ranks that must die with that code without reporting (faults);
            their result is None.

    Raises:
        AssertionError: a rank raised, exited with another code, or was still running at the deadline.
    """
    import torch.distributed as dist

    expect_exit = dict(expect_exit or {})
    store = dist.TCPStore("127.0.0.1", 0, world_size, True, timedelta(seconds=timeout), wait_for_workers=False)
    rank_env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        **(env or {}),
    }
    try:
        out = run_ranks(
            _rank,
            world_size,
            (fn, args),
            start_method="forkserver",
            preload=PRELOAD,
            env=rank_env,
            deadline_s=timeout,
            grace_s=_GRACE_S,
            name="rank",
            expect_exit=expect_exit,
            teardown=_destroy_group,
        )
    finally:
        del store
    problems = [p for r in range(world_size) if (p := _problem(r, out, expect_exit))]
    if problems:
        raise AssertionError(
            f"{len(problems)} of {world_size} rank(s) failed (timeout {timeout:g} s):\n" + "\n".join(problems)
        )
    return [out.results[r] if r not in expect_exit else None for r in range(world_size)]


def _raised(error: Any) -> str | None:
    """The traceback of a rank that raised (None: the error is how its process ended without a report)."""
    return error[1] if isinstance(error, tuple) and error[:1] == ("raised",) else None


def _problem(rank: int, out: Outcome, expect_exit: dict[int, int]) -> str | None:
    """What went wrong with ``rank`` in the run ``out`` (None: nothing)."""
    code = out.exitcodes.get(rank)
    if rank in expect_exit:
        if rank in out.results:
            reported = f"; it reported:\n{out.results[rank]!r}"
        elif rank in out.errors:
            reported = f"; it reported:\n{_raised(out.errors[rank]) or out.errors[rank]}"
        else:
            reported = ""
        got = "still running (killed)" if rank in out.stopped else describe_exit(code)
        if rank in out.stopped or code != expect_exit[rank]:
            return f"--- rank {rank}: expected to exit with code {expect_exit[rank]}, got {got}{reported}"
        return None
    if rank in out.errors:
        traceback_text = _raised(out.errors[rank])
        if traceback_text is not None:
            return f"--- rank {rank} raised:\n{traceback_text}"
        return f"--- rank {rank}: {out.errors[rank]}"
    if rank in out.stopped:
        return (
            f"--- rank {rank}: "
            + ("reported, then " if rank in out.results else "no report, ")
            + "still running at the deadline or after another rank failed (killed)"
        )
    if rank not in out.results:
        return f"--- rank {rank}: no report, {describe_exit(code)}"
    if code != 0:
        return f"--- rank {rank}: reported a result but {describe_exit(code)}"
    return None


def run_in_child(fn: Callable[..., Any], *args: Any, default: Any = "no report") -> Any:
    """Inside a rank of :func:`run_procs`: run ``fn(*args)`` in a child forked from the rank, and return what it
    returned (JSON round trip), or ``default`` when the child died without a report.

    For a job whose own processes are the subject (a rank that exits as soon as its group creation raises, a
    torchrun attempt's worker): the child is a process of its own, with torch already imported and no thread
    started. Its waits must be bounded by its own timeouts (its group's, its store's); the rank's deadline bounds
    the rank. An exception in the child is reported as ``"child failed: <repr>"``, never raised there.
    """
    import json

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            result = fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported, never raised in the child
            result = f"child failed: {e!r}"
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else default


def free_port() -> int:
    """A TCP port that was free a moment ago (for commands that must host their own store, like torchrun)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(
    argv: Sequence[str],
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    module: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python [-m module] argv`` in a fresh interpreter (the current one's), as a user runs it.

    Args:
        argv: the arguments after the interpreter (and ``-m module``).
        timeout: seconds before the command is killed (``subprocess.TimeoutExpired``, which fails the test).
        env: the environment (default: this process's, with ``OMP_NUM_THREADS=1`` unless set).
        cwd: the working directory.
        module: run ``python -m module`` (e.g. ``"delaycomm.bench"``, ``"torch.distributed.run"``).

    Returns:
        The ``CompletedProcess`` with text ``stdout`` and ``stderr``; the caller checks ``returncode``.
    """
    return run_command([sys.executable, *(["-m", module] if module else []), *argv], timeout, env, cwd)


class CommandTimeout(subprocess.TimeoutExpired):
    """A command still running at its timeout (killed with everything it started); its message ends with the
    output it wrote so far."""

    def __str__(self) -> str:
        tails = []
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if isinstance(text, bytes):
                text = text.decode(errors="replace")
            if text:
                tails.append(f"--- {name} (last 4000 characters):\n{text[-4000:]}")
        return "\n".join([super().__str__(), *tails])


def run_command(
    argv: Sequence[str],
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run a command (``argv[0]`` found on ``PATH``: a script, ``bash``, a tool) with a timeout, as a user runs it.

    The command runs in a session of its own: at the timeout it is killed together with every process it started
    (a launcher's ranks, a script's children), so nothing is left running on the machine.

    Args:
        argv: the command and its arguments.
        timeout: seconds before the command is killed (:class:`CommandTimeout`, a ``subprocess.TimeoutExpired``
            that carries the output so far; it fails the test).
        env: the environment (default: this process's, with ``OMP_NUM_THREADS=1`` unless set).
        cwd: the working directory.

    Returns:
        The ``CompletedProcess`` with text ``stdout`` and ``stderr``; the caller checks ``returncode``.
    """
    argv = [os.fspath(a) for a in argv]
    with _popen(argv, env, cwd) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            _kill_session(proc)
            raise CommandTimeout(argv, timeout, e.stdout, e.stderr) from None
        except BaseException:
            _kill_session(proc)
            raise
        finally:
            _kill_session(proc, only_leftovers=True)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


@contextlib.contextmanager
def started_command(
    argv: Sequence[str],
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Iterator[subprocess.Popen]:
    """A command started in a session of its own and left running while the ``with`` block drives it (sends it a
    signal, waits for what it writes): :func:`run_command` for a test that must act while the command runs.

    On leaving the block the command gets what is left of ``timeout`` (seconds from its start) to exit; then it and
    every process of its session are killed, whether the block ended normally or raised, so nothing outlives the
    test. A command that outlived its timeout fails the test (:class:`CommandTimeout`).

    Yields:
        The ``Popen``, with text ``stdout`` and ``stderr`` pipes: read them with ``communicate``.
    """
    import time

    argv = [os.fspath(a) for a in argv]
    deadline = time.monotonic() + timeout
    with _popen(argv, env, cwd) as proc:
        try:
            yield proc
            if proc.returncode is None:
                try:
                    proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired as e:
                    _kill_session(proc)
                    raise CommandTimeout(argv, timeout, e.stdout, e.stderr) from None
        finally:
            if proc.returncode is None:
                _kill_session(proc)
            else:
                _kill_session(proc, only_leftovers=True)


def _popen(argv: list[str], env: dict[str, str] | None, cwd: str | None) -> subprocess.Popen:
    """``argv`` started in a session of its own, no standard input, text pipes; ``env`` defaults to this process's,
    with ``OMP_NUM_THREADS=1`` unless set."""
    if env is None:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )


def _kill_session(proc: subprocess.Popen, only_leftovers: bool = False) -> None:
    """Kill the command's session (the command and what it started); with ``only_leftovers``, what it started and
    left running after it exited (daemonised children of a script)."""
    import signal

    if not only_leftovers:
        proc.kill()
        proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
