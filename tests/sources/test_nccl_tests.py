"""The nccl-tests reader (docs/profile.md, "Where production latency comes from"): each oddity of real logs as a
small inline case, the sizes in delaycomm's convention, and the errors that name the file and the line."""

from __future__ import annotations

import re

import numpy as np
import pytest

from delaycomm.sources import build, nccl_tests
from delaycomm.sources.ops import COLLECTIVES, collective
from tests.sources.logs import rank_lines, row, run, time_us, write

MiB = 1 << 20


def tables(tmp_path, lines, op=None):
    return nccl_tests.read_tables(write(tmp_path, "log.txt", lines), op)


def profile(tmp_path, lines, **opts):
    doc, _notes = build.build_profile([write(tmp_path, "log.txt", lines)], build.Options(**opts), _no_stats)
    return doc


def _no_stats(paths):
    raise AssertionError(f"stats builder called for {paths}")


def mean_us(doc, op, nbytes):
    (c,) = [c for c in doc["ops"][op] if c["bytes"] == nbytes]
    return c["sum_ns"] / c["count"] / 1e3


def test_a_new_log_reads_as_printed_with_its_collective_world_size_and_hosts(tmp_path):
    (t,) = tables(tmp_path, run("all_reduce", 16, [MiB, 64 * MiB], nodes=2))
    assert t.collective.name == "all_reduce" and "Collective test starting" in t.collective_by
    assert (t.world_size, t.world_size_by, t.hosts) == (16, "the rank lines", ["node0", "node1"])
    assert [r.size for r in t.rows] == [MiB, 64 * MiB]
    r = t.rows[1]
    assert r.timings["out-of-place"].time_us == pytest.approx(time_us("all_reduce", 64 * MiB), abs=0.01)
    assert r.timings["in-place"].time_us == pytest.approx(1.1 * time_us("all_reduce", 64 * MiB), abs=0.01)
    assert (r.dtype, r.redop, r.root, t.params["iters"]) == ("float", "sum", -1, 20)


def test_launcher_prefixes_info_lines_and_stripped_hashes_are_read_through(tmp_path):
    body = run("all_reduce", 2, [1024, 4096], fmt="old", starting=False)
    i = next(k for k, line in enumerate(body) if "(B)" in line)
    body[i + 1 : i + 1] = ["host:25:25 [0] NCCL INFO Launch mode Parallel", "host:26:68 [1] NCCL INFO Connected"]
    mpi = [f"[1,{k % 2}]<stdout>:{line}" for k, line in enumerate(body)]
    srun = [f"0: {line}" for line in body]
    stripped = [line.lstrip("#") for line in body]  # a docs page that ate every '#'
    stamped = [f"2026-01-02T03:04:{k % 60:02d}.123456789Z {line}" for k, line in enumerate(body)]  # kubectl logs
    for lines in (mpi, srun, stripped, stamped):
        (t,) = tables(tmp_path, ["+ mpirun -np 2 ./build/all_reduce_perf -b 1K -e 4K", *lines])
        assert (t.collective.name, t.world_size, [r.size for r in t.rows]) == ("all_reduce", 2, [1024, 4096])


def test_several_collectives_in_one_log_each_with_its_own_table(tmp_path):
    lines = run("all_reduce", 8, [MiB]) + run("all_gather", 8, [8 * MiB]) + run("alltoall", 8, [8 * MiB])
    lines += run("sendrecv", 8, [MiB]) + run("reduce_scatter", 8, [8 * MiB])
    got = [(t.collective.name, t.world_size) for t in tables(tmp_path, lines)]
    assert got == [("all_reduce", 8), ("all_gather", 8), ("alltoall", 8), ("sendrecv", 8), ("reduce_scatter", 8)]


@pytest.mark.parametrize(
    "coll, size, per_rank",
    [
        ("all_reduce", 64 * MiB, 64 * MiB),
        ("all_gather", 64 * MiB, 8 * MiB),  # count x element size, not nccl-tests' total size
        ("reduce_scatter", 64 * MiB, 64 * MiB),  # the input every rank passes in
        ("alltoall", 64 * MiB, 64 * MiB),
        ("broadcast", 64 * MiB, 64 * MiB),
        ("reduce", 64 * MiB, 64 * MiB),
        ("sendrecv", 64 * MiB, 64 * MiB),
    ],
)
def test_sizes_are_the_bytes_a_rank_passes_in_and_each_op_torch_calls_gets_the_table(tmp_path, coll, size, per_rank):
    doc = profile(tmp_path, run(coll, 8, [size]))
    c = COLLECTIVES[coll]
    assert sorted(doc["ops"]) == sorted(c.ops)
    place = 1.1 if c.in_place else 1.0  # all_reduce, broadcast, reduce: torch calls them in place
    for op in c.ops:
        assert [e["bytes"] for e in doc["ops"][op]] == [per_rank]
        assert mean_us(doc, op, per_rank) == pytest.approx(place * time_us(coll, size), rel=1e-4)
    assert doc["metadata"]["sources"][0]["tables"][0]["placement"] == {"in-place" if c.in_place else "out-of-place": 1}


