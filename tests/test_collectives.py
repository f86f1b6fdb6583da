"""Every collective on a delaycomm group returns what Gloo returns, bit for bit (2 and 4 real ranks)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.dist_utils import run_ranks

pytestmark = [pytest.mark.multiproc]


def _compare_ranks(rank, world):
    import torch.distributed as dist

    import delaycomm  # noqa: F401
    from tests.collective_cases import compare_all

    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60))
    assert dist.get_backend() == "delaycomm"
    gloo = dist.new_group(backend="gloo")
    return compare_all(rank, world, dist.group.WORLD, gloo)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 4])
def test_every_collective_matches_gloo_bitwise(world):
    results = run_ranks(_compare_ranks, world, timeout=220)
    problems = [f"rank {r}: {p}" for r, ps in sorted(results.items()) for p in ps]
    assert not problems, "\n".join(problems[:40])
