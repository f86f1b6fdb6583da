"""Every public nccl-tests log and Kineto trace in ../shared/data (each with its source in a README there) read into
a profile that reproduces the source's own numbers, per op and size; skipped where the data is absent."""

from __future__ import annotations

import glob
import gzip
import json
import os
from collections import defaultdict

import pytest

from delaycomm.sources import build, nccl_tests, read
from delaycomm.sources.histogram import size_class_bytes

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
LOGS = sorted(glob.glob(os.path.join(DATA, "nccl-tests", "*.txt")))
TRACES = sorted(glob.glob(os.path.join(DATA, "traces", "*.json*")))
# What SOURCES.md says of each log: (collective, world size, nodes) per table.
EXPECTED = {
    "01": [("all_reduce", 16, 2)],
    "02": [("all_reduce", 2, 2)],
    "05": [("all_gather", 2, 1)],
    "08": [("all_reduce", 16, 2)],
    "14": [(c, 12, 1) for c in ("all_gather", "all_reduce", "broadcast", "reduce", "reduce_scatter")],
    "15": [(c, 8, 1) for c in ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")],
    "16": [(c, 10, 10) for c in ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")],
}


def _no_stats(paths):
    raise AssertionError(paths)


@pytest.mark.skipif(not LOGS, reason="no ../shared/data/nccl-tests")
@pytest.mark.parametrize("path", LOGS, ids=os.path.basename)
def test_every_log_becomes_a_profile_whose_mean_per_op_and_class_is_the_tables_time(path):
    tables = nccl_tests.read_tables(path)
    got = [(t.collective.name, t.world_size, len(t.hosts)) for t in tables]
    key = os.path.basename(path)[:2]
    if key in EXPECTED:
        assert got == EXPECTED[key]
    doc, _ = build.build_profile([path], build.Options(), _no_stats)
    # The table's own numbers: per op and class, the mean of the rows' chosen times (torch's placement).
    want: dict[tuple[str, int], list[float]] = defaultdict(list)
    for t in tables:
        place = "in-place" if t.collective.in_place else "out-of-place"
        for r in t.rows:
            per_rank = (
                r.count * {"float": 4, "double": 8}[r.dtype] if t.collective.per_rank_bytes_from_count else r.size
            )
            cls = size_class_bytes(read.row_class_bytes(per_rank))
            for op in t.collective.ops:
                want[(op, cls)].append(r.timings[place].time_us)
    have = {(op, c["bytes"]): (c["count"], c["sum_ns"] / c["count"] / 1e3) for op, cs in doc["ops"].items() for c in cs}
    assert set(have) == set(want)
    for k, times in want.items():
        assert have[k][0] == 1000 * len(times)
        assert have[k][1] == pytest.approx(sum(times) / len(times), rel=1e-9), k


@pytest.mark.skipif(not LOGS, reason="no ../shared/data/nccl-tests")
def test_a_real_profile_loads_in_the_replay_and_its_draws_have_the_tables_mean(tmp_path):
    from delaycomm import _C, profile

    path = next(p for p in LOGS if os.path.basename(p).startswith("02"))
    doc, _ = build.build_profile([path], build.Options(), _no_stats)
    out = str(tmp_path / "p.json")
    profile.write(doc, out)  # the native loader checks it
    s = _C.DelaySampler(f"profile:{out}")
    # 02's in-place all_reduce of 1 MiB: 93.72 us; the replay's quantile function, averaged.
    draws = [s.quantile((i + 0.5) / 2000, op="allreduce", nbytes=1 << 20) * 1e6 for i in range(2000)]
    assert sum(draws) / len(draws) == pytest.approx(93.72, rel=0.01)
    assert s.quantile(0.5, op="allreduce", nbytes=1 << 20) * 1e6 < 93.72  # the mean is the table's, not the median


def _trace(path, monkeypatch):
    """The trace's kernels and world size, read here; the builder is handed the same parsed document (a 35 MB JSON
    is parsed once)."""
    from delaycomm.sources import kineto

    with open(path, "rb") as f:
        doc = json.loads(gzip.decompress(f.read()))
    monkeypatch.setattr(kineto, "load_json", lambda p: doc if p == path else pytest.fail(p))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")]
    return kernels, doc["distributedInfo"]["world_size"]


@pytest.mark.skipif(not TRACES, reason="no ../shared/data/traces")
@pytest.mark.parametrize("path", TRACES, ids=os.path.basename)
def test_every_trace_becomes_a_profile_of_its_kernel_durations(path, monkeypatch):
    kernels, world = _trace(path, monkeypatch)
    doc, _notes = build.build_profile([path], build.Options(), _no_stats)
    # Every kernel's duration is in the profile, once: per kernel type, the sums agree.
    by_kernel: dict[str, float] = defaultdict(float)
    for k in kernels:
        by_kernel[k["name"].split("_")[1]] += k["dur"] * 1e3
    by_op: dict[str, float] = defaultdict(float)
    for op, cs in doc["ops"].items():
        by_op[op] += sum(c["sum_ns"] for c in cs)
    for op, u in (doc["metadata"]["unsized"] or {}).items():
        by_op[op] += u["histogram"]["sum_ns"]
    kind = {"allreduce": "AllReduce", "broadcast": "Broadcast", "alltoall_base": "SendRecv"}
    assert {kind[op]: pytest.approx(v) for op, v in by_op.items()} == dict(by_kernel)
    assert sum(c["count"] for cs in doc["ops"].values() for c in cs) == len(kernels)
    args = [k for k in kernels if "In msg nelems" in k["args"]]
    for k in args:  # where the kernel says its size, the call is in that class with that duration
        a = k["args"]
        op = {"allreduce": "allreduce", "broadcast": "broadcast"}[a["Collective name"]]
        nbytes = a["In msg nelems"] * {"Float": 4, "Long": 8}[a["dtype"]]
        (c,) = [c for c in doc["ops"][op] if c["bytes"] == size_class_bytes(nbytes)]
        assert c["min_ns"] <= k["dur"] * 1e3 <= c["max_ns"]
    assert doc["metadata"]["world_size"] == world
