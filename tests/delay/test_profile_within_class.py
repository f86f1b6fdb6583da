"""The draw within a size class (docs/profile.md, "Replay"): a profile's classes may say the size their latencies
were measured at (``size_bytes``); a call then draws by its own size, continuous in log2 of it, exactly its
class at that size. Profiles without sizes draw as before. The native sampler, on hand-made profiles, and a replay
by real groups (ranks as threads)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from delaycomm import _C, _ops, profile

BASE = 1.02
QS = (0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)


def _cls(nbytes, ns, size=None, n=1000, spread=1.1):
    """A class of ``n`` calls spread over [ns / spread, ns * spread] (a few buckets), at ``size`` when given."""
    lo, hi = int(math.log(ns / spread) / math.log(BASE)), int(math.log(ns * spread) / math.log(BASE))
    idx = list(range(lo, hi + 1))[: max(1, n // 10)]
    counts = [n // len(idx)] * len(idx)
    counts[len(idx) // 2] += n - sum(counts)
    e = {"bytes": nbytes, "count": n, "zeros": 0, "min_ns": ns / spread, "max_ns": ns * spread,
         "buckets": [[i, c] for i, c in zip(idx, counts)]}  # fmt: skip
    if size is not None:
        e["size_bytes"] = size
    return e


def _doc(ops):
    return {"format": "delaycomm-profile", "version": 1, "histogram": {"base": BASE, "unit": "ns"},
            "metadata": {}, "ops": ops}  # fmt: skip


def _q(p, q, nbytes, op="allreduce"):
    return p.quantile(q, op=op, nbytes=nbytes)


def _alone(entry, op="allreduce"):
    """The class as a profile of its own, without its size: its own distribution at every size."""
    return profile.check(_doc({op: [{k: v for k, v in entry.items() if k != "size_bytes"}]}))


# Bandwidth-bound: 100 us at 512 KiB, doubling with the size; the 2 MiB class measured at 3 MiB.
KiB, MiB = 1 << 10, 1 << 20
BW = [_cls(512 * KiB, 100e3, 512 * KiB), _cls(MiB, 200e3, MiB), _cls(2 * MiB, 600e3, 3 * MiB)]


def test_a_call_at_a_classs_size_draws_that_class_exactly_and_the_spec_shows_it(tmp_path):
    p = profile.check(_doc({"allreduce": BW}))
    for e in BW:
        alone = _alone(e)
        assert [_q(p, q, e["size_bytes"]) for q in QS] == [_q(alone, q, e["bytes"]) for q in QS]
    info = {c["bytes"]: c["size_bytes"] for c in p.class_info()}
    assert info == {512 * KiB: 512 * KiB, MiB: MiB, 2 * MiB: 3 * MiB}
    # The replay's parsed spec (what DELAYCOMM_DELAY=profile:FILE draws from) draws the same.
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_doc({"allreduce": BW})))
    _, spec = profile.load(str(path))
    for nbytes in (700 * KiB, MiB, 5 * MiB // 2, 3 * MiB, 7 * MiB // 2):
        assert spec.quantile(0.5, op="allreduce", nbytes=nbytes) == _q(p, 0.5, nbytes)
    assert spec.quantile(0.5, op="allreduce", nbytes=5 * MiB // 2) != spec.quantile(0.5, "allreduce", nbytes=2 * MiB)


def test_the_top_of_a_bandwidth_bound_class_draws_about_twice_its_bottom_moving_smoothly_between_sizes():
    p = profile.check(_doc({"allreduce": BW}))
    for q in (0.1, 0.5, 0.9):
        lo, hi = _q(p, q, 512 * KiB), _q(p, q, MiB)
        top = _q(p, q, MiB - 2 * KiB)  # the top of the 512 KiB class (not within 0.1% of 1 MiB)
        assert top / lo == pytest.approx(hi / lo, rel=0.01) and hi / lo == pytest.approx(2.0, rel=0.03)
        # Between two classes' sizes: geometric in the latency, linear in log2 of the size.
        for b in (600 * KiB, 768 * KiB, 1000 * KiB):
            w = math.log2(b / (512 * KiB))
            assert _q(p, q, b) == pytest.approx(math.exp((1 - w) * math.log(lo) + w * math.log(hi)), rel=1e-12)
        # The 2 MiB class was measured at 3 MiB: a 2 MiB call draws between 1 MiB and 3 MiB (log2 1.5 of the way).
        w = math.log2(2) / math.log2(3)
        want = math.exp((1 - w) * math.log(hi) + w * math.log(_q(p, q, 3 * MiB)))
        assert _q(p, q, 2 * MiB) == pytest.approx(want, rel=1e-12)
    sizes = np.unique(np.geomspace(300 * KiB, 5 * MiB, 400).astype(np.int64))
    draws = np.array([_q(p, 0.5, int(b)) for b in sizes])
    assert (np.diff(draws) >= 0).all()  # increasing with the size, no jump at a class boundary
    jumps = draws[1:] / draws[:-1] - 1
    assert jumps.max() < 0.02
    # A size within 0.1% under a power of two draws as that power (nccl-tests' rounding): 1 MiB - 1 KiB is 1 MiB.
    assert _q(p, 0.5, MiB - KiB) == _q(p, 0.5, MiB)


def test_past_the_ops_first_and_last_sizes_the_end_class_is_scaled_at_most_linearly_up_to_its_edge():
    p = profile.check(_doc({"allreduce": BW}))
    top, at = _q(p, 0.5, 3 * MiB), 3 * MiB
    # The last segment (1 MiB at 200 us -> 3 MiB at 600 us) has slope 1: linear in the size up to the class's edge.
    assert _q(p, 0.5, 7 * MiB // 2) == pytest.approx(top * 7 / 6, rel=0.01)
    edge = _q(p, 0.5, 4 * MiB - 8 * KiB)  # the last size of the class (4 MiB - 4 KiB is 4 MiB: snapped)
    assert edge == pytest.approx(top * (4 * MiB - 8 * KiB) / at, rel=0.01)
    assert _q(p, 0.5, 4 * MiB) == pytest.approx(top * 4 / 3, rel=0.002)  # beyond the edge: as at the edge
    assert _q(p, 0.5, 1 << 40) == _q(p, 0.5, 4 * MiB)
    # Below the first size: its class has no room below (measured at its smallest size): as measured.
    assert _q(p, 0.5, 100 * KiB) == _q(p, 0.5, 0) == _q(p, 0.5, 512 * KiB)
    # A slope above 1 (4x per doubling) is clipped to linear; a latency falling with the size to flat.
    steep = profile.check(_doc({"allreduce": [_cls(MiB, 100e3, MiB), _cls(2 * MiB, 400e3, 2 * MiB)]}))
    assert _q(steep, 0.5, 3 * MiB) == pytest.approx(_q(steep, 0.5, 2 * MiB) * 1.5, rel=1e-9)
    falling = profile.check(_doc({"allreduce": [_cls(MiB, 300e3, 1536 * KiB), _cls(2 * MiB, 200e3, 2 * MiB)]}))
    assert _q(falling, 0.5, 3 * MiB) == _q(falling, 0.5, 2 * MiB)
    assert _q(falling, 0.5, MiB) == _q(falling, 0.5, 1536 * KiB)
    # One class: nothing to take a slope from: its distribution at every size.
    one = profile.check(_doc({"allreduce": [_cls(MiB, 100e3, 1536 * KiB)]}))
    assert {_q(one, 0.5, b) for b in (1, MiB, 1536 * KiB, 2 * MiB - 1, 1 << 30)} == {_q(one, 0.5, MiB)}


def test_latency_bound_sizes_stay_flat():
    # 20 us at every size from 8 B to 64 KiB (each class at its own size): a call anywhere draws 20 us.
    flat = [_cls(1 << k, 20e3, (1 << k) + (1 << k) // 3) for k in range(3, 17)]
    p = profile.check(_doc({"allreduce": flat}))
    want = _q(p, 0.5, 8)
    for b in (8, 9, 15, 1000, 1500, 2047, 40000, 65535, 80000, 131000):
        assert _q(p, 0.5, b) == pytest.approx(want, rel=1e-12)


def _old_rule(p_alone, classes, q, nbytes):
    """The draw of a profile without sizes, as it always was: the call's class (a size within 0.1% under a power of
    two is that power's), else geometric interpolation between the nearest classes by class index, else the
    nearest class; rare classes (< 16 calls) count as absent."""
    from delaycomm._schema import draw_class_bytes

    def index(b):
        return 0 if b == 0 else b.bit_length()

    full = sorted((index(c["bytes"]), c["bytes"]) for c in classes if c["count"] >= 16)
    c = index(draw_class_bytes(nbytes))
    below = [x for x in full if x[0] <= c]
    above = [x for x in full if x[0] >= c]
    if below and below[-1][0] == c:
        return p_alone[below[-1][1]](q)
    if not below:
        return p_alone[above[0][1]](q)
    if not above:
        return p_alone[below[-1][1]](q)
    (i, a), (j, b) = below[-1], above[0]
    w = (c - i) / (j - i)
    return math.exp((1 - w) * math.log(p_alone[a](q)) + w * math.log(p_alone[b](q)))


def test_a_profile_without_sizes_draws_as_it_always_did():
    from delaycomm._schema import draw_class_bytes

    classes = [_cls(0, 5e3), _cls(64, 10e3), _cls(4 * KiB, 30e3, n=10), _cls(64 * KiB, 40e3), _cls(MiB, 200e3)]
    p = profile.check(_doc({"allreduce": classes}))
    assert all(c["size_bytes"] is None for c in p.class_info())
    natives = {c["bytes"]: _alone(c) for c in classes}
    alone = {b: (lambda q, a=a, b=b: _q(a, q, b)) for b, a in natives.items()}
    for b in (0, 1, 8, 64, 100, 127, 1000, 4096, 6000, 65535, 65536, 100000, 1048575, MiB, 3 * MiB, 1 << 33):
        for q in (0.1, 0.5, 0.9):
            assert _q(p, q, b) == pytest.approx(_old_rule(alone, classes, q, b), rel=1e-12), (b, q)
            assert _q(p, q, b) == _q(p, q, draw_class_bytes(b))  # flat within a class
    # The content digest (what the ranks agree on) of a profile without sizes is what it was: the class tuples
    # without a size give the same digest as with none.
    kind = _ops.BY_NAME["allreduce"].kind
    tuples = [(kind, c["bytes"], c["count"], 0, c["min_ns"], c["max_ns"], np.array([i for i, _ in c["buckets"]]),
               np.array([n for _, n in c["buckets"]], dtype=np.uint64)) for c in classes]  # fmt: skip
    assert _C.DelayProfile(tuples).digest == _C.DelayProfile([t + (None,) for t in tuples]).digest == p.digest
    sized = profile.check(_doc({"allreduce": [dict(c, size_bytes=c["bytes"]) for c in classes]}))
    assert sized.digest != p.digest


def test_a_class_without_a_size_is_drawn_for_its_whole_class_among_sized_ones():
    # Stats of an older delaycomm merged with newer ones: the 1 MiB class lacks a size.
    mixed = [_cls(512 * KiB, 100e3, 512 * KiB), _cls(MiB, 200e3), _cls(4 * MiB, 800e3, 4 * MiB)]
    p = profile.check(_doc({"allreduce": mixed}))
    plateau = _q(p, 0.5, MiB)
    assert {_q(p, 0.5, b) for b in (MiB, 1536 * KiB, 2 * MiB - 4 * KiB)} == {plateau}
    assert _q(p, 0.5, 512 * KiB) < _q(p, 0.5, 768 * KiB) < plateau < _q(p, 0.5, 3 * MiB) < _q(p, 0.5, 4 * MiB)


def test_rare_classes_and_ops_the_profile_lacks_keep_their_rules():
    classes = [_cls(MiB, 200e3, MiB), _cls(2 * MiB, 5e3, 3 * MiB, n=3), _cls(4 * MiB, 800e3, 4 * MiB)]
    p = profile.check(_doc({"allreduce": classes}))
    # The rare class (3 calls) is not a distribution: its sizes draw between the full classes' sizes.
    w = math.log2(3) / 2
    want = math.exp((1 - w) * math.log(_q(p, 0.5, MiB)) + w * math.log(_q(p, 0.5, 4 * MiB)))
    assert _q(p, 0.5, 3 * MiB) == pytest.approx(want, rel=1e-12)
    assert [c["rare"] for c in p.class_info()] == [False, True, False]
    # An op the profile lacks draws from its kind's ops pooled per class, with their sizes: reduce at allreduce's.
    both = profile.check(_doc({"allreduce": BW, "reduce_scatter": [_cls(MiB, 200e3, 1536 * KiB)]}))
    assert _q(both, 0.5, 3 * MiB, op="reduce") == _q(both, 0.5, 3 * MiB)  # only allreduce has that class
    # The 1 MiB class pools allreduce's (at 1 MiB) and reduce_scatter's (at 1.5 MiB): at 1.25 MiB, exactly it.
    pooled = profile.check(_doc({"reduce": [dict(_cls(MiB, 200e3), size_bytes=1280 * KiB)]}))
    family = profile.check(
        _doc({"allreduce": [_cls(MiB, 200e3, MiB)], "reduce_scatter": [_cls(MiB, 200e3, 1536 * KiB)]})
    )
    assert _q(family, 0.5, 1280 * KiB, op="reduce") == _q(pooled, 0.5, 1280 * KiB, op="reduce")


@pytest.mark.parametrize(
    "nbytes, size, why",
    [
        (1024, 1022, "is 1022.000000 (expected a whole number of bytes from 1023 to 2045: a size the replay reads as "
                     "the class of 1024 bytes)"),
        (1024, 2046, "is 2046.000000 (expected a whole number of bytes from 1023 to 2045"),
        (1024, 1500.5, "is 1500.500000 (expected a whole number of bytes from 1023"),
        (1024, -1, "is -1.000000 (expected a whole number of bytes from 1023"),
        (1024, "1024", "is a string (expected a whole number of bytes from 1023"),
        (1024, True, "is a boolean (expected a whole number of bytes"),
        (1024, None, "is null (expected a whole number of bytes"),
        (1 << 30, 1 << 31, "is 2147483648.000000 (expected a whole number of bytes from 1072668083 to 2145336164"),
        (0, 8, "is 8.000000 (expected 0 (the class of 0 bytes))"),
    ],
)  # fmt: skip
def test_a_bad_size_bytes_names_the_file_and_the_field(tmp_path, nbytes, size, why):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_doc({"allreduce": [_cls(64, 1e4), dict(_cls(nbytes, 1e5), size_bytes=size)]})))
    with pytest.raises(profile.FileError) as e:
        profile.load(str(path))
    assert str(e.value).startswith(f"profile file {str(path)!r} field ops.allreduce[1].size_bytes {why}")
    # The native loader refuses what the schema check would (a size the sampler reads as another class).
    t = (_ops.BY_NAME["allreduce"].kind, 1024, 3, 0, 1.0, 2.0, np.array([1]), np.array([3], dtype=np.uint64), 2046)
    with pytest.raises(ValueError, match=r"size class of 1024 bytes of op allreduce has a size \(2046 bytes\) the "):
        _C.DelayProfile([t])


def test_a_replay_delays_a_call_at_the_top_of_a_class_as_the_next_row_and_without_sizes_as_its_bottom(tmp_path):
    """Real groups (ranks as threads) replaying a profile: the delay each call was given, per size within one class
    (add mode: the delay is the draw)."""
    import torch
    import torch.distributed as dist

    import delaycomm
    from tests.harness import run_threads

    # 2 ms at 512 KiB, 4 ms at 1 MiB: a bandwidth-bound pair of rows, each measured at its class's smallest size.
    rows = [_cls(512 * KiB, 2e6, 512 * KiB, spread=1.02), _cls(MiB, 4e6, MiB, spread=1.02)]
    sized, unsized = tmp_path / "sized.json", tmp_path / "unsized.json"
    sized.write_text(json.dumps(_doc({"allreduce": rows})))
    unsized.write_text(
        json.dumps(_doc({"allreduce": [{k: v for k, v in r.items() if k != "size_bytes"} for r in rows]}))
    )
    bottom, top = 512 * KiB // 4, (MiB - 2 * KiB) // 4  # floats: the 512 KiB class's bottom and top

    def body(ctx):
        out = {}
        for name, path in (("sized", sized), ("unsized", unsized)):
            for where, n in (("bottom", bottom), ("top", top)):
                g = ctx.group(delay=f"profile:{path}", delay_mode="add", delay_carrier="all")
                for _ in range(4):
                    dist.all_reduce(torch.ones(n), group=g)
                out[(name, where)] = delaycomm.stats(g)["ops"]["allreduce"]["delay"]
        return out

    for res in run_threads(body, 2, timeout=60):
        assert all(d["count"] == 4 for d in res.values())
        p50 = {k: d["p50_us"] for k, d in res.items()}
        assert 1900 <= p50[("sized", "bottom")] <= 2100 and 1900 <= p50[("unsized", "bottom")] <= 2100
        assert p50[("sized", "top")] / p50[("sized", "bottom")] == pytest.approx(2.0, rel=0.04)
        assert p50[("unsized", "top")] / p50[("unsized", "bottom")] == pytest.approx(1.0, rel=0.04)
