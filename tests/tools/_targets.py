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
