"""Every collective on a delaycomm group returns what Gloo returns, bit for bit, and refuses what Gloo refuses.

One test per collective and world size, ranks as threads (tests/harness); one more through the default group of
real processes, as a user's script gets it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.collective_cases import CASES, compare_case
from tests.harness import run_procs, run_threads

pytestmark = [pytest.mark.multiproc]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4], ids=lambda w: f"world{w}")
@pytest.mark.parametrize("case", list(CASES))
def test_collective_matches_gloo_bitwise(case, world):
    def body(ctx):
        gloo, dc = ctx.group("gloo"), ctx.group("delaycomm")
        return compare_case(case, ctx.rank, ctx.world_size, dc, gloo)

    problems = [f"rank {r}: {p}" for r, ps in enumerate(run_threads(body, world, timeout=100)) for p in ps]
    assert not problems, "\n".join(problems[:40])


def _default_group(rank, world):
    import torch.distributed as dist

    import delaycomm  # noqa: F401
    from tests.collective_cases import compare_case

    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60))
    assert dist.get_backend() == "delaycomm"
    gloo = dist.new_group(backend="gloo")
    return [
        p
        for case in ("all_reduce", "broadcast", "all_reduce_coalescing_manager", "reduce_scatter_tensor")
        for p in compare_case(case, rank, world, dist.group.WORLD, gloo)
    ]


@pytest.mark.timeout(120)
def test_default_group_of_real_processes_matches_gloo():
    problems = [f"rank {r}: {p}" for r, ps in enumerate(run_procs(_default_group, 2, timeout=100)) for p in ps]
    assert not problems, "\n".join(problems[:40])
