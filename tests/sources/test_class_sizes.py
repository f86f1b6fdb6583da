"""Where a profile class's size comes from (``size_bytes``, docs/profile.md): a table row's per-rank size, a
trace's calls' mean size, a re-targeted class's size, the stats files' per-class sum of bytes; and what the draw
within a class then does with tables: a bandwidth-bound call at the top of its class draws as the table's next row,
not as its class's bottom."""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from delaycomm import profile
from delaycomm._readers import FileError
from delaycomm.sources import build, nccl_tests
from tests.sources.logs import run, time_us, write

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "nccl-tests")
LOG15 = os.path.join(DATA, "15-h100-cluster01-5coll-8r-1n.txt")
needs_15 = pytest.mark.skipif(not os.path.exists(LOG15), reason="no ../shared/data/nccl-tests/15-*")
MiB, GiB = 1 << 20, 1 << 30


def _no_stats(paths):
    raise AssertionError(paths)


def _profile(paths, **opts):
    doc, _ = build.build_profile(paths, build.Options(**opts), _no_stats)
    return doc, profile.check(doc)


def _sizes(doc, op):
    return {c["bytes"]: c.get("size_bytes") for c in doc["ops"][op]}


def test_a_tables_classes_are_at_their_rows_sizes_and_the_top_of_a_class_draws_as_the_next_row(tmp_path):
    sizes = [1 << k for k in range(10, 31)]
    log = write(tmp_path, "log.txt", run("all_reduce", 8, sizes) + run("all_gather", 10, sizes))
    doc, p = _profile([log])
    assert _sizes(doc, "allreduce") == {s: s for s in sizes}
    # all_gather at 10 ranks: per-rank sizes of a tenth of the row's total (rounded to whole floats), mid-class.
    per_rank = {s: s // 40 * 4 for s in sizes}
    assert _sizes(doc, "_allgather_base") == {1 << (r.bit_length() - 1): r for r in per_rank.values()}
    for q in (0.1, 0.5, 0.9):
        for s in (GiB >> 1, GiB >> 4):  # bandwidth-bound (the synthetic table is 20 us + 100 GB/s)
            want = time_us("all_reduce", 2 * s) / time_us("all_reduce", s)  # the table's neighbouring rows
            top = p.quantile(q, "allreduce", 2 * s - s // 256)  # 0.4% under the next row: the top of the class
            assert top / p.quantile(q, "allreduce", s) == pytest.approx(want, rel=0.02) and want > 1.8
        # Latency-bound (1 KiB: 20.01 us, 2 KiB: 20.02 us): flat.
        assert p.quantile(q, "allreduce", 2047) / p.quantile(q, "allreduce", 1024) == pytest.approx(1.0, abs=0.01)
        # A call of a row's own per-rank size draws that row's class exactly; one between two rows' sizes draws
        # between them, geometrically, by its position in log2 of the size.
        lo, hi = per_rank[GiB >> 1], per_rank[GiB]
        at_lo, at_hi = p.quantile(q, "_allgather_base", lo), p.quantile(q, "_allgather_base", hi)
        alone = profile.check(dict(doc, ops={"allreduce": [c for c in doc["ops"]["_allgather_base"]
                                                           if c.get("size_bytes") == lo]}))  # fmt: skip
        assert at_lo == alone.quantile(q, "allreduce", 1 << (lo.bit_length() - 1))
        class_top = (1 << lo.bit_length()) - (1 << lo.bit_length()) // 256
        w = math.log2(class_top / lo) / math.log2(hi / lo)
        got = p.quantile(q, "_allgather_base", class_top)
        assert got == pytest.approx(math.exp((1 - w) * math.log(at_lo) + w * math.log(at_hi)), rel=1e-9)
        assert got / at_lo == pytest.approx(
            (time_us("all_gather", GiB) / time_us("all_gather", GiB >> 1)) ** w, rel=0.02
        )


@needs_15
def test_the_h100_tables_rows_are_drawn_at_their_sizes_and_a_call_near_1_gib_as_the_1_gib_row():
    doc, p = _profile([LOG15])
    tables = {t.collective.name: t for t in nccl_tests.read_tables(LOG15)}
    rows = {r.size: r.timings["in-place"].time_us for r in tables["all_reduce"].rows}
    for op in doc["ops"]:
        for c in doc["ops"][op]:
            assert c["size_bytes"] is not None and c["bytes"] <= c["size_bytes"] < 2 * c["bytes"]
    # The 512 MiB class's top draws as the table's 1 GiB row (about twice its own row), not as its bottom.
    mean = [p.quantile((i + 0.5) / 200, "allreduce", GiB - GiB // 512) for i in range(200)]
    assert sum(mean) / len(mean) * 1e6 == pytest.approx(rows[GiB], rel=0.03)
    assert p.quantile(0.5, "allreduce", GiB - GiB // 512) / p.quantile(0.5, "allreduce", GiB // 2) == pytest.approx(
        rows[GiB] / rows[GiB // 2], rel=0.02
    )
    assert rows[GiB] / rows[GiB // 2] > 1.8
    # nccl-tests' rounding of a size is that size's power of two.
    assert p.quantile(0.5, "allreduce", 1073740800) == p.quantile(0.5, "allreduce", GiB)


@needs_15
def test_a_retargeted_profile_has_each_class_at_the_size_the_model_priced_it():
    doc, p = _profile([LOG15], ranks=4, nodes=1)
    for op, classes in doc["ops"].items():
        assert [c["size_bytes"] for c in classes] == [c["bytes"] for c in classes], op
    for q in (0.1, 0.5, 0.9):  # a call between two classes' sizes: between their draws, by its log2 position
        lo, hi = p.quantile(q, "allreduce", 256 * MiB), p.quantile(q, "allreduce", 512 * MiB)
        w = math.log2(1.5)
        want = math.exp((1 - w) * math.log(lo) + w * math.log(hi))
        assert p.quantile(q, "allreduce", 384 * MiB) == pytest.approx(want, rel=1e-9) and lo < want < hi


def _kernel(nbytes, dur, ts):
    return {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs)",
            "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"Collective name": "allreduce", "In msg nelems": nbytes // 4, "dtype": "Float",
                     "Group size": 2}}  # fmt: skip


def test_a_traces_class_is_at_its_calls_mean_size(tmp_path):
    events = [_kernel(MiB, 100.0, 1000.0 * i) for i in range(30)]
    events += [_kernel(3 * MiB // 2, 150.0, 1000.0 * (30 + i)) for i in range(10)]
    events += [_kernel(4 * MiB, 400.0, 1000.0 * (40 + i)) for i in range(20)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"backend": "nccl", "rank": 0,
                                                                          "world_size": 2}}))  # fmt: skip
    doc, _ = _profile([str(path)])
    assert _sizes(doc, "allreduce") == {MiB: (30 * MiB + 10 * (3 * MiB // 2)) // 40, 4 * MiB: 4 * MiB}


def _stats(path, sizes=None, nbytes=1024, ns=1e6, calls=20):
    bucket = int(math.log(ns) / math.log(1.02))
    h = {"base": 1.02, "unit": "ns", "count": calls, "zeros": 0, "sum_ns": calls * ns, "min_ns": ns, "max_ns": ns,
         "buckets": [[bucket, calls]]}  # fmt: skip
    entry = {"bytes": nbytes, "calls": calls, "histogram": h}
    if sizes is not None:
        entry["sizes"] = sizes
    data = {"group": "0", "rank": 0, "world_size": 2, "host": "h", "ops": {"allreduce": {"calls": calls,
            "by_size": [entry]}}}  # fmt: skip
    path.write_text(json.dumps(data))
    return str(path)


def test_stats_record_each_classs_calls_sizes_and_the_profile_is_at_their_mean(tmp_path):
    import torch
    import torch.distributed as dist

    import delaycomm
    from tests.harness import run_threads

    def body(ctx):
        g = ctx.group()
        for n in (256, 256, 256, 384, 2):  # floats: 1 KiB x3 and 1.5 KiB in the 1 KiB class; 8 B alone
            dist.all_reduce(torch.ones(n), group=g)
        return delaycomm.stats(g)

    for rank, st in enumerate(run_threads(body, 2, timeout=50)):
        by = {c["bytes"]: c["sizes"] for c in st["ops"]["allreduce"]["by_size"]}
        assert by == {8: {"calls": 1, "sum_bytes": 8.0}, 1024: {"calls": 4, "sum_bytes": 3 * 1024 + 1536.0}}
        (tmp_path / f"stats.rank{rank}.json").write_text(json.dumps(st))
    paths = [str(tmp_path / f"stats.rank{r}.json") for r in range(2)]
    doc = profile.build(paths)
    assert _sizes(doc, "allreduce") == {8: 8, 1024: 1152}  # (3 x 1024 + 1536) / 4
    p = profile.check(doc)
    alone = profile.check(dict(doc, ops={"allreduce": [dict(doc["ops"]["allreduce"][1], size_bytes=1024)]}))
    assert p.quantile(0.5, "allreduce", 1152) == alone.quantile(0.5, "allreduce", 1024)


def test_stats_files_sizes_merge_and_older_files_without_them_leave_the_class_without_one(tmp_path):
    a = _stats(tmp_path / "a.json", {"calls": 10, "sum_bytes": 10 * 1024.0})
    b = _stats(tmp_path / "b.json", {"calls": 20, "sum_bytes": 20 * 2000.0})
    old = _stats(tmp_path / "c.json")
    assert _sizes(profile.build([a, b]), "allreduce") == {1024: round((10 * 1024 + 20 * 2000) / 30)}
    assert _sizes(profile.build([a, old]), "allreduce") == {1024: None}
    # A mean within 0.1% under 2 KiB (the replay reads such sizes as 2 KiB) is kept at the class's last size.
    near = _stats(tmp_path / "d.json", {"calls": 2, "sum_bytes": 2 * 2046.0})
    assert _sizes(profile.build([near]), "allreduce") == {1024: 2045}
    # Merged with a table's classes (the same world size), the sizes combine weighed as the histograms are (a
    # table row's 1000 points, the stats' 20 calls).
    log = write(tmp_path, "log.txt", run("all_reduce", 2, [1024, 1 << 20]))
    doc, _ = build.build_profile([log, a], build.Options(), profile.build)
    assert _sizes(doc, "allreduce") == {1024: 1024, 1 << 20: 1 << 20}
    doc, _ = build.build_profile([log, b], build.Options(), profile.build)
    assert _sizes(doc, "allreduce")[1024] == round((1000 * 1024 + 20 * 2000) / 1020)
    doc, _ = build.build_profile([log, old], build.Options(), profile.build)
    assert _sizes(doc, "allreduce") == {1024: None, 1 << 20: 1 << 20}
    profile.check(doc)


@pytest.mark.parametrize(
    "sizes, why",
    [
        ({"calls": 2, "sum_bytes": 5000.0}, r"sizes\.sum_bytes is 5000\.000000 for 2 call\(s\) \(expected their sizes' "
                                            r"sum: 2 call\(s\) of the class of 1024 bytes sum to 2048 up to 4096\)"),
        ({"calls": 2, "sum_bytes": -1}, r"sizes\.sum_bytes is -1\.000000 \(expected a number of bytes >= 0\)"),
        ({"calls": 2.5, "sum_bytes": 3000}, r"sizes\.calls is 2\.500000 \(expected a whole number >= 0\)"),
        ({"calls": 2}, r"sizes\.sum_bytes is missing"),
        ([2, 3000], r"sizes is an array \(expected an object\)"),
    ],
)  # fmt: skip
def test_bad_sizes_in_a_stats_file_name_the_file_and_the_field(tmp_path, sizes, why):
    path = _stats(tmp_path / "s.json", sizes)
    where = rf"stats file {re.escape(repr(path))} field ops\.allreduce\.by_size\[0\]\."
    with pytest.raises(FileError, match=where + why):
        profile.build([path])