def test_placement_flag_and_sizes_just_under_a_power_of_two(tmp_path):
    # 10 ranks: nccl-tests rounds 32 MiB down to 33554400 B (a multiple of 10 x 8): still the 32 MiB class.
    doc = profile(tmp_path, run("reduce_scatter", 10, [32 * MiB], dtype="double"), placement="in-place")
    assert [e["bytes"] for e in doc["ops"]["_reduce_scatter_base"]] == [32 * MiB]
    assert mean_us(doc, "_reduce_scatter_base", 32 * MiB) == pytest.approx(1.1 * time_us("", 33554400), rel=1e-4)
    # all_gather on 10 ranks: 3355440 B per rank, class 2 MiB (not snapped: far from 4 MiB).
    doc = profile(tmp_path, run("all_gather", 10, [32 * MiB], dtype="double"))
    assert [e["bytes"] for e in doc["ops"]["_allgather_base"]] == [2 * MiB]


def test_old_headers_error_columns_zero_byte_rows_elisions_and_overflowing_fields(tmp_path):
    lines = run("all_gather", 12, [0, 0, 48, 96, 32 * MiB], fmt="old", starting=False)
    lines.insert(0, "Running: CUDA_VISIBLE_DEVICES=0,1 ./build/all_gather_perf -b 8 -e 10240M -f 2 -g 12")
    at = next(k for k, line in enumerate(lines) if "(B)" in line)
    lines.insert(at + 1, "...")
    lines.insert(at + 2, row("all_gather", 12, 48, fmt="old").replace("  ", " ", 3))  # fields run together
    (t,) = tables(tmp_path, lines)
    assert (t.collective.name, t.world_size, t.elided) == ("all_gather", 12, True)
    doc = profile(tmp_path, lines)
    sizes = [e["bytes"] for e in doc["ops"]["_allgather_base"]]
    assert sizes == [0, 4, 8, 2 * MiB] and doc["ops"]["_allgather_base"][0]["count"] == 2000  # two 0-byte rows


def test_per_iteration_and_timestamp_columns_and_an_empty_op_name(tmp_path):
    head = ("#  size  count  type  redop  root  time  algbw  busbw  #wrong  i_min  i_max  i_p99  i_cv%  "
            "time  algbw  busbw  #wrong  i_min  i_max  i_p99  i_cv%  timestamp")  # fmt: skip
    size, t = 64 * MiB, 700.0
    bw = size / t / 1e3
    line = (f"{size}  {size // 4}  float  sum  -1  {t}  {bw:.2f}  {bw * 1.75:.2f}  0  600.0  2000.0  900.0  8.0  "
            f"{t}  {bw:.2f}  {bw * 1.75:.2f}  0  600.0  2000.0  900.0  8.0  2026-01-02 03:04:05")  # fmt: skip
    doc = profile(tmp_path, ["./build/all_reduce_perf", *rank_lines(8), head, line])
    (c,) = doc["ops"]["allreduce"]
    x = c["sum_ns"] / c["count"]
    assert x == pytest.approx(700e3, rel=1e-9) and c["min_ns"] >= 600e3 and c["max_ns"] <= 2000e3
    assert doc["metadata"]["sources"][0]["spread_from_per_iteration_columns"] == 1
    # An old alltoall printed its empty op name as blanks: one field fewer, read without it.
    old = run("alltoall", 4, [MiB], fmt="old", starting=False)
    old = [line.replace("    none", "", 1) if line[:1] == " " else line for line in old]
    (tb,) = tables(tmp_path, ["./build/alltoall_perf", *old])
    assert (tb.collective.name, tb.rows[0].redop) == ("alltoall", "")


def test_rccl_tests_and_the_2016_layout(tmp_path):
    lines = ["# rccl-tests version 2.18.3", "RCCL version : 2.18.3-HEAD:abc"]
    lines += run("all_reduce", 8, [MiB], starting=False)
    lines = [line.replace("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X") for line in lines]
    (t,) = tables(tmp_path, lines)
    assert t.collective.name == "all_reduce" and t.versions["rccl-tests"] == "2.18.3"
    legacy = ["#      bytes            N    type      op     time  algbw  busbw      res     time  algbw  busbw   res",
              row("all_reduce", 4, MiB, fmt="old").replace("2e-07", "0e+00")]  # fmt: skip
    (t,) = tables(tmp_path, ["./build/all_reduce_perf", *rank_lines(4), *legacy])
    assert (t.collective.name, t.rows[0].size) == ("all_reduce", MiB)


