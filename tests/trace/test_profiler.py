"""Every call delaycomm issues is in the caller's torch.profiler trace, whichever thread issues it, and delaycomm's
own spans are there too (docs/telemetry.md, "In a profiler trace"): a real Kineto trace of real ranks, its gloo:*
events counted against its c10d::* ops, with and without a delay, plain and under DDP + ssp:2."""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import timedelta

import pytest

from tests.harness import run_procs

pytestmark = [pytest.mark.multiproc]

_CALLS = 20


def _profiled(path, body, record_shapes=True):
    """Run ``body()`` under torch.profiler (CPU), export the trace to ``path``; return its events by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as prof:
        body()
    prof.export_chrome_trace(path)
    with open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _counts(events):
    names = Counter(e["name"] for e in events)
    return {
        "allreduce_ops": names["c10d::allreduce_"],
        "gloo_allreduce": names["gloo:all_reduce"],
        "delay_spans": names["delaycomm:delay"],
        "queued_spans": names["delaycomm:queued"],
        "stale_spans": sum(n for k, n in names.items() if k.startswith("delaycomm:stale")),
    }


def _plain(rank, world, tmp, cfg):
    import torch
    import torch.distributed as dist

    import delaycomm

    group = dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(**cfg))
    t = torch.ones(1000)

    def body():
        works = [dist.all_reduce(t, group=group, async_op=True) for _ in range(_CALLS)]
        for w in works:
            w.wait()

    events = _profiled(os.path.join(tmp, f"plain-{len(cfg)}-{rank}.json"), body)
    out = _counts(events)
    spans = [e for e in events if e["name"] == "delaycomm:delay"]
    out["delay_args"] = spans[0].get("args", {}) if spans else {}
    out["delay_durs_us"] = sorted(e["dur"] for e in spans)
    return out


def _ddp(rank, world, tmp):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import delaycomm

    cfg = delaycomm.DelayConfig(delay="const:5ms", delay_fraction=0.5, seed=1, staleness="ssp:2", step_ms=5.0)
    group = dist.new_group(backend="delaycomm", pg_options=cfg)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.0005)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)

    def body():
        for _ in range(15):
            x = torch.randn(32, 16, generator=gen)
            loss = torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()

    events = _profiled(os.path.join(tmp, f"ddp-{rank}.json"), body)
    out = _counts(events)
    out["stale_args"] = {e["name"]: e.get("args", {}) for e in events if e["name"].startswith("delaycomm:stale")}
    delaycomm.flush(group)  # outside the profile: its reductions are issued without a c10d op
    out["stale_calls"] = delaycomm.stats(group)["ops"]["allreduce"].get("stale_calls", 0)
    return out


def _ranks(rank, world, tmp):
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    out = {
        "none": _plain(rank, world, tmp, {}),
        "const": _plain(rank, world, tmp, {"delay": "const:5ms", "delay_fraction": 1.0}),
        "ddp": _ddp(rank, world, tmp),
    }
    for group in list(dist.distributed_c10d._world.pg_map):  # destroying a traced group writes its timeline
        if group is not dist.group.WORLD:
            dist.destroy_process_group(group)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real 2-rank job for the module: profiled, with the timeline on (DELAYCOMM_TRACE)."""
    tmp = tmp_path_factory.mktemp("trace")
    env = {"DELAYCOMM_TRACE": str(tmp / "timeline-{rank}.json")}
    return tmp, run_procs(_ranks, 2, str(tmp), timeout=110, env=env)


