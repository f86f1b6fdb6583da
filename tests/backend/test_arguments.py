"""Both sides of gather, scatter, reduce_scatter and allgather_coalesced are checked before anything is issued.

Table-driven: each case calls the backend directly (the public API checks some of this itself) on every rank of a
2-rank group, with arguments that every rank refuses; the message names the method, the argument, what was
expected and what came (rank by rank where the root's and the others' differ). The group works afterwards.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from tests.harness import run_threads

WORLD = 2


def _gather_opts(root):
    o = dist.GatherOptions()
    o.rootRank = root
    return o


def _scatter_opts(root):
    o = dist.ScatterOptions()
    o.rootRank = root
    return o


def _z(n, dtype=torch.float32):
    return torch.zeros(n, dtype=dtype)


NOT_ROOT = "outputTensors must be empty on a rank other than the root (0), got 1 list(s) on rank 1"
CASES = {
    # name: (call(backend, rank), {rank: message})
    "gather_count": (
        lambda b, r: b.gather([[_z(2)] * 3], [_z(2)], _gather_opts(0)),
        {
            0: "delaycomm: gather: outputTensors[0] must hold one tensor per rank (2) on the root, got 3",
            1: "delaycomm: gather: " + NOT_ROOT,
        },
    ),
    "gather_sizes": (
        lambda b, r: b.gather([[_z(3), _z(2)]], [_z(2)], _gather_opts(0)),
        {
            0: "delaycomm: gather: outputTensors[0][0] must have the dtype, sizes and device type of "
            "inputTensors[0] (Float [2] on cpu), got Float [3] on cpu",
            1: "delaycomm: gather: " + NOT_ROOT,
        },
    ),
    "gather_two_inputs": (
        lambda b, r: b.gather([], [_z(2), _z(2)], _gather_opts(0)),
        {r: "delaycomm: gather: inputTensors must hold exactly one tensor, got 2" for r in (0, 1)},
    ),
    "gather_root": (
        lambda b, r: b.gather([], [_z(2)], _gather_opts(5)),
        {r: "delaycomm: gather: the root must be a rank of the group, in [0, 2), got 5" for r in (0, 1)},
    ),
    "scatter_dtype": (
        lambda b, r: b.scatter([_z(2)], [[_z(2, torch.int32), _z(2)]], _scatter_opts(0)),
        {
            0: "delaycomm: scatter: inputTensors[0][0] must have the dtype, sizes and device type of "
            "outputTensors[0] (Float [2] on cpu), got Int [2] on cpu",
            1: "delaycomm: scatter: inputTensors must be empty on a rank other than the root (0), got 1 "
            "list(s) on rank 1",
        },
    ),
    "scatter_two_outputs": (
        lambda b, r: b.scatter([_z(2), _z(2)], [], _scatter_opts(0)),
        {r: "delaycomm: scatter: outputTensors must hold exactly one tensor, got 2" for r in (0, 1)},
    ),
    "reduce_scatter_count": (
        lambda b, r: b.reduce_scatter([_z(2)], [[_z(2)] * 3], dist.ReduceScatterOptions()),
        {r: "delaycomm: reduce_scatter: inputTensors[0] must hold one tensor per rank (2), got 3" for r in (0, 1)},
    ),
    "reduce_scatter_lists": (
        lambda b, r: b.reduce_scatter([_z(2)], [], dist.ReduceScatterOptions()),
        {r: "delaycomm: reduce_scatter: inputTensors must hold one list per output tensor (1), got 0" for r in (0, 1)},
    ),
    "reduce_scatter_sizes": (
        lambda b, r: b.reduce_scatter([_z(2)], [[_z(2), _z(3)]], dist.ReduceScatterOptions()),
        {
            r: "delaycomm: reduce_scatter: inputTensors[0][1] must have the dtype, sizes and device "
            "type of outputTensors[0] (Float [2] on cpu), got Float [3] on cpu"
            for r in (0, 1)
        },
    ),
    "allgather_coalesced_lists": (
        lambda b, r: b.allgather_coalesced([[_z(2)]], [_z(2)], AllgatherOptions()),
        {r: "delaycomm: allgather_coalesced: outputTensorLists must hold one list per rank (2), got 1" for r in (0, 1)},
    ),
    "allgather_coalesced_count": (
        lambda b, r: b.allgather_coalesced([[_z(2)], []], [_z(2)], AllgatherOptions()),
        {
            r: "delaycomm: allgather_coalesced: outputTensorLists[1] must hold one tensor per input (1), got 0"
            for r in (0, 1)
        },
    ),
    "allgather_coalesced_dtype": (
        lambda b, r: b.allgather_coalesced([[_z(2, torch.int64)], [_z(2)]], [_z(2)], AllgatherOptions()),
        {
            r: "delaycomm: allgather_coalesced: outputTensorLists[0][0] must have the dtype, "
            "sizes and device type of inputTensors[0] (Float [2] on cpu), got Long [2] on "
            "cpu"
            for r in (0, 1)
        },
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_both_sides_are_checked_with_a_message_naming_the_method(case):
    call, messages = CASES[case]

    def body(ctx):
        g = ctx.group()
        backend = g._get_backend(torch.device("cpu"))
        with pytest.raises(ValueError) as e:
            call(backend, ctx.rank)
        t = torch.ones(2)
        dist.all_reduce(t, group=g)  # nothing was issued: the group is still in step
        return str(e.value).split("\n")[0], t.tolist()

    for rank, (text, t) in enumerate(run_threads(body, WORLD, timeout=50)):
        assert text == messages[rank]
        assert t == [2.0, 2.0]


@pytest.mark.timeout(60)
def test_well_formed_arguments_still_reach_gloo():
    def body(ctx):
        g = ctx.group()
        b = g._get_backend(torch.device("cpu"))
        out = [[_z(2) for _ in range(WORLD)]] if ctx.rank == 0 else []
        b.gather(out, [torch.full((2,), float(ctx.rank))], _gather_opts(0)).wait()
        lists = [[_z(2)] for _ in range(WORLD)]
        b.allgather_coalesced(lists, [torch.full((2,), float(ctx.rank + 1))], AllgatherOptions()).wait()
        return [t.tolist() for t in (out[0] if out else [])], [ls[0].tolist() for ls in lists]

    (gathered0, lists0), (gathered1, lists1) = run_threads(body, WORLD, timeout=50)
    assert gathered0 == [[0.0, 0.0], [1.0, 1.0]] and gathered1 == []
    assert lists0 == lists1 == [[1.0, 1.0], [2.0, 2.0]]
