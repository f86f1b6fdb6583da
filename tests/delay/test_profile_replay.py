"""Latency profiles (docs/profile.md): per-size telemetry, `python -m delaycomm profile`, and
DELAYCOMM_DELAY=profile:FILE drawing each call's delay from its (op, size class). Real ranks, real Gloo."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
from datetime import timedelta

import pytest

from tests.harness import run_cli, run_procs

BASE = 1.02


def _bucket(ns: float) -> int:
    return math.floor(math.log(ns) / math.log(BASE))


def _class(ns: float, nbytes: int, count: int = 100) -> dict:
    """A size class whose every call took ~ns (one histogram bucket)."""
    return {"bytes": nbytes, "count": count, "zeros": 0, "min_ns": ns, "max_ns": ns * 1.019,
            "buckets": [[_bucket(ns), count]]}  # fmt: skip


def _profile(ops: dict) -> dict:
    return {
        "format": "delaycomm-profile",
        "version": 1,
        "histogram": {"base": BASE, "unit": "ns"},
        "metadata": {"world_size": 2},
        "ops": ops,
    }


def _write(path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture
def two_sizes(tmp_path):
    """allreduce: 1 KiB ~2 ms, 64 KiB ~8 ms; broadcast: 1 KiB ~6 ms."""
    doc = _profile(
        {"allreduce": [_class(2e6, 1024), _class(8e6, 65536)], "broadcast": [_class(6e6, 1024)]},
    )
    return _write(tmp_path / "p.json", doc), doc


def test_each_call_draws_from_its_op_and_size_class_interpolating_between_classes(two_sizes):
    from delaycomm import _C

    path, _ = two_sizes
    s = _C.DelaySampler(f"profile:{path}")

    def p50_ms(op, nbytes):
        return s.quantile(0.5, op=op, nbytes=nbytes) * 1e3

    assert p50_ms("allreduce", 1024) == pytest.approx(2.0, rel=0.02)
    assert p50_ms("allreduce", 1500) == pytest.approx(2.0, rel=0.02)  # the same class, [1024, 2048)
    assert p50_ms("allreduce", 65536) == pytest.approx(8.0, rel=0.02)
    # Classes between: geometric in the latency, linear in log2 of the size (4 KiB is 1/3 of the way).
    assert p50_ms("allreduce", 4096) == pytest.approx(2.0 * 4.0 ** (2 / 6), rel=0.02)
    assert p50_ms("allreduce", 8) == pytest.approx(2.0, rel=0.02)  # below the smallest class: the smallest
    assert p50_ms("allreduce", 1 << 30) == pytest.approx(8.0, rel=0.02)  # above the largest: the largest
    assert p50_ms("broadcast", 1 << 20) == pytest.approx(6.0, rel=0.02)
    # An op the profile lacks draws from the profile's ops of its kind, nearest in size: reduce from allreduce
    # (a reduction), scatter from broadcast; barrier, whose kind the profile lacks, from every op pooled per size
    # class (half 2 ms, half 6 ms at 1 KiB).
    for q in (0.25, 0.75):
        assert s.quantile(q, op="reduce", nbytes=1024) * 1e3 == pytest.approx(2.0, rel=0.02)
        assert s.quantile(q, op="scatter", nbytes=1024) * 1e3 == pytest.approx(6.0, rel=0.02)
    assert s.quantile(0.5, op="reduce", nbytes=65536) * 1e3 == pytest.approx(8.0, rel=0.02)
    assert s.quantile(0.25, op="barrier", nbytes=1024) * 1e3 == pytest.approx(2.0, rel=0.02)
    assert s.quantile(0.75, op="barrier", nbytes=1024) * 1e3 == pytest.approx(6.0, rel=0.02)
    # The schedule draws the same per (op, size): counter-based, so any rank can compute any rank's.
    sched = _C.DelaySchedule(f"profile:{path}", 1.0, seed=7)
    d = [sched.delay_ns(1, 0, seq, op="allreduce", nbytes=65536) for seq in range(200)]
    assert d == [sched.delay_ns(1, 0, seq, op="allreduce", nbytes=65536) for seq in range(200)]
    assert all(7.9e6 < x < 8.2e6 for x in d)


def _mutate(doc, path, value):
    *head, last = path
    target = doc
    for k in head:
        target = target[k]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value


@pytest.mark.parametrize(
    "where, value, message",
    [
        (("version",), 2, "field version is 2 (this delaycomm reads version 1)"),
        (("format",), "x", "field format is 'x' (expected \"delaycomm-profile\")"),
        (("histogram", "base"), 1.1, "field histogram.base is 1.100000 (expected 1.02)"),
        (("ops", "allreduce", 1, "bytes"), 3000, "field ops.allreduce[1].bytes is 3000 (expected 0 or a power"),
        (("ops", "allreduce", 0, "count"), 99, "field ops.allreduce[0].count is 99 but zeros and buckets hold 100"),
        (("ops", "allreduce", 1, "buckets", 0, 0), -1, "field ops.allreduce[1].buckets[0][0] is -1.000000"),
        (("ops", "allreduce", 0, "min_ns"), KeyError, "field ops.allreduce[0].min_ns is missing"),
        (("ops", "allreduce", 0, "min_ns"), "1ms", "field ops.allreduce[0].min_ns is a string (expected a number"),
        (("ops", "allreduce"), [], "field ops.allreduce is an array that is empty"),
        (("metadata",), KeyError, "field metadata is missing (expected an object)"),
    ],
)
def test_a_bad_profile_is_an_error_naming_the_field(tmp_path, two_sizes, where, value, message, monkeypatch):
    from delaycomm import _C

    _, good = two_sizes
    doc = copy.deepcopy(good)
    _mutate(doc, where, value)
    _write(tmp_path / "bad.json", doc)
    # A relative path: the message shortens a value over 80 characters to its ends, and pytest's temporary paths
    # reach that under pytest-xdist (docs/profile.md shows the errors).
    monkeypatch.chdir(tmp_path)
    path = "bad.json"
    with pytest.raises(ValueError) as e:
        _C.parse_delay_spec(f"profile:{path}")
    assert f"profile file '{path}' {message}" in str(e.value)


def test_a_bad_profile_through_the_option_and_not_json(tmp_path, two_sizes):
    import delaycomm

    _, good = two_sizes
    doc = copy.deepcopy(good)
    doc["ops"]["sendrecv"] = doc["ops"].pop("broadcast")
    path = _write(tmp_path / "bad.json", doc)
    with pytest.raises(ValueError) as e:
        delaycomm.resolve(delaycomm.DelayConfig(delay=f"profile:{path}"))
    assert "option 'delay'" in str(e.value)
    assert "field ops.sendrecv is not an op delaycomm knows" in str(e.value)
    (tmp_path / "t.json").write_text('{"format": "delaycomm-profile",\n "version": 1,, }')
    with pytest.raises(ValueError, match=r"is not JSON: line 2 column 15: expected a quoted key"):
        delaycomm.resolve(delaycomm.DelayConfig(delay=f"profile:{tmp_path / 't.json'}"))


def test_profile_is_compared_by_content_and_draws_every_call_by_default(tmp_path, two_sizes):
    import delaycomm
    from delaycomm._agree import _delay_key

    path, doc = two_sizes
    other = str(tmp_path / "copy.json")
    shutil.copy(path, other)
    assert _delay_key(f"profile:{path}")[0] == _delay_key(f"profile:{other}")[0]
    doc["ops"]["allreduce"][0]["buckets"][0][0] += 1
    changed = _write(tmp_path / "changed.json", doc)
    assert _delay_key(f"profile:{path}")[0] != _delay_key(f"profile:{changed}")[0]
    assert delaycomm.resolve(delaycomm.DelayConfig(delay=f"profile:{path}")).delay_fraction == 1.0
    assert delaycomm.resolve(delaycomm.DelayConfig(delay="const:1ms")).delay_fraction == 0.3


@pytest.mark.timeout(60)
def test_every_call_lands_in_its_size_class_whatever_the_op_and_reset_clears_them():
    import torch
    import torch.distributed as dist

    import delaycomm
    from tests.harness import run_threads

    def body(ctx):
        g = ctx.group()
        for n in (1020, 1024, 2044, 8):  # bytes: 255, 256 and 511 floats, 2 floats
            dist.all_reduce(torch.ones(n // 4), group=g)
        dist.barrier(group=g)  # 0 bytes
        buf = torch.zeros(16)  # 64 B: send/recv works have no future, they are timed when wait() returns
        if ctx.rank == 0:
            dist.send(buf, group_dst=1, group=g)
        else:
            dist.recv(buf, group_src=0, group=g)
        before = delaycomm.stats(g)["ops"]
        delaycomm.reset_stats(g)
        dist.all_reduce(torch.ones(2), group=g)
        return before, delaycomm.stats(g)["ops"]

    for rank, (before, after) in enumerate(run_threads(body, 2, timeout=50)):
        classes = {op: [(c["bytes"], c["calls"]) for c in d["by_size"]] for op, d in before.items()}
        p2p = "send" if rank == 0 else "recv"
        assert classes == {"allreduce": [(8, 1), (512, 1), (1024, 2)], "barrier": [(0, 1)], p2p: [(64, 1)]}
        h = before["allreduce"]["by_size"][2]["histogram"]
        assert (h["base"], h["unit"], h["count"]) == (1.02, "ns", 2) and h["min_ns"] > 0
        assert sum(n for _, n in h["buckets"]) + h["zeros"] == 2
        assert {op: [(c["bytes"], c["calls"]) for c in d["by_size"]] for op, d in after.items()} == {
            "allreduce": [(8, 1)]
        }


SIZES = (1024, 65536)


def _record_and_replay(rank, world, root, profile, calls):
    """Job A (exp delay) writes its stats; the same ranks then replay a hand-made profile (job B), then try a
    profile whose content differs between the ranks."""
    import torch
    import torch.distributed as dist

    import delaycomm

    out = {}

    def job(i, env):
        os.environ.update(env)
        dist.init_process_group(
            "delaycomm", init_method=f"file://{root}/rdzv{i}", rank=rank, world_size=world,
            timeout=timedelta(seconds=30),
        )  # fmt: skip

    def loop():
        tensors = {n: torch.ones(n // 4) for n in SIZES}
        for _ in range(calls):
            for n in SIZES:  # interleaved sizes
                dist.all_reduce(tensors[n], async_op=True).wait()

    job(0, {"DELAYCOMM_STATS": f"{root}/a/stats.json", "DELAYCOMM_DELAY": "const:3ms",
            "DELAYCOMM_DELAY_FRACTION": "0.5"})  # fmt: skip
    loop()
    dist.destroy_process_group()

    os.environ.pop("DELAYCOMM_DELAY_FRACTION")  # a profile's default: every call
    job(1, {"DELAYCOMM_STATS": f"{root}/b/stats.json", "DELAYCOMM_DELAY": f"profile:{profile[rank]}"})
    loop()
    out["b_stats"] = delaycomm.stats(dist.group.WORLD)
    dist.destroy_process_group()

    try:
        job(2, {"DELAYCOMM_DELAY": f"profile:{profile[2 + rank]}"})
        out["mismatch"] = None
    except ValueError as e:
        out["mismatch"] = str(e)
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_record_build_show_and_replay_a_profile(tmp_path, two_sizes):
    path, doc = two_sizes
    same = str(tmp_path / "same-content.json")
    shutil.copy(path, same)
    doc["ops"]["allreduce"][1]["buckets"][0][0] += 5
    differs = _write(tmp_path / "differs.json", doc)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    calls = 40
    res = run_procs(_record_and_replay, 2, str(tmp_path), [path, same, path, differs], calls, timeout=200)

    # 1. Job A's stats files: per op and size class, every call's caller-experienced latency, whole histogram.
    for rank in range(2):
        a = json.loads((tmp_path / "a" / f"stats.rank{rank}.json").read_text())
        by_size = a["ops"]["allreduce"]["by_size"]
        assert [c["bytes"] for c in by_size] == list(SIZES)
        for c in by_size:
            h = c["histogram"]
            assert c["calls"] == h["count"] == calls
            assert sum(n for _, n in h["buckets"]) + h["zeros"] == calls
        assert a["backends"] == ["gloo"] and a["versions"]["torch"] and a["machine"]["cpu_count"]
        # Half of each rank's calls wait 3 ms, and a call waits for the later of the two ranks: 3/4 take >= 3 ms.
        assert by_size[0]["latency"]["p50_us"] >= 3000 * 0.98

    # 2. The profile: both ranks merged; --show as a table; a PNG.
    prof = tmp_path / "prof.json"
    stats = [str(tmp_path / "a" / f"stats.rank{r}.json") for r in range(2)]
    png = tmp_path / "prof.png"
    cmd = ["profile", *stats, "-o", str(prof), "--png", str(png), "--show", str(prof)]
    r = run_cli(cmd, 120, module="delaycomm")
    assert r.returncode == 0, r.stderr
    p = json.loads(prof.read_text())
    assert (p["format"], p["version"], p["metadata"]["world_size"]) == ("delaycomm-profile", 1, 2)
    assert [c["count"] for c in p["ops"]["allreduce"]] == [2 * calls, 2 * calls]
    assert p["metadata"]["jobs"][0]["ranks"] == [0, 1]
    assert png.stat().st_size > 1000
    rows = [line.split() for line in r.stdout.splitlines() if not line.startswith("#")]
    assert [(row[0], int(row[1]), int(row[2])) for row in rows] == [("allreduce", n, 2 * calls) for n in SIZES]
    assert all(float(row[3]) >= 3000 * 0.98 for row in rows)  # p50 in us

    # 3. Job B replayed the hand-made profile with nothing but DELAYCOMM_DELAY=profile:FILE: one rank carried each
    # call (a profile's delay_carrier=one; delay_fraction 1), in match mode, so each size's experienced latency
    # follows its own class (2 ms and 8 ms). Bounds are loose: match mode subtracts this machine's own latency, an
    # estimate on a shared machine (docs/delay.md, "Match mode").
    carried = [res[rank]["b_stats"]["ops"]["allreduce"]["match"]["calls"] for rank in range(2)]
    assert sum(carried) == 2 * calls and min(carried) > 0, carried  # every call had one carrier, both ranks carried
    for rank in range(2):
        b = res[rank]["b_stats"]["ops"]["allreduce"]
        assert b["delayed_calls"] == carried[rank]
        assert b["delay"]["max_us"] <= 8000 * 1.03, b["delay"]  # never more than the largest target
        lat = {c["bytes"]: c["latency"] for c in b["by_size"]}
        assert 2000 * 0.8 <= lat[1024]["p50_us"] < 8000 * 0.8, lat  # its own class, not the 64 KiB one's
        assert lat[65536]["p50_us"] >= 8000 * 0.8, lat
    # 4. A profile whose content differs between the ranks is the same error on every rank.
    for rank in range(2):
        m = res[rank]["mismatch"]
        assert m is not None and "different values" in m and f"profile:{differs} (content" in m, m


def _stats_file(path, world, op="allreduce", nbytes=1024, ns=1e6):
    h = {"base": BASE, "unit": "ns", "count": 3, "zeros": 0, "sum_ns": 3 * ns, "min_ns": ns, "max_ns": ns,
         "buckets": [[_bucket(ns), 3]]}  # fmt: skip
    data = {"group": "0", "rank": 0, "world_size": world, "host": "h",
            "ops": {op: {"calls": 3, "by_size": [{"bytes": nbytes, "calls": 3, "histogram": h}]}}}  # fmt: skip
    path.write_text(json.dumps(data))
    return str(path)


def test_profile_command_errors_name_the_file_and_what_is_wrong(tmp_path, capsys):
    from delaycomm.__main__ import main

    out = str(tmp_path / "p.json")
    two, four = _stats_file(tmp_path / "a.json", 2), _stats_file(tmp_path / "b.json", 4)
    assert main(["profile", two, four, "-o", out]) == 2
    err = capsys.readouterr().err
    assert f"the stats files come from jobs of different world sizes (2 in {two!r}, 4 in {four!r})" in err
    (tmp_path / "x.json").write_text("[1, 2]")
    assert main(["profile", str(tmp_path / "x.json"), "-o", out]) == 2
    assert "is not delaycomm stats (expected the JSON of a DELAYCOMM_STATS file" in capsys.readouterr().err
    assert main(["profile", two]) == 2
    assert "-o PROFILE.json is required" in capsys.readouterr().err
    assert not os.path.exists(out)
    # Two jobs of one world size merge; --show reads the result back through the native loader.
    other = _stats_file(tmp_path / "c.json", 2, ns=3e6)
    assert main(["profile", two, other, "-o", out, "--show", out]) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert [(r[0], r[1], r[2]) for r in table] == [("allreduce", "1024", "6")]
    assert 1000 * 0.98 <= float(table[0][3]) <= 3000 * 1.02  # p50 between the two jobs' latencies (us)
    assert [j["ranks"] for j in json.loads(open(out).read())["metadata"]["jobs"]] == [[0], [0]]  # rank 0 twice
