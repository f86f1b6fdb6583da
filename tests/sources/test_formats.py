"""Logs and traces as they come (docs/profile.md, "Where production latency comes from"): recognised by their
content whatever wraps them, read in every layout real logs have (sweeps appended, interleaved runs, partial rank
lines), and every bad value refused where it is: the file, the line or record, the field and what is accepted."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from delaycomm.__main__ import main
from delaycomm.sources import build, kineto, nccl_tests
from tests.sources.logs import run, time_us, write

MiB = 1 << 20
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
LOG08 = os.path.join(DATA, "nccl-tests", "08-a100-p4d-efa-allreduce-16r-2n-oldfmt.txt")


def _no_stats(paths):
    raise AssertionError(paths)


def profile(path, **opts):
    return build.build_profile([path], build.Options(**opts), _no_stats)


def one(doc, op, nbytes):
    (c,) = [c for c in doc["ops"][op] if c["bytes"] == nbytes]
    return c


@pytest.mark.parametrize(
    "before",
    [
        ["[root@host-0 nccl-tests]# mpirun -np 8 ./build/all_reduce_perf -b 1M -e 2M"],
        ["[host-0]", "+ mpirun -np 8 ./build/all_reduce_perf"],
        ["```", "> mpirun -np 8 ./build/all_reduce_perf", "```text"],
        ["[1,0]<stdout>:"],
    ],
    ids=["prompt", "host-line", "fence", "openmpi-empty"],
)
def test_a_log_is_recognised_by_its_table_whatever_comes_first(tmp_path, before):
    p = write(tmp_path, "log.txt", before + run("all_reduce", 8, [MiB, 2 * MiB]) + ["```"])
    assert build.kind_of(p) == "nccl-tests"
    doc, _ = profile(p)
    assert one(doc, "allreduce", MiB)["sum_ns"] / 1000 / 1e3 == pytest.approx(time_us("all_reduce", MiB) * 1.1, 1e-3)


@pytest.mark.parametrize(
    "prefix", ["node-01: ", "[node-01] ", "[1,3]<stdout>:", "3: "], ids=["pdsh", "tag", "ompi", "srun"]
)
def test_every_line_prefixed_by_a_launcher_reads_the_same(tmp_path, prefix):
    plain = nccl_tests.read_tables(write(tmp_path, "plain.txt", run("all_reduce", 8, [MiB, 2 * MiB], nodes=2)))
    lines = [prefix + line for line in run("all_reduce", 8, [MiB, 2 * MiB], nodes=2)]
    (t,) = nccl_tests.read_tables(write(tmp_path, "prefixed.txt", lines))
    (p,) = plain
    assert (t.collective.name, t.world_size, t.nodes, len(t.rows)) == ("all_reduce", 8, 2, 2)
    assert [r.timings["in-place"].time_us for r in t.rows] == [r.timings["in-place"].time_us for r in p.rows]


def test_an_open_mpi_tagged_log_from_its_first_tag_and_a_gzip_one(tmp_path):
    tagged = [f"[1,{i % 3}]<stdout>:{line}" for i, line in enumerate(run("all_gather", 4, [MiB]))]
    p = write(tmp_path, "tagged.txt", tagged)
    assert build.kind_of(p) == "nccl-tests"
    (t,) = nccl_tests.read_tables(p)
    assert (t.collective.name, t.world_size) == ("all_gather", 4)
    gz = tmp_path / "tagged.txt.gz"
    gz.write_bytes(gzip.compress(open(p, "rb").read()))
    assert build.kind_of(str(gz)) == "nccl-tests"
    if os.path.exists(LOG08):  # the real log from its first "[1," line on
        lines = open(LOG08).read().splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("[1,"))
        cut = write(tmp_path, "08-cut.txt", lines[first:])
        assert build.kind_of(cut) == "nccl-tests"
        (t,) = nccl_tests.read_tables(cut)
        assert (t.collective.name, t.world_size, len(t.hosts)) == ("all_reduce", 16, 2)


def test_what_is_none_of_the_sources_says_what_it_looked_like(tmp_path, capsys):
    for text, said in [
        ("[INFO] starting job\nall good\n", "it starts with '[INFO] starting job'"),
        ("[1, 2, 3] trailing\n", "which is not one JSON document"),
        ("", "an empty file"),
    ]:
        p = tmp_path / "x.txt"
        p.write_text(text)
        assert main(["profile", str(p), "-o", str(tmp_path / "o.json")]) == 2
        err = capsys.readouterr().err
        assert "is none of the sources delaycomm reads" in err and said in err, err


def test_a_sweep_appended_run_after_run_reads_every_run_pooled_per_size(tmp_path):
    lines = []
    for k in range(5):
        r = run("all_reduce", 8, [MiB, 2 * MiB])
        t = time_us("all_reduce", MiB) * 1.1
        lines += [line.replace(f"{t:7.2f}", f"{t * (1 + 0.01 * k):7.2f}") for line in r]  # 1% slower each run
    p = write(tmp_path, "sweep.txt", lines)
    doc, _ = profile(p, tail=1.0)
    c = one(doc, "allreduce", MiB)
    t = time_us("all_reduce", MiB) * 1.1
    assert c["count"] == 5000 and c["sum_ns"] / c["count"] / 1e3 == pytest.approx(t * 1.02, abs=0.01)  # pooled
    (src,) = doc["metadata"]["sources"]
    (d,) = src["tables"]
    assert (d["runs_appended"], d["rows"]) == (5, 10)
    # the cost model keeps the first 64 measurements of each (collective, size, scale): its memory stays bounded
    p = write(tmp_path, "long.txt", run("all_reduce", 8, [MiB, 2 * MiB]) * 70)
    s = build.read_source(p, build.Options())
    assert len(s.observations) == 2 * 64 and s.info["observations_not_kept"] == 2 * 6


def _interleave(a, b):
    out = []
    for x, y in zip(a, b):
        out += [x, y]
    return out


def test_two_interleaved_runs_read_as_one_table_of_their_world_size(tmp_path):
    a = run("all_reduce", 8, [MiB, 2 * MiB], starting=False)
    b = [line.replace("Pid   10", "Pid   20").replace("node0", "nodeB") for line in a]
    p = write(tmp_path, "two.txt", _interleave(a, b))
    (t,) = nccl_tests.read_tables(p)
    assert (t.collective.name, t.world_size, t.runs, len(t.rows)) == ("all_reduce", 8, 2, 4)
    # the runs one after the other, each with its header, before any row
    p = write(tmp_path, "two-b.txt", a[:15] + b[:15] + _interleave(a[15:], b[15:]))
    (t,) = nccl_tests.read_tables(p)
    assert (t.world_size, len(t.rows)) == (8, 4)
    # lines interleaved at random (two processes writing one file): a run's rank lines after the other's header
    import random

    rng = random.Random(7)
    merged, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and rng.random() < 0.5):
            merged.append(a[i])
            i += 1
        else:
            merged.append(b[j])
            j += 1
    header = next(k for k, line in enumerate(merged) if "#wrong" in line)
    assert any("Pid   20" in line for line in merged[header:])  # some of b's rank lines come after a's header
    (t,) = nccl_tests.read_tables(write(tmp_path, "two-r.txt", merged))
    assert (t.world_size, len(t.rows)) == (8, 4)
    # nccl-tests >= 2.17, with its "Collective test starting" markers
    a = run("all_reduce", 8, [MiB, 2 * MiB])
    b = [line.replace("Pid   10", "Pid   20") for line in a]
    (t,) = nccl_tests.read_tables(write(tmp_path, "two-c.txt", _interleave(a, b)))
    assert (t.collective.name, t.world_size, t.runs, len(t.rows)) == ("all_reduce", 8, 2, 4)
    # two different tests interleaved: their rows cannot be told apart
    g = [line.replace("Pid   10", "Pid   20") for line in run("all_gather", 8, [MiB, 2 * MiB])]
    with pytest.raises(nccl_tests.NcclTestsError, match=r"the output of 2 different tests interleaves here "
                       r"\(all_reduce_perf \(line 3\), all_gather_perf \(line 4\)\)"):  # fmt: skip
        nccl_tests.read_tables(write(tmp_path, "two-d.txt", _interleave(a, g)))


def test_rank_lines_of_some_ranks_fall_back_to_the_bandwidths_and_source_overrides(tmp_path):
    lines = run("all_reduce", 16, [64 * MiB, 256 * MiB], nodes=2)
    lines = [line for line in lines if "Rank" not in line or "Rank  7" in line or "Rank 15" in line]
    p = write(tmp_path, "partial.txt", lines)
    (t,) = nccl_tests.read_tables(p)
    assert (t.world_size, t.world_size_by, t.nodes, t.ranks_listed) == (16, "busbw / algbw", None, [7, 15])
    (t,) = nccl_tests.read_tables(p, source_nodes=2)
    assert t.nodes == 2
    out = str(tmp_path / "p.json")
    assert main(["profile", p, "-o", out, "--source-nodes", "2"]) == 0  # as a user gives it
    meta = json.loads(open(out).read())["metadata"]
    assert (meta["world_size"], meta["nodes"], meta["sources"][0]["tables"][0]["rank_lines_list_only"]) == (
        16,
        2,
        [7, 15],
    )
    with pytest.raises(nccl_tests.NcclTestsError, match=r"named all_reduce by .* but its columns and numbers are"):
        nccl_tests.read_tables(p, source_ranks=8)  # 8 contradicts busbw/algbw of 16
    b = run("broadcast", 6, [64 * MiB], ranks=False)
    (t,) = nccl_tests.read_tables(write(tmp_path, "b.txt", b), source_ranks=6, source_nodes=1)
    assert (t.world_size, t.world_size_by, t.nodes) == (6, "--source-ranks", 1)
    full = write(tmp_path, "full.txt", run("all_reduce", 8, [MiB]))
    with pytest.raises(nccl_tests.NcclTestsError, match=r"--source-ranks 4 but its rank lines list 8 ranks"):
        nccl_tests.read_tables(full, source_ranks=4)


def test_failed_validation_is_a_warning_naming_the_rows_and_strict_refuses(tmp_path, capsys):
    lines = run("all_reduce", 8, [MiB, 2 * MiB])
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("2097152"))
    lines[at] = lines[at][: lines[at].rindex("0")] + "3"  # in-place #wrong 3
    foot = next(i for i, line in enumerate(lines) if "Out of bounds" in line)
    lines[foot] = "# Out of bounds values : 4 FAILED"
    p = write(tmp_path, "bad.txt", lines)
    out = str(tmp_path / "p.json")
    assert main(["profile", p, "-o", out]) == 0
    err = capsys.readouterr().err
    assert (
        f"warning: nccl-tests log {p!r}: its validation failed in 2 place(s): {p}:{at + 1} (in-place #wrong 3)" in err
    )
    assert f"{p}:{foot + 1} (Out of bounds values: FAILED)" in err
    assert main(["profile", p, "-o", out, "--strict"]) == 2
    assert "--strict: nccl-tests log" in capsys.readouterr().err


@pytest.mark.parametrize(
    "bad, message",
    [
        ("8192.0", r"column 'size' is '8192.0' \(expected a whole number from 0 to 2\^63-1\)"),
        ("-8192", r"column 'size' is '-8192'"),
        ("9" * 401, r"column 'size' is '99999999999999999999\.\.\. \(401 characters\)'"),
    ],
)
def test_a_bad_size_is_refused_on_its_line(tmp_path, bad, message):
    lines = run("all_reduce", 8, [MiB, 8192])
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("8192 "))
    lines[at] = lines[at].replace("        8192", bad.rjust(12), 1)
    with pytest.raises(nccl_tests.NcclTestsError, match=rf"log\.txt:{at + 1}: {message}"):
        nccl_tests.read_tables(write(tmp_path, "log.txt", lines))


def test_a_time_beyond_a_day_is_refused_on_its_line(tmp_path):
    lines = run("all_reduce", 8, [MiB])
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("1048576"))
    t = f"{time_us('all_reduce', MiB):7.2f}"
    lines[at] = lines[at].replace(t, "1e300", 1)
    with pytest.raises(nccl_tests.NcclTestsError, match=rf":{at + 1}: column 'out-of-place time' is '1e300' "
                       r"\(expected at most 8\.64e\+10 us, a day\)"):  # fmt: skip
        nccl_tests.read_tables(write(tmp_path, "log.txt", lines))


def _minus_j(tmp_path, mutate):
    rec = {"size": MiB, "count": MiB // 4, "type": "float", "redop": "sum", "root": -1,
           "out_of_place": {"time": 40.0, "alg_bw": MiB / 40e3, "bus_bw": MiB / 40e3 * 1.75, "nwrong": 0}}  # fmt: skip
    doc = {"version": 3, "args": ["all_reduce_perf"], "results": [rec],
           "config": {"devices": [{"rank": r, "pid": 1 + r, "hostname": "n0"} for r in range(8)]}}  # fmt: skip
    mutate(doc)
    p = tmp_path / "j.json"
    p.write_text(json.dumps(doc))
    return str(p)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["config"]["devices"][0].update(pid="abc"), r"devices\[0\]\.pid is 'abc' \(expected a process id"),
        (lambda d: d["results"][0].update(size=10**400), r"results\[0\]: field 'size' is 1000000000000000000000000"),
        (lambda d: d["results"][0].update(size=-8192), r"results\[0\]: field 'size' is -8192"),
        (lambda d: d["results"][0]["out_of_place"].update(time=1e300), r"out_of_place\.time is 1e\+300"),
    ],
    ids=["string-pid", "401-digits", "negative", "1e300us"],
)
def test_minus_j_bad_values_are_refused_naming_the_record_and_field(tmp_path, mutate, message):
    p = _minus_j(tmp_path, mutate)
    with pytest.raises(build.SourceError, match=r"j\.json.*" + message):
        profile(p)


def test_deep_nesting_and_huge_integers_are_refused_without_a_traceback(tmp_path, capsys):
    huge = "9" * 5000  # more digits than Python converts
    for name, text, said in [
        ("deep.json", '{"results": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests its values too deep"),
        ("deep-trace.json", '{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests its values too deep"),
        ("huge.json", '{"results": [{"size": ' + huge + ', "in_place": {}}]}', "is not JSON that delaycomm reads"),
        ("huge-trace.json", '{"traceEvents": [], "x": ' + huge + "}", "is not JSON that delaycomm reads"),
    ]:
        p = tmp_path / name
        p.write_text(text)
        assert main(["profile", str(p), "-o", str(tmp_path / "o.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: delaycomm: profile: ") and said in err, err


def _trace(tmp_path, events, info=None):
    doc = {"schemaVersion": 1, "traceEvents": events,
           "distributedInfo": info or {"backend": "nccl", "rank": 0, "world_size": 2}}  # fmt: skip
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    return str(p)


def _annotated(name, dims, dur=50.0, corr=1, ts=1000.0, types=("float",)):
    return [
        {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 100.0,
         "args": {"Input Dims": dims, "Input type": list(types)}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts + 10, "dur": 5.0,
         "args": {"correlation": corr}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "pid": 0,
         "tid": 7, "ts": ts + 20, "dur": dur, "args": {"correlation": corr}},
    ]  # fmt: skip


def test_every_collective_name_pytorch_writes_is_read(tmp_path):
    events = []
    names = ["nccl:_all_gather_base", "nccl:send 0->1", "nccl:recv 1<-0", "nccl:all_gather_into_tensor_coalesced",
             "nccl:reduce_scatter_tensor_coalesced", "nccl:_reduce_scatter_base", "nccl:all_to_all"]  # fmt: skip
    for i, name in enumerate(names):
        events += _annotated(name, [[256]], corr=i + 1, ts=1000.0 * (i + 1))
    tr = kineto.read_trace(_trace(tmp_path, events))
    got = [(c.op, c.nbytes, c.source) for c in tr.calls]
    want_ops = ["_allgather_base", "send", "recv", "allgather_into_tensor_coalesced",
                "reduce_scatter_tensor_coalesced", "_reduce_scatter_base", "alltoall_base"]  # fmt: skip
    assert got == [(op, 1024, "annotation") for op in want_ops] and not tr.unattributed
    from delaycomm.sources.ops import op_of_trace_name

    for name, op in [("gloo:recvAnySource", "recv_anysource"), ("gloo:sparse_all_reduce", "allreduce"),
                     ("gloo:all_to_all", "alltoall_base"), ("gloo:barrier", "barrier")]:  # fmt: skip
        assert op_of_trace_name(name) == op


def test_unsized_calls_are_counted_named_and_written_as_the_ops_pooled_distribution(tmp_path):
    events = []
    for i in range(20):
        events += _annotated("nccl:all_reduce", [], dur=40.0 + i, corr=i + 1, ts=1000.0 * (i + 1), types=())
        events[-1]["name"] = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    doc, notes = profile(_trace(tmp_path, events))
    (c,) = doc["ops"]["allreduce"]
    assert (c["bytes"], c["count"]) == (0, 20) and c["sum_ns"] == pytest.approx(sum(40e3 + i * 1e3 for i in range(20)))
    assert doc["metadata"]["unsized"]["allreduce"]["calls"] == 20
    (note,) = [n for n in notes if "unknown size" in n]
    assert note.startswith("20 allreduce call(s) of unknown size: written as the op's pooled distribution")
    assert "record_shapes=True" in note
    from delaycomm import _C
    from delaycomm import profile as profiles

    out = str(tmp_path / "p.json")
    profiles.write(doc, out)  # the native loader checks it
    s = _C.DelaySampler(f"profile:{out}")
    for nbytes in (4, 1 << 20, 1 << 30):  # one class, drawn for every size: its median is the calls' (40..59 us)
        assert 40e-6 <= s.quantile(0.5, op="allreduce", nbytes=nbytes) <= 60e-6


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda ev, info: ev[0]["args"].update({"Input Dims": [[-1, 4]]}),
         r"traceEvents\[2\] .*: args\.Input Dims is \[\[-1, 4\]\] \(expected sizes that are whole numbers >= 0\)"),
        (lambda ev, info: ev[2].update(dur=float("inf")), r"traceEvents\[2\] .*: dur is inf \(expected a finite"),
        (lambda ev, info: ev[2].update(dur=1e300), r"dur is 1e\+300 \(expected 0 to 8\.64e\+10 us, a day\)"),
        (lambda ev, info: info.update(world_size=-5), r"distributedInfo\.world_size is -5 \(expected a whole number"),
        (lambda ev, info: info.update(world_size=1e30), r"distributedInfo\.world_size is 1e\+30"),
        (lambda ev, info: ev[2]["args"].update({"Collective name": "allreduce", "In msg nelems": -4, "dtype": "Float"}),
         r"args\.In msg nelems is -4 \(expected a whole number of elements >= 0\)"),
    ],
    ids=["negative-dims", "infinite-dur", "1e300-dur", "world-5", "world-1e30", "negative-nelems"],
)  # fmt: skip
def test_a_bad_value_in_a_trace_is_refused_naming_the_event_and_field(tmp_path, edit, message):
    events = _annotated("nccl:all_reduce", [[256]])
    info = {"backend": "nccl", "rank": 0, "world_size": 2}
    edit(events, info)
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events, "distributedInfo": info}).replace("1e+300", "1e300"))
    with pytest.raises(build.SourceError, match=r"trace .*t\.json.*" + message):
        profile(str(p))


def test_a_gzip_bomb_stops_at_the_limit_and_a_cut_gzip_is_refused(tmp_path, monkeypatch):
    from delaycomm.sources import files

    monkeypatch.setattr(files, "MAX_SOURCE_BYTES", 4 << 20)
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (16 << 20) + b"]}"))
    with pytest.raises(build.SourceError, match=r"decompresses to more than the limit of 4 MiB"):
        profile(str(p))
    good = gzip.compress(b'{"traceEvents": []}')
    p.write_bytes(good[:-6])
    with pytest.raises(build.SourceError, match=r"not valid gzip \(it ends before its last member does\)"):
        profile(str(p))
    p.write_bytes(good + b"\0\0junk")
    with pytest.raises(build.SourceError, match=r"not valid gzip \(bytes after its last member\)"):
        profile(str(p))
    # members one after another (cat a.gz b.gz), and zero padding after the last, read as gzip itself reads them
    text = "\n".join(run("all_reduce", 8, [MiB, 2 * MiB])) + "\n"
    log = tmp_path / "log.gz"
    log.write_bytes(gzip.compress(text[:500].encode()) + gzip.compress(text[500:].encode()) + b"\0" * 512)
    (t,) = nccl_tests.read_tables(str(log))
    assert (t.collective.name, len(t.rows)) == ("all_reduce", 2)