@pytest.mark.timeout(120)
def test_every_call_is_in_the_callers_trace(run):
    for rank, out in enumerate(run[1]):
        none, const, ddp = out["none"], out["const"], out["ddp"]
        # No delay: every op issued on the caller's thread, as Gloo alone.
        assert none["allreduce_ops"] == _CALLS and none["gloo_allreduce"] == _CALLS, (rank, none)
        assert none["delay_spans"] == 0, (rank, none)
        # Every call held back and issued by delaycomm's issuer thread: still every gloo event.
        assert const["allreduce_ops"] == _CALLS, (rank, const)
        assert const["gloo_allreduce"] == _CALLS, f"rank {rank}: {const['gloo_allreduce']} of {_CALLS} gloo events"
        # Each call has its delay span (or waits behind one), with its arguments (record_shapes=True).
        assert const["delay_spans"] + const["queued_spans"] == _CALLS, (rank, const)
        assert const["delay_spans"] >= 1, (rank, const)
        args = const["delay_args"]
        assert args.get("op") == "allreduce" and args.get("delay_us") == 5000, args
        assert args.get("carrier") in (0, 1) and args.get("size_class_bytes") > 0 and args.get("seq") >= 1, args
        assert const["delay_durs_us"][-1] >= 4000, const["delay_durs_us"]  # the span is the hold: >= 5 ms less slack
        # DDP + ssp:2: every gradient all-reduce in the trace, and its stale decisions marked.
        assert ddp["allreduce_ops"] > 0 and ddp["gloo_allreduce"] == ddp["allreduce_ops"], (rank, ddp)
        assert ddp["stale_spans"] > 0, (rank, ddp)
        stale = ddp["stale_args"]
        # The stream's first step cannot defer (why), then each step's own contribution is fresh or deferred k steps.
        assert "why" in stale["delaycomm:stale bsp step"], stale
        assert stale.keys() >= {"delaycomm:stale bsp step", "delaycomm:stale fresh"}, stale.keys()
        for name, args in stale.items():
            assert args["op"] == "allreduce" and args["step"] >= 0 and "landed" in args, (name, args)
            assert (args["deferred_steps"] in (1, 2)) == (name == "delaycomm:stale deferred"), (name, args)
    # const:5ms on half the calls at step_ms=5: some steps defer (the schedule is seeded: the same every run).
    assert any("delaycomm:stale deferred" in out["ddp"]["stale_args"] for out in run[1])


@pytest.mark.timeout(60)
def test_profile_counts_every_call_and_takes_the_injected_delay_out(run):
    """``delaycomm profile`` of the delayed job's own traces: every call read, none reported missing; with
    --without-injected the peers' hold is taken out of each call."""
    from delaycomm.sources import build, injected
    from delaycomm.sources.read import Options

    tmp = run[0]
    traces = [str(tmp / f"plain-2-{r}.json") for r in (0, 1)]
    for t in traces:
        assert injected.audit(t) == [], t
    kept, _ = build.build_profile(traces, Options(), lambda s: {})
    taken, report = injected.corrections(traces)
    assert report == []
    without, _ = build.build_profile(traces, Options(without_injected=True), lambda s: {})

    def calls(doc):
        return sum(c["count"] for c in doc["ops"]["allreduce"])

    assert calls(kept) == calls(without) == 2 * _CALLS
    assert all(v >= 0 for t in taken.values() for v in t.values())


@pytest.mark.timeout(60)
def test_timeline_of_each_rank_and_merged(run, tmp_path, capsys):
    """DELAYCOMM_TRACE: each rank's file is a valid Chrome trace of its calls, delays and stale decisions, and
    ``python -m delaycomm timeline`` merges them with a track (process) per rank."""
    from delaycomm import timeline
    from delaycomm.__main__ import main

    tmp = run[0]
    files = [str(tmp / f"timeline-{r}.json") for r in (0, 1)]
    for rank, path in enumerate(files):
        with open(path) as f:
            doc = json.load(f)
        assert timeline.validate(doc) == [], timeline.validate(doc)[:3]
        assert doc["otherData"]["delaycomm"]["rank"] == rank and doc["otherData"]["delaycomm"]["dropped"] == 0
        events = [e for e in doc["traceEvents"] if e["ph"] != "M"]
        calls = [e for e in events if e["cat"] == "delaycomm.call"]
        delays = [e for e in events if e["name"] == "delaycomm:delay"]
        stale = [e for e in events if e["name"].startswith("delaycomm:stale")]
        # Both plain groups' 2 x 20 all-reduces and DDP's, each from its call to its completion.
        assert sum(e["name"] == "allreduce" for e in calls) >= 2 * _CALLS + run[1][rank]["ddp"]["allreduce_ops"]
        assert all(e["args"]["ok"] for e in calls)
        # const:5ms at fraction 1: 20 holds of 5 ms drawn, each as long as the hold (at least the delay, less slack).
        five = [e for e in delays if e["args"]["delay_us"] == 5000]
        assert len(five) >= _CALLS and min(e["dur"] for e in five) >= 4000, [e["dur"] for e in five][:5]
        assert {e["args"]["carrier"] for e in five} <= {0, 1}
        assert stale and {e["ph"] for e in stale} == {"i"}
        # Overlapping calls sit on lanes of their own: no two X events of one thread overlap.
        by_tid = {}
        for e in sorted((e for e in events if e["ph"] == "X"), key=lambda e: e["ts"]):
            assert e["ts"] >= by_tid.get(e["tid"], float("-inf")) - 1e-3, e
            by_tid[e["tid"]] = e["ts"] + e["dur"]
    merged = tmp_path / "merged.json"
    png = tmp_path / "timeline.png"
    assert main(["timeline", *files, "-o", str(merged), "--png", str(png)]) == 0
    doc = json.loads(merged.read_text())
    assert timeline.validate(doc) == []
    assert {e["pid"] for e in doc["traceEvents"]} == {0, 1}
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    assert png.stat().st_size > 1000
    # Two files of one rank are refused, naming both.
    assert main(["timeline", files[0], files[0], "-o", str(merged)]) == 2
    assert f"{files[0]!r} and {files[0]!r} are both rank 0" in capsys.readouterr().err


