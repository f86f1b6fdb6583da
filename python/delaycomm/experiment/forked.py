"""``run --launcher forked``: the user's script in ranks forked from one process that imported torch once.

torchrun starts an agent and one fresh interpreter per rank for every run: on a small machine, importing torch
costs seconds of CPU per process, more than a short job trains. The forked launcher runs the same, unmodified
script with the environment torchrun gives a rank (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of a store this process hosts, which the ranks join as
torchrun's agent store; ``OMP_NUM_THREADS`` 1 unless set), as ``__main__`` (``runpy``), with the rank's file
descriptors 1 and 2 written to the same per-rank log files as torchrun's ``--redirects 3``. At the end each rank
runs the interpreter's exit handlers (delaycomm writes the stats of a group never destroyed there, as at a real
exit).

What differs from torchrun: no agent (no restarts, no elastic membership), and the interpreter is shared with the
fork server's imports (a script that depends on a fresh interpreter, such as one that changes torch's start-up
settings through environment variables read at ``import torch``, should use the default ``torchrun``).
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from delaycomm._tools.launch import RankError, run_ranks

__all__ = ["run_forked", "start_fork_server", "PRELOAD"]

PRELOAD = (
    "torch",
    "torch.distributed",
    "delaycomm",
    "torch.nn.parallel",
    "torch._dynamo",
    "torch.distributed._functional_collectives",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
)
_GRACE_S = 10.0


def _rank(rank: int, world: int, post, script: str, args: list[str], cwd: str, env: dict, logs: str) -> int:
    """One rank: the script as ``__main__``; returns its exit code (RankError with the last error line if not 0)."""
    import torch

    os.environ.clear()
    os.environ.update(env)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)})
    os.environ.update({"LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "ROLE_RANK": str(rank)})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if "TORCH_DISTRIBUTED_DEBUG" in os.environ:
        import torch.distributed as dist

        dist.set_debug_level_from_env()  # torch read the variable when the fork server imported it
    os.chdir(cwd)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script.py` puts the script's folder first
    folder = Path(logs) / str(rank)
    os.makedirs(folder, exist_ok=True)
    code, last = 0, ""
    with open(folder / "stdout.log", "w") as out, open(folder / "stderr.log", "w") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:  # noqa: BLE001 - the script's failure is the run's, reported below
            traceback.print_exc()
            code, last = 1, f"{type(e).__name__}: {e}"
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    if code != 0:
        raise RankError((code, last))
    return code


def _ready(rank: int, world: int, post) -> int:
    return 0


def start_fork_server() -> None:
    """Start the fork server and wait until it has imported torch, so that no run's wall clock pays for it."""
    run_ranks(_ready, 1, start_method="forkserver", preload=PRELOAD, name="experiment-warmup")


def _exit_handlers() -> None:
    """After the rank's report: what interpreter exit runs (delaycomm's stats of groups never destroyed)."""
    atexit._run_exitfuncs()


def run_forked(
    script: str, args: list[str], nproc: int, cwd: str, env: dict[str, str], logs: Path, timeout_s: float
) -> tuple[str, int | None, str]:
    """Run the script on ``nproc`` forked ranks.

    Returns:
        ``(status, exit code, message)``: ``("ok", 0, "")``, ``("failed", code, "rank R: <last error line>")`` or
        ``("timeout", None, "")``.
    """
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    rank_env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port)}
    rank_env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    folder = str(logs / "forked" / "attempt_0")
    try:
        out = run_ranks(
            _rank,
            nproc,
            (script, list(args), cwd, rank_env, folder),
            start_method="forkserver",
            preload=PRELOAD,
            deadline_s=timeout_s,
            grace_s=_GRACE_S,
            name="experiment-job-rank",
            teardown=_exit_handlers,
        )
    finally:
        del store
    if out.errors:
        from delaycomm._tools.launch import describe_exit
        from delaycomm.experiment.metrics import shorten_message as shorten

        rank = min(out.errors)
        err: Any = out.errors[rank]
        log = Path(folder) / str(rank) / "stderr.log"
        if isinstance(err, tuple):
            code, last = err
            if last:
                return "failed", code, f"rank {rank}: {shorten(last)} (log: {log})"
            return "failed", code, f"rank {rank} {describe_exit(code)} with no error line (log: {log})"
        lines = str(err).strip().splitlines() or ["no report"]
        return "failed", None, f"rank {rank}: {shorten(lines[-1])} (log: {log})"
    if out.timed_out:
        return "timeout", None, ""
    return "ok", 0, ""
