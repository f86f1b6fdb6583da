"""Rank targets of the launcher tests (module-level, so that a fresh process can import them by name)."""

from __future__ import annotations

import os
import time

from delaycomm._tools.launch import RankError


def echo(rank, nproc, post, tag):
    post("hello", os.environ["RANK"] + "/" + os.environ["WORLD_SIZE"])
    return (tag, rank, nproc, os.environ.get("DC_TEST_ENV"))


def rank1_raises(rank, nproc, post):
    if rank == 1:
        raise RuntimeError("rank 1 broke on purpose")
    time.sleep(60)  # stands for a collective that waits for rank 1 forever


def rank1_reports(rank, nproc, post):
    if rank == 1:
        raise RankError(("unavailable", "not in this build"))
    return "ok"


def rank0_dies(rank, nproc, post):
    if rank == 0:
        os._exit(7)
    time.sleep(60)


def hangs(rank, nproc, post):
    time.sleep(60)


def rank1_exits_3(rank, nproc, post):
    if rank == 1:
        os._exit(3)  # a fault injected on purpose
    time.sleep(1.0)  # longer than the dead rank's detection: the expected exit must not stop this rank
    return "ok"


def returns_rank(rank, nproc, post):
    return rank


def write_teardown_file():
    """A teardown: proves it ran in each rank; what it raises must not change the outcome."""
    with open(os.environ["DC_TEARDOWN_FILE"] + os.environ["RANK"], "w") as f:
        f.write("torn down")
    raise RuntimeError("ignored: the rank has reported already")


def exit_5():
    """A teardown that ends the process at once (as a crash in native code would)."""
    os._exit(5)