def test_validate_finds_what_breaks_the_format():
    from delaycomm import timeline

    good = {"ph": "X", "name": "a", "pid": 0, "tid": 1, "ts": 1.0, "dur": 2.0}
    assert timeline.validate({"traceEvents": [good]}) == []
    assert timeline.validate([good]) == ["not a JSON object with a traceEvents list"]
    for bad, why in [
        ({**good, "dur": -1}, "dur >= 0"),
        ({k: v for k, v in good.items() if k != "tid"}, "missing tid"),
        ({**good, "ts": "1"}, "ts must be a number"),
        ({**good, "ph": "i", "s": "x"}, "scope"),
        ({**good, "ph": "M", "name": "thread_name", "args": {}}, "without its args"),
    ]:
        (error,) = timeline.validate({"traceEvents": [bad]})
        assert why in error, error


def _many_calls(rank, world, n):
    import torch
    import torch.distributed as dist

    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60))
    t = torch.ones(4)
    for _ in range(n):
        dist.all_reduce(t)
    dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_timeline_is_a_ring_of_the_newest_records(tmp_path):
    from delaycomm import timeline

    path = tmp_path / "ring.json"
    env = {"DELAYCOMM_TRACE": str(path), "DELAYCOMM_TRACE_EVENTS": "30"}
    run_procs(_many_calls, 1, 50, timeout=50, env=env)
    doc = json.loads(path.read_text())
    assert timeline.validate(doc) == []
    calls = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(calls) == 30 and doc["otherData"]["delaycomm"]["dropped"] == 20
    assert sorted(e["args"]["seq"] for e in calls) == list(range(21, 51))  # the newest kept


def _cuda_call_records(rank, world):
    from delaycomm import _C, timeline

    _C._trace_enable(16)
    # As CudaTimings::harvest records a call whose events completed (4 ms of GPU time), and as TimedWorkCuda does
    # one destroyed before anyone waited on it (untimed, outcome unknown) and one waited on under time_cuda=0.
    _C._trace_record_cuda_call("allreduce", 7, 1_000_000, 4_000_000, 4096, True, True)
    _C._trace_record_cuda_call("broadcast", 8, 2_000_000, 0, 64, False, None)
    _C._trace_record_cuda_call("allgather", 9, 3_000_000, 0, 64, False, False)
    with pytest.raises(RuntimeError, match="unknown op nope"):
        _C._trace_record_cuda_call("nope", 1, 0, 0, 0, True, True)
    raw = _C._trace_records()
    return raw, timeline.to_chrome(raw, rank)


@pytest.mark.timeout(30)
def test_timeline_records_a_cuda_call_as_the_cuda_path_does():
    """The record a CUDA call leaves in DELAYCOMM_TRACE (from the call time, for the GPU's time between its events,
    or untimed), and its event in the rank's file. Only its shape: the CUDA path itself runs on a GPU only."""
    from delaycomm import timeline

    ((raw, doc),) = run_procs(_cuda_call_records, 1, timeout=25)
    assert [r[0] for r in raw["records"]] == ["call"] * 3
    timed, dropped, untimed = raw["records"]
    assert timed[4:7] == (1_000_000, 4_000_000, 7) and timed[8] == (4096, 1, 1, 1, 0)
    assert dropped[8][1:4] == (-1, 1, 0) and untimed[8][1:4] == (0, 1, 0)
    assert timeline.validate(doc) == []
    calls = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert calls["allreduce"]["dur"] == 4000.0 and calls["allreduce"]["cat"] == "delaycomm.call"
    assert calls["allreduce"]["args"] == {"op": "allreduce", "seq": 7, "size_class_bytes": 4096, "ok": True,
                                          "device": "cuda", "timing": "gpu_events"}  # fmt: skip
    assert calls["broadcast"]["dur"] == 0 and calls["broadcast"]["args"]["timing"] == "untimed"
    assert calls["broadcast"]["args"]["ok"] is None and calls["allgather"]["args"]["ok"] is False
    offset = raw["epoch_offset_ns"]
    assert calls["allreduce"]["ts"] == pytest.approx((1_000_000 + offset) / 1e3)
