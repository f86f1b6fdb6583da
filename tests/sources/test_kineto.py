"""The Kineto trace reader (docs/profile.md, "Where production latency comes from"): NCCL kernels sized from their
args or from the CPU op that launched them, Gloo's CPU events, calls of unknown size counted and reported."""

from __future__ import annotations

import gzip
import json

import pytest

from delaycomm.sources import build, kineto

F32 = 4


def kernel(name, ts, dur, corr, ext=None, **args):
    a = {"device": 0, "stream": 7, "correlation": corr, "External id": ext if ext is not None else corr, **args}
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": a}


def cpu(name, ts, dur, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur, "args": args}


def launch(ts, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": tid, "ts": ts,
            "dur": 2, "args": {"correlation": corr}}  # fmt: skip


def new_style():
    """torch >= 2.1: the kernel's args carry the collective and its size."""
    return [
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 1000, 250.0, 11,
               **{"Collective name": "allreduce", "In msg nelems": 1 << 20, "dtype": "Float", "Group size": 4}),
        kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 2000, 100.0, 12,
               **{"Collective name": "_allgather_base", "In msg nelems": 1 << 18, "dtype": "BFloat16",
                  "Group size": 4}),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 3000, 260.0, 13,
               **{"Collective name": "allreduce", "In msg nelems": 1 << 20, "dtype": "Float8_e4m3fnuz_nope"}),
    ]  # fmt: skip


def old_style():
    """An older trace: the kernel has no size; the nccl:* annotation around its launch does."""
    return [
        cpu("c10d::allreduce_", 100, 50, **{"Input Dims": [[], []], "Input type": ["TensorList", "Scalar"]}),
        cpu("record_param_comms", 105, 40),
        cpu("nccl:all_reduce", 110, 30, cat="user_annotation",
            **{"Input Dims": [[1000, 256]], "Input type": ["float"]}),
        launch(120, 501),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 130, 900.0, 501),
        cpu("nccl:all_to_all", 200, 30, cat="user_annotation",
            **{"Input Dims": [[8, 64]], "Input type": ["c10::Half"]}),
        launch(210, 502),
        kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", 220, 40.0, 502),
        # A launch with no CPU op around it: an all-reduce of unknown size, and a SendRecv of unknown op.
        launch(400, 503, tid=9),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 410, 700.0, 503),
        launch(500, 504, tid=9),
        kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", 510, 30.0, 504),
    ]  # fmt: skip


def gloo():
    return [
        cpu("gloo:all_reduce", 10, 120, tid=3, **{"Input Dims": [[2049000]], "Input type": ["float"]}),
        cpu("gloo:broadcast", 20, 30, tid=3, cat="user_annotation",
            **{"Input Dims": [[53120]], "Input type": ["float"]}),
        cpu("gloo:all_gather", 30, 40, tid=3, **{"Input Dims": [[16], [16]], "Input type": ["long int", "long int"]}),
        cpu("gloo:all_reduce", 40, 35, tid=3),  # no Input Dims: unsized
        cpu("gloo:barrier", 50, 5, tid=3),
    ]  # fmt: skip


def write(tmp_path, events, name="rank0.json", info=None, bare=False, gz=False):
    doc = events if bare else {"schemaVersion": 1, "traceEvents": events,
                               "distributedInfo": info or {"backend": "nccl", "rank": 0, "world_size": 4}}  # fmt: skip
    p = tmp_path / (name + (".gz" if gz else ""))
    data = json.dumps(doc).encode()
    p.write_bytes(gzip.compress(data) if gz else data)
    return str(p)


def sized(trace):
    return sorted((c.op, c.nbytes, c.dur_ns, c.source) for c in trace.calls if c.nbytes is not None)


