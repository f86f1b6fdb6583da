"""Ranks as threads create their delaycomm groups at the same moment, while other threads make Python objects.

pybind11 keeps a table of the live instances it made, and changing it needs the GIL. delaycomm's backend used to be
constructed under a ``call_guard`` that released the GIL for the whole factory, and that includes registering the
new instance in the table. When threads registered at the same time, the table was corrupted. The result was
"pybind11_object_dealloc(): Tried to deallocate unregistered instance!" and then unknown opcodes. It was seen in
CI (tests/backend/test_collectives.py, world 4). Here the race gets many chances. Before the fix, the slow
variant (20 runs of 8 ranks, 15 groups each) crashed or hung in 4 of 4 tries, within its first 4 to 8 runs.
The default variant costs about 2 s of CI, and it catches the race only sometimes.
"""

from __future__ import annotations

import pytest

from tests.harness import run_threads

pytestmark = [pytest.mark.multiproc]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "runs,groups", [pytest.param(2, 8, id="ci"), pytest.param(20, 15, id="stress", marks=pytest.mark.slow)]
)
def test_groups_created_on_many_threads_at_once_keep_pythons_objects_whole(runs, groups):
    import torch.distributed as dist

    def body(ctx):
        made = []
        for i in range(groups):
            made.append(ctx.group("delaycomm"))
            # Other pybind11 instances, registered and released on every thread meanwhile.
            churn = [dist.PrefixStore(f"churn{i}-{j}/", ctx.store) for j in range(50)]
            del churn
        return len(made)

    for _ in range(runs):
        assert run_threads(body, 8, timeout=100) == [groups] * 8
