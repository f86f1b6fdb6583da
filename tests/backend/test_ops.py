"""The one op table (csrc/ops/OpTable.hpp): what Python reads from it is what the backend counts and accepts."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import delaycomm
from delaycomm import _C, _ops
from delaycomm._config import resolve
from tests.harness import run_threads


def test_the_table_lists_every_kind_once_in_order():
    assert [int(o.kind) for o in _ops.OPS] == list(range(len(_ops.OPS)))
    assert [o.kind.name for o in _ops.OPS] == [o.name for o in _ops.OPS]
    assert len(_ops.BY_NAME) == len(_ops.OPS)
    assert "coalesced" in _ops.BY_NAME and "coalesced" not in _ops.DELAYABLE_OPS


@pytest.mark.parametrize("alias", sorted(_ops.ALIASES))
def test_every_alias_is_a_torch_distributed_function(alias):
    assert callable(getattr(dist, alias, None)), alias


def test_delay_ops_accepts_every_name_and_alias_of_the_table():
    names = list(_ops.DELAYABLE_OPS) + [a for a, op in _ops.ALIASES.items() if op in _ops.DELAYABLE_OPS]
    got = resolve(delaycomm.DelayConfig(delay_ops=",".join(names))).delay_ops
    assert got == tuple(sorted(_ops.DELAYABLE_OPS))
    with pytest.raises(ValueError, match="'coalesced' for option 'delay_ops'"):
        resolve(delaycomm.DelayConfig(delay_ops="coalesced"))


@pytest.mark.timeout(60)
def test_the_backend_knows_every_name_and_counts_ops_under_them():
    def body(ctx):
        g = ctx.group()
        backend = g._get_backend(torch.device("cpu"))
        known = [backend.delay_ns_for(o.name, 1) for o in _ops.OPS]  # raises on a name the backend lacks
        with pytest.raises(ValueError, match="unknown op 'all_reduce'"):
            backend.delay_ns_for("all_reduce", 1)  # aliases are Python's: the backend names ops by the table
        t = torch.ones(2)
        dist.all_reduce(t, group=g)
        dist.all_gather_into_tensor(torch.empty(2 * ctx.world_size), t, group=g)
        dist.broadcast(t, group_src=0, group=g)
        return known, sorted(delaycomm.stats(g)["ops"])

    for known, counted in run_threads(body, 2, timeout=50):
        assert known == [0] * len(_ops.OPS)
        assert counted == sorted(
            [_ops.canonical("all_reduce"), _ops.canonical("all_gather_into_tensor"), _ops.canonical("broadcast")]
        )


def test_op_info_is_read_only():
    row = _C.op_table()[1]
    assert row.name == "allreduce" and row.reduces and row.aliases == ("all_reduce",)
    with pytest.raises(AttributeError):
        row.name = "x"