def test_world_size_from_the_numbers_when_the_log_has_no_rank_lines(tmp_path):
    (t,) = tables(tmp_path, run("all_reduce", 16, [64 * MiB, 256 * MiB], ranks=False))
    assert (t.world_size, t.world_size_by) == (16, "busbw / algbw")
    (t,) = tables(tmp_path, run("all_gather", 6, [64 * MiB], ranks=False))
    assert (t.world_size, t.world_size_by) == (6, "size / (count x element size)")
    (t,) = tables(tmp_path, run("broadcast", 6, [64 * MiB], ranks=False))
    assert t.world_size is None  # nothing in a broadcast table says it


def test_device_lines_cut_short_by_nccl_tests_do_not_set_the_world_size(tmp_path):
    lines = run("all_reduce", 16, [64 * MiB, 256 * MiB], nodes=2)
    first = next(k for k, line in enumerate(lines) if "Rank  4" in line)
    lines[first : first + 12] = ["..."]  # ranks 4..15 cut: the 2048-character limit of one process's lines
    (t,) = tables(tmp_path, lines)
    assert (t.world_size, t.world_size_by, t.nodes) == (16, "busbw / algbw", None)


def test_an_unnamed_table_is_told_apart_by_its_columns_or_needs_op(tmp_path):
    # Old all_reduce: the redop column without root, size = count x 4, busbw/algbw = 2(n-1)/n: nothing else fits.
    (t,) = tables(tmp_path, run("all_reduce", 16, [64 * MiB], fmt="old", starting=False))
    assert t.collective.name == "all_reduce" and "only collective" in t.collective_by
    # New all_gather and alltoall print the same columns and numbers: the log must say which, or --op.
    lines = run("all_gather", 8, [64 * MiB], starting=False)
    with pytest.raises(nccl_tests.NcclTestsError) as e:
        tables(tmp_path, lines)
    assert re.search(r"log\.txt:\d+: the log does not name this table's collective and its columns fit all_gather "
                     r"or alltoall: give --op NAME \(nccl-tests' names", str(e.value))  # fmt: skip
    for name in ("all_gather", "all_gather_perf", "all_gather_into_tensor", "_allgather_base", "allgather"):
        (t,) = tables(tmp_path, lines, op=name)
        assert (t.collective.name, t.collective_by) == ("all_gather", "--op")
    with pytest.raises(nccl_tests.NcclTestsError, match=r"--op all_reduce does not fit this table"):
        tables(tmp_path, lines, op="all_reduce")
    with pytest.raises(nccl_tests.NcclTestsError, match=r"--op 'allgatherz' names no collective"):
        tables(tmp_path, lines, op="allgatherz")


def test_a_named_collective_the_numbers_contradict_is_an_error(tmp_path):
    lines = run("all_gather", 8, [64 * MiB])
    lines = [line.replace("all_gather_perf", "all_reduce_perf") for line in lines]
    with pytest.raises(
        nccl_tests.NcclTestsError,
        match=r"named all_reduce by 'Collective test starting: "
        r"all_reduce_perf' on line 2 but its columns and numbers are those of all_gather, alltoall",
    ):
        tables(tmp_path, lines)
    with pytest.raises(nccl_tests.NcclTestsError, match=r"--op alltoall but the log names this table all_gather"):
        tables(tmp_path, run("all_gather", 8, [64 * MiB]), op="alltoall")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda ls, i: ls.__setitem__(i, ls[i] + "  7"), r"a table row with 14 fields does not match the column"),
        (
            lambda ls, i: ls.__setitem__(i, ls[i].replace("float", "float 12", 1)),
            r"a table row with 14 fields .*line 16 \(size count",
        ),
        (
            lambda ls, i: ls.__setitem__(i, re.sub(r"(\s)(\d+\.\d\d)(\s)", r"\g<1>1.2.3\3", ls[i], count=1)),
            r"column 'out-of-place time' is '1.2.3' \(expected a number\)",
        ),
        (
            lambda ls, i: ls.__setitem__(i, ls[i].replace("   sum", "   sum", 1).replace("  -1  ", "  -x  ", 1)),
            r"column 'root' is '-x'",
        ),
        (
            lambda ls, i: ls.__setitem__(i, re.sub(r"(\s)(\d+\.\d\d)(\s)", r"\g<1>999.00\3", ls[i], count=1)),
            r"out-of-place algbw .* disagrees with size 1048576 B / time 999.0 us",
        ),
    ],
)
def test_a_row_that_does_not_fit_is_an_error_naming_the_file_and_line(tmp_path, edit, message):
    lines = run("all_reduce", 8, [MiB, 2 * MiB])
    i = next(k for k, line in enumerate(lines) if line.strip().startswith("1048576"))
    edit(lines, i)
    with pytest.raises(nccl_tests.NcclTestsError, match=rf"log\.txt:{i + 1}: " + message):
        tables(tmp_path, lines)