def test_kernels_sized_from_their_args_and_from_the_cpu_op_around_their_launch(tmp_path):
    t = kineto.read_trace(write(tmp_path, new_style() + old_style(), gz=True))
    assert (t.rank, t.world_size, t.backend) == (0, 4, "nccl")
    assert sized(t) == [
        ("_allgather_base", (1 << 18) * 2, 100e3, "kernel args"),
        ("allreduce", 1000 * 256 * F32, 900e3, "annotation"),
        ("allreduce", (1 << 20) * F32, 250e3, "kernel args"),
        ("alltoall_base", 8 * 64 * 2, 40e3, "annotation"),
    ]
    unsized = sorted((c.op, c.dur_ns, c.source) for c in t.calls if c.nbytes is None)
    assert unsized == [("allreduce", 260e3, "kernel args"), ("allreduce", 700e3, "kernel name")]
    assert t.unattributed == {"ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t": 1}
    assert {c.group_size for c in t.calls if c.source == "kernel args"} == {4, None}


def test_the_record_param_comms_op_with_the_kernels_external_id(tmp_path):
    events = [
        cpu("record_param_comms", 5, 20, **{"External id": 77, "Collective name": "reduce_scatter_tensor_coalesced",
                                            "In msg nelems": 4096, "dtype": "Half", "Group size": 8}),
        kernel("ncclDevKernel_ReduceScatter_Sum_f16_RING_LL(x)", 30, 12.5, 900, ext=77),
    ]  # fmt: skip
    (c,) = kineto.read_trace(write(tmp_path, events)).calls
    assert (c.op, c.nbytes, c.group_size, c.source) == (
        "reduce_scatter_tensor_coalesced",
        8192,
        8,
        "record_param_comms",
    )


def test_gloo_events_and_a_bare_event_list(tmp_path):
    t = kineto.read_trace(write(tmp_path, gloo(), bare=True))
    assert t.world_size is None
    assert sized(t) == [
        ("allgather", 16 * 8 * 2, 40e3, "gloo event"),
        ("allreduce", 2049000 * F32, 120e3, "gloo event"),
        ("barrier", 0, 5e3, "gloo event"),
        ("broadcast", 53120 * F32, 30e3, "gloo event"),
    ]
    assert [(c.op, c.why_unsized) for c in t.calls if c.nbytes is None] == [
        ("allreduce", "the gloo:all_reduce event has no tensor Input Dims/Input type")
    ]


def test_a_profile_of_traces_keeps_the_durations_and_reports_calls_of_unknown_size(tmp_path):
    a = write(tmp_path, new_style() + old_style(), "rank0.json")
    b = write(tmp_path, new_style(), "rank1.json", info={"backend": "nccl", "rank": 1, "world_size": 4})
    doc, notes = build.build_profile([a, b], build.Options(), None)
    (ar,) = [c for c in doc["ops"]["allreduce"] if c["bytes"] == 1 << 22]
    assert (ar["count"], ar["sum_ns"], ar["min_ns"], ar["max_ns"]) == (2, 500e3, 250e3, 250e3)
    (ar1,) = [c for c in doc["ops"]["allreduce"] if c["bytes"] == 1 << 19]  # 1000 x 256 floats: class 512 KiB
    assert (ar1["count"], ar1["sum_ns"]) == (1, 900e3)
    u = doc["metadata"]["unsized"]["allreduce"]
    assert (u["calls"], u["histogram"]["count"], u["histogram"]["sum_ns"]) == (3, 3, 260e3 * 2 + 700e3)
    assert "bytes" not in u["histogram"]
    assert any("3 allreduce call(s) of unknown size" in n for n in notes)
    assert any("1 ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t kernel(s) of no op" in n for n in notes)
    assert doc["metadata"]["world_size"] == 4 and doc["metadata"]["backends"] == ["nccl"]


def test_traces_that_cannot_be_read_are_errors_naming_the_file(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [')
    with pytest.raises(kineto.KinetoError, match=r"trace '.*t\.json' is not JSON"):
        kineto.read_trace(str(p))
    p.write_text('{"schemaVersion": 1, "events": []}')
    with pytest.raises(kineto.KinetoError, match=r"is not a PyTorch profiler trace"):
        kineto.read_trace(str(p))
    empty = write(tmp_path, [cpu("gloo:unknown_thing", 1, 2)], "u.json")
    with pytest.raises(build.SourceError, match=r"hold no call of known size"):
        build.build_profile([empty], build.Options(), None)
