"""A user's unmodified training script, run as torchrun runs it, two ways (the acceptance tests of tests/stale):

- ``"forked"`` (the default run): each rank is forked from the harness's fork server (:func:`tests.harness.run_procs`:
  torch and the training stack imported once) and runs the script file as ``__main__`` (``runpy``), with the
  environment torchrun gives a rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``, the agent's store) and
  ``DELAYCOMM_*`` variables only. The script is the same file, unmodified; what is left out is torchrun's agent
  process and an interpreter that imports torch per rank (seconds of CPU each on the 2-core CI machine, docs/ci.md).
- ``"torchrun"``: ``python -m torch.distributed.run --standalone`` in a fresh interpreter, exactly as a user
  types it (marked ``slow``: scripts/test.sh --slow runs it; docs/ci.md lists what runs only there).

Either way the result is the output of the job (every rank's stdout and stderr, rank 0's first) and what the
script wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import run_cli, run_procs

__all__ = ["LAUNCHERS", "run_user_job"]

# The launchers, for pytest.mark.parametrize: torchrun's start-up (an interpreter and torch per rank, plus the
# agent) runs only under scripts/test.sh --slow.
LAUNCHERS = [pytest.param("forked", id="forked"), pytest.param("torchrun", id="torchrun", marks=pytest.mark.slow)]


def run_user_job(
    launcher: str,
    script: Path,
    args: list[str],
    env: dict[str, str],
    cwd: Path,
    nproc: int = 2,
    timeout: float = 240,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``script args`` on ``nproc`` ranks with ``env`` (``DELAYCOMM_*``) as the only configuration.

    Every ``DELAYCOMM_*`` variable of this process that ``env`` does not set is left out, as a user's shell would
    not have it. Returns a ``CompletedProcess`` whose ``stdout`` and ``stderr`` are the job's; the run fails the
    test (with the output) when the job fails, unless ``check`` is false (torchrun only: a job expected to fail,
    whose exit code and output the test reads).
    """
    full = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_")}
    full.update(env)
    full.setdefault("OMP_NUM_THREADS", "1")
    if launcher == "torchrun":
        argv = ["--standalone", "--nproc_per_node", str(nproc), str(script), *args]
        proc = run_cli(argv, timeout=timeout, env=full, cwd=str(cwd), module="torch.distributed.run")
        assert proc.returncode == 0 or not check, (
            f"torchrun {' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        )
        return proc
    assert launcher == "forked", launcher
    assert check, "run_user_job: check=False needs launcher='torchrun' (a forked rank that fails fails run_procs)"
    dropped = sorted(k for k in os.environ if k.startswith("DELAYCOMM_") and k not in env)
    outputs = run_procs(_rank, nproc, str(script), list(args), str(cwd), dropped, timeout=timeout, env=full)
    out = "".join(o for o, _ in outputs)
    err = "".join(e for _, e in outputs)
    return subprocess.CompletedProcess([str(script), *args], 0, out, err)


def _rank(rank: int, world: int, script: str, args: list[str], cwd: str, dropped: list[str]) -> tuple[str, str]:
    """One rank: the script as ``__main__``, its file descriptors 1 and 2 captured (print, logging and the C++
    side's output alike)."""
    import runpy
    import tempfile

    for k in dropped:
        os.environ.pop(k, None)
    os.chdir(cwd)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))  # as `python script.py` puts the script's folder first
    files = [tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")]
    saved = [os.dup(1), os.dup(2)]
    code, failure = 0, ""
    try:
        for fd, f in zip((1, 2), files):
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(f.fileno(), fd)
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - reported below with the rank's output
            import traceback

            code, failure = 1, traceback.format_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, s in zip((1, 2), saved):
            os.dup2(s, fd)
            os.close(s)
    texts = []
    for f in files:
        f.seek(0)
        texts.append(f.read())
        f.close()
    if code != 0:
        raise AssertionError(
            f"rank {rank}: {script} {'raised' if failure else f'exited {code}'}\n{failure}"
            f"--- stdout\n{texts[0][-4000:]}\n--- stderr\n{texts[1][-6000:]}"
        )
    return texts[0], texts[1]