def test_processes_that_each_ran_alone_and_logs_without_a_table_are_refused(tmp_path):
    lines = run("all_reduce", 2, [MiB])
    at = next(k for k, line in enumerate(lines) if "Rank  1" in line)
    lines[at] = lines[at].replace("Rank  1", "Rank  0")
    with pytest.raises(nccl_tests.NcclTestsError, match=rf":{at + 1}: rank 0 is listed twice .* each ran nccl-tests "
                       r"alone \(nccl-tests built without MPI\?\)"):  # fmt: skip
        tables(tmp_path, lines)
    with pytest.raises(nccl_tests.NcclTestsError, match=r"holds no table"):
        tables(tmp_path, ["# nThread 1 nGpus 1", "Segmentation fault"])
    # A row after the table ended, with no header above it.
    lines = run("all_reduce", 2, [MiB]) + [row("all_reduce", 2, 2 * MiB)]
    with pytest.raises(nccl_tests.NcclTestsError, match=r"a table row after the table of line \d+ ended"):
        tables(tmp_path, lines)


def test_the_spread_keeps_the_mean_and_sets_the_tail(tmp_path):
    for tail in (1.0, 1.25, 3.0):
        doc = profile(tmp_path, run("all_reduce", 8, [64 * MiB]), tail=tail)
        (c,) = doc["ops"]["allreduce"]
        assert c["count"] == 1000 and c["sum_ns"] / 1000 == pytest.approx(1.1 * time_us("", 64 * MiB) * 1e3, rel=1e-5)
        assert doc["metadata"]["spread"]["p99_over_p50"] == tail
        samples = np.repeat([b for b, _ in c["buckets"]], [n for _, n in c["buckets"]])
        p50, p99 = np.quantile(samples, [0.5, 0.99])
        assert 1.02 ** (p99 - p50) == pytest.approx(tail, rel=0.05)  # within a bucket or two


def test_op_names_of_nccl_tests_torch_and_nccl_are_one_collective():
    assert {collective(n).name for n in ("all_reduce", "all_reduce_perf", "allreduce", "ncclAllReduce")} == {
        "all_reduce"
    }
    assert collective("reduce_scatter_tensor").name == "reduce_scatter"
    assert collective("all_to_all_single").name == collective("AllToAll").name == "alltoall"
    assert collective("isend").name == "sendrecv" and collective("nope") is None


def test_the_json_of_nccl_tests_minus_j_reads_as_its_table(tmp_path):
    """nccl-tests' -J FILE (JSON format 3): the records, the devices and the command line."""
    import json

    def rec(size, t, per_iter=None):
        bw = size / t / 1e3
        r = {"size": size, "count": size // 4, "type": "float", "redop": "sum", "root": "    -1",
             "out_of_place": {"time": t, "alg_bw": bw, "bus_bw": bw * 1.75, "nwrong": 0},
             "in_place": {"time": t * 1.1, "alg_bw": bw / 1.1, "bus_bw": bw * 1.75 / 1.1, "nwrong": 0},
             "actual_iterations": 20, "experiment_name": ""}  # fmt: skip
        if per_iter:
            r["in_place_per_iter"] = per_iter
        return r

    devices = [{"rank": r, "group": 0, "pid": 10 + r, "hostname": f"n{r // 4}", "device": r % 4} for r in range(8)]
    doc = {"version": 3, "args": ["/opt/nccl-tests/build/all_reduce_perf", "-b", "1M"], "nccl_version": 2,
           "config": {"iterations": 20, "devices": devices},
           "results": [rec(MiB, 40.0), rec(64 * MiB, 700.0, {"min_us": 760, "max_us": 900, "p99_us": 850})],
           }  # fmt: skip
    p = tmp_path / "run.json"
    p.write_text(json.dumps(doc))
    assert build.kind_of(str(p)) == "nccl-tests"
    (t,) = nccl_tests.read_tables(str(p))
    assert (t.collective.name, t.world_size, t.hosts, t.params) == ("all_reduce", 8, ["n0", "n1"], {"iters": 20})
    d, _ = build.build_profile([str(p)], build.Options(), _no_stats)
    (big,) = [c for c in d["ops"]["allreduce"] if c["bytes"] == 64 * MiB]
    assert big["sum_ns"] / big["count"] == pytest.approx(770e3) and big["min_ns"] >= 760e3 and big["max_ns"] <= 900e3
    doc["results"][0]["out_of_place"]["time"] = "fast"
    p.write_text(json.dumps(doc))
    with pytest.raises(nccl_tests.NcclTestsError, match=r"run\.json: results\[0\]: field out_of_place\.time is 'fast'"):
        nccl_tests.read_tables(str(p))
