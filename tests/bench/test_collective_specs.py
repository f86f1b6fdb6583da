"""Each collective's spec: check inputs, expected results (by hand), element counts, the wrong-element count."""

import pytest
import torch

from delaycomm.bench import collectives
from delaycomm.bench.collectives import COLLECTIVES, get

# (collective, redop, n, rank, root, count) -> this rank's result, worked out by hand from the inputs
# rank r holds BASE[(i + r) % P] (BASE = 1..4, or 1..2 for prod): rank 0 [1 2 3 4], rank 1 [2 3 4 1], rank 2 [3 4 1 2].
HAND = [
    ("all_reduce", "sum", 2, 0, 0, 4, [3, 5, 7, 5]),
    ("all_reduce", "sum", 3, 1, 0, 4, [6, 9, 8, 7]),
    ("all_reduce", "prod", 2, 0, 0, 4, [2, 2, 2, 2]),
    ("all_reduce", "min", 2, 1, 0, 4, [1, 2, 3, 1]),
    ("all_reduce", "max", 3, 0, 0, 4, [3, 4, 4, 4]),
    ("all_reduce", "avg", 2, 0, 0, 4, [1.5, 2.5, 3.5, 2.5]),
    ("all_gather", "sum", 2, 0, 0, 4, [1, 2, 2, 3]),
    ("all_gather", "sum", 3, 2, 0, 6, [1, 2, 2, 3, 3, 4]),
    ("reduce_scatter", "sum", 2, 0, 0, 4, [3, 5]),
    ("reduce_scatter", "sum", 2, 1, 0, 4, [7, 5]),
    ("reduce_scatter", "max", 3, 2, 0, 6, [3, 4]),
    ("broadcast", "sum", 2, 0, 1, 4, [2, 3, 4, 1]),
    ("broadcast", "sum", 3, 2, 2, 4, [3, 4, 1, 2]),
    ("all_to_all", "sum", 2, 0, 0, 4, [1, 2, 2, 3]),
    ("all_to_all", "sum", 2, 1, 0, 4, [3, 4, 4, 1]),
]


@pytest.mark.parametrize("name, redop, n, rank, root, count, want", HAND)
def test_expected_result_by_hand(name, redop, n, rank, root, count, want):
    got = get(name).expected(count, rank, n, redop, root)
    assert got.tolist() == [float(w) for w in want]


def _simulate(name, inputs, redop, root):
    """What each rank must get, computed from every rank's actual check input (an independent reference)."""
    n = len(inputs)
    stacked = torch.stack([x.to(torch.float64) for x in inputs])
    red = {
        "sum": lambda t: t.sum(0),
        "prod": lambda t: t.prod(0),
        "min": lambda t: t.min(0).values,
        "max": lambda t: t.max(0).values,
        "avg": lambda t: t.mean(0),
    }[redop]
    if name == "all_reduce":
        return [red(stacked)] * n
    if name == "all_gather":
        return [torch.cat(list(stacked))] * n
    if name == "reduce_scatter":
        return list(red(stacked).chunk(n))
    if name == "broadcast":
        return [stacked[root]] * n
    if name == "all_to_all":
        chunks = [x.chunk(n) for x in stacked]
        return [torch.cat([chunks[s][r] for s in range(n)]) for r in range(n)]
    raise AssertionError(name)


