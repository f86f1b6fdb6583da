"""The audit and the injected-delay correction of ``delaycomm profile`` on Kineto traces (sources/injected.py),
on traces written here in the profiler's format."""

from __future__ import annotations

import json

import pytest

from delaycomm.sources import build, injected
from delaycomm.sources.read import Options


def _x(name, ts, dur, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _gloo(ts, dur):
    return _x("gloo:all_reduce", ts, dur, tid=2, **{"Input Dims": [[1000]], "Input type": ["float"]})


def _write(path, events, rank):
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 2}}))
    return str(path)


def test_audit_names_the_calls_a_trace_lost(tmp_path):
    events = [_x("c10d::allreduce_", 100 * i, 5) for i in range(4)] + [_gloo(0, 50)]
    path = _write(tmp_path / "t.json", events, 0)
    (line,) = injected.audit(path)
    assert "4 c10d collective op(s) (allreduce 4) but 1 backend event(s)" in line
    assert "3 call(s) are missing from the trace" in line
    _, report = build.build_profile([path], Options(), lambda s: {})
    assert any("3 call(s) are missing" in r for r in report)


def test_without_injected_takes_the_peers_hold_out(tmp_path):
    # Call 1: rank 0 held it 5 ms (its span ends at its gloo event's start), rank 1 did not and waited in the op.
    # Call 2: nobody held it.
    r0 = [
        _x("c10d::allreduce_", 0, 5),
        _x("delaycomm:delay", 0, 5000, cat="user_annotation"),
        _gloo(5010, 1000),
        _x("c10d::allreduce_", 10000, 5),
        _gloo(10010, 800),
    ]
    r1 = [_x("c10d::allreduce_", 0, 5), _gloo(10, 6000), _x("c10d::allreduce_", 10000, 5), _gloo(10010, 900)]
    paths = [_write(tmp_path / "r0.json", r0, 0), _write(tmp_path / "r1.json", r1, 1)]
    taken, report = injected.corrections(paths)
    assert report == []
    assert sorted(taken[paths[0]].values()) == [0.0, 0.0]
    assert sorted(taken[paths[1]].values()) == [0.0, 5000.0]
    doc, _ = build.build_profile(paths, Options(without_injected=True), lambda s: {})
    (cls,) = doc["ops"]["allreduce"]
    assert cls["count"] == 4
    # The calls' own latencies: 1000, 800, 6000 - 5000 = 1000, 900 us: none above 1 ms (and 6 ms without it).
    plain, _ = build.build_profile(paths, Options(), lambda s: {})
    assert cls["max_ns"] <= 1.1e6 < plain["ops"]["allreduce"][0]["max_ns"]


def test_without_injected_on_one_rank_says_what_it_cannot_know(tmp_path):
    path = _write(tmp_path / "r0.json", [_x("c10d::allreduce_", 0, 5), _gloo(10, 6000)], 0)
    _, report = build.build_profile([path], Options(without_injected=True), lambda s: {})
    assert any("one rank's trace" in r for r in report)


@pytest.mark.parametrize("flag", ["--without-injected"])
def test_the_flag_is_on_the_command(flag):
    import argparse

    p = argparse.ArgumentParser()
    build.add_arguments(p)
    assert build.options_from(p.parse_args([flag])).without_injected


@pytest.mark.parametrize(
    "value, why",
    [
        ("/nonexistent-dir/t-{rank}.json", "the directory '/nonexistent-dir' does not exist"),
        ("t-{node}.json", "unknown placeholder(s) node"),
        ("/tmp", "a file path is expected"),
        ("t-{rank.json", "unbalanced braces"),
    ],
)
def test_a_bad_trace_path_is_refused_naming_the_option(value, why):
    from delaycomm._config import resolve

    with pytest.raises(ValueError) as info:
        resolve(env={"DELAYCOMM_TRACE": value})
    assert "for option 'trace' from the environment variable DELAYCOMM_TRACE" in str(info.value)
    assert why in str(info.value)


def test_the_rank_file_of_a_template():
    from delaycomm.timeline import file_for

    assert file_for("run/t-{rank}.json", 3, 8) == "run/t-3.json"
    assert file_for("run/t.json", 3, 8) == "run/t.rank3.json"
    assert file_for("run/t.json", 0, 1) == "run/t.json"