@pytest.mark.parametrize("name", list(COLLECTIVES))
@pytest.mark.parametrize("redop", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_expected_matches_a_simulation_of_the_check_inputs(name, redop, n):
    spec = get(name)
    count = spec.count_for(60 * 4, 4, n)
    root = n - 1
    inputs = [spec.buffers(count, torch.float32, "cpu", r, n, redop, root, for_check=True)[0] for r in range(n)]
    if name == "broadcast":  # only the root's data matters; the others start from zeros
        assert all(inputs[r].eq(0).all() for r in range(n) if r != root)
        inputs[root] = spec.buffers(count, torch.float32, "cpu", root, n, redop, root, for_check=True)[0]
    want = _simulate(name, inputs, redop, root)
    for r in range(n):
        assert torch.equal(spec.expected(count, r, n, redop, root), want[r]), (name, redop, n, r)


@pytest.mark.parametrize(
    "name, size, elsize, n, count",
    [
        ("all_reduce", 8, 4, 4, 2),
        ("all_gather", 8, 4, 4, 0),
        ("all_gather", 32, 4, 3, 6),
        ("reduce_scatter", 4096, 2, 3, 2046),
        ("broadcast", 7, 4, 2, 1),
        ("all_to_all", 64, 8, 8, 8),
    ],
)
def test_count_rounds_down_to_whole_chunks(name, size, elsize, n, count):
    assert get(name).count_for(size, elsize, n) == count


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64"])
def test_count_wrong_counts_an_injected_error(dtype):
    spec = get("all_reduce")
    expected = spec.expected(64, 0, 3, "sum", 0)
    got = expected.to(getattr(torch, dtype)).clone()
    assert spec.count_wrong(got, expected, dtype, "sum") == 0
    got[7] += 1
    assert spec.count_wrong(got, expected, dtype, "sum") == 1


def test_count_wrong_takes_avg_to_a_tolerance():
    spec = get("all_reduce")
    expected = spec.expected(4, 0, 3, "avg", 0)  # means of three small integers: not all exact in binary
    got = expected.to(torch.float16)
    assert spec.count_wrong(got, expected, "float16", "avg") == 0
    got[1] *= 1.01
    assert spec.count_wrong(got, expected, "float16", "avg") == 1


def test_count_wrong_counts_nan():
    spec = get("all_reduce")
    expected = spec.expected(8, 0, 2, "sum", 0)
    got = expected.float()
    got[0] = float("nan")
    assert spec.count_wrong(got, expected, "float32", "sum") == 1


def test_int8_prod_wraps_like_the_dtype():
    # 2^8 = 256 wraps to 0 in int8: a correct backend returns the wrapped value.
    spec = get("all_reduce")
    expected = spec.expected(2, 0, 8, "prod", 0)
    assert expected.tolist() == [16.0, 16.0]  # 8 ranks alternate 1 and 2: 2^4
    assert spec.count_wrong(torch.tensor([16, 16], dtype=torch.int8), expected, "int8", "prod") == 0


def test_timing_buffers_do_not_grow_under_in_place_sum():
    spec = get("all_reduce")
    inp, out = spec.buffers(16, torch.float16, "cpu", 1, 2, "sum", 0, for_check=False)
    assert out is None and inp.eq(0).all()
    inp, _ = spec.buffers(16, torch.float16, "cpu", 1, 2, "prod", 0, for_check=False)
    assert inp.eq(1).all()


def test_unknown_collective_names_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown collective 'allreduce'; expected one of: all_reduce, all_gather"):
        get("allreduce")


def test_dtype_table_matches_torch():
    for name, (attr, size) in collectives.DTYPES.items():
        assert torch.empty(0, dtype=getattr(torch, attr)).element_size() == size, name


@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_each_collectives_factor_text_is_its_bus_factor(name):
    # the formula the report prints and the one the bench computes are written apart: they must say the same
    spec = get(name)
    formula = spec.factor_text.replace("2(", "2*(")
    for n in (1, 2, 3, 8):
        assert spec.bus_factor(n) == pytest.approx(eval(formula, {"n": n})), (name, n)


@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_each_collective_is_one_entry_with_its_own_specifics(name):
    spec = get(name)
    assert spec.name == name and isinstance(spec, collectives.Collective)
    for method in ("bus_factor", "expected", "issue"):  # what every collective must say for itself
        assert getattr(type(spec), method) is not getattr(collectives.Collective, method), (name, method)
    assert spec.stats_op and spec.reduces == (name in ("all_reduce", "reduce_scatter"))
