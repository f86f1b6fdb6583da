"""The delay spec is parsed once (docs/core.md, "Options"): a trace or profile file is read once per group creation,
and every rank replays what the ranks agreed on, whatever happens to the file afterwards. Ranks as threads over
the real Gloo and the real DelayBackend."""

from __future__ import annotations

import json
import math
import threading
from collections import Counter

import pytest

from tests.harness import run_threads

SEQS = range(1, 201)


def _profile(path, ms: float) -> str:
    """A profile whose 1 KiB all-reduces took ~ms (one bucket: every draw is in [ms, 1.019 ms])."""
    ns = ms * 1e6
    b = math.floor(math.log(ns) / math.log(1.02))
    doc = {
        "format": "delaycomm-profile",
        "version": 1,
        "histogram": {"base": 1.02, "unit": "ns"},
        "metadata": {},
        "ops": {"allreduce": [{"bytes": 1024, "count": 10, "min_ns": ns, "max_ns": ns * 1.019, "buckets": [[b, 10]]}]},
    }
    path.write_text(json.dumps(doc))
    return str(path)


def _replayed_ms(group) -> tuple[float, float]:
    """(smallest, largest) delay in ms that this rank's backend schedules for 1 KiB all-reduces, and injects."""
    import torch
    import torch.distributed as dist

    import delaycomm
    from delaycomm import _registry

    backend = _registry.backend_of(group)
    scheduled = [backend.delay_ns_for("allreduce", seq, 1024) * 1e-6 for seq in SEQS]
    for _ in range(3):
        dist.all_reduce(torch.ones(256), group=group)  # 1 KiB, each delayed (a profile delays every call)
    injected = delaycomm.stats(group)["ops"]["allreduce"]["delay"]
    return min(scheduled + [injected["min_us"] * 1e-3]), max(scheduled + [injected["max_us"] * 1e-3])


@pytest.mark.timeout(60)
def test_each_rank_replays_what_the_ranks_agreed_on_whatever_happens_to_the_file(tmp_path, monkeypatch):
    from delaycomm import _backend, _readers

    path = _profile(tmp_path / "p.json", 2.0)
    reads: Counter[str] = Counter()
    read_file = _readers.read_file

    def counted(p, *args, **kwargs):
        reads[p] += 1
        return read_file(p, *args, **kwargs)

    monkeypatch.setattr(_readers, "read_file", counted)
    # Rank 1 rewrites the profile right after the first agreement, before its backend is built (held out: its
    # backend read the file again and replayed 300 ms where rank 0 replayed 2 ms).
    agree, rewritten = _backend.agree, threading.Event()

    def agree_then_rewrite(store, rank, *args):
        generation = agree(store, rank, *args)
        if rank == 1 and not rewritten.is_set():
            _profile(tmp_path / "p.json", 20.0)
            rewritten.set()
        return generation

    monkeypatch.setattr(_backend, "agree", agree_then_rewrite)

    def body(ctx):
        # Every rank draws and injects its whole draw (not a profile's defaults, match mode and one carrier per
        # call, which tests/delay/test_replay.py covers), so what each rank drew shows in its delays.
        kw = {"delay_mode": "add", "delay_carrier": "all"}
        first = _replayed_ms(ctx.group(delay=f"profile:{path}", **kw))
        second = _replayed_ms(ctx.group(delay=f"profile:{path}", **kw))  # created after the rewrite: the new content
        return first, second

    results = run_threads(body, 2, timeout=50)
    assert rewritten.is_set()
    for rank, (first, second) in enumerate(results):
        assert 2.0 * 0.999 <= first[0] and first[1] <= 2.0 * 1.02, (rank, first)  # what both ranks agreed on
        assert 20.0 * 0.999 <= second[0] and second[1] <= 20.0 * 1.02, (rank, second)
    assert reads == {path: 4}  # once per rank and group creation


@pytest.mark.timeout(60)
def test_a_file_that_changes_between_the_ranks_reads_is_the_same_error_on_every_rank(tmp_path, monkeypatch):
    from delaycomm import _readers

    path = _profile(tmp_path / "p.json", 2.0)
    read_file, lock = _readers.read_file, threading.Lock()

    def read_then_rewrite(p, *args, **kwargs):
        with lock:  # the first rank to read gets 2 ms; the file then changes under the other one
            data = read_file(p, *args, **kwargs)
            _profile(tmp_path / "p.json", 30.0)
        return data

    monkeypatch.setattr(_readers, "read_file", read_then_rewrite)

    def body(ctx):
        try:
            ctx.group(delay=f"profile:{path}")
        except ValueError as e:
            return str(e)
        return None

    errors = run_threads(body, 2, timeout=50)
    assert errors[0] is not None and errors[1] is not None, errors
    assert errors[0].replace("-r0'", "'") == errors[1].replace("-r1'", "'"), errors  # each rank's group is named apart
    assert "the ranks give different values to options that must be the same on every rank" in errors[0]
    assert errors[0].count(f"'profile:{path} (content ") == 2, errors[0]  # each rank's content, by its digest


def test_a_config_is_parsed_once_and_its_spec_reaches_the_native_options_as_one_object(tmp_path, monkeypatch):
    from datetime import timedelta

    import delaycomm
    from delaycomm import _C, _readers
    from delaycomm._backend import _fill_delay_options

    trace = tmp_path / "t.txt"
    trace.write_text("1ms\n3ms\n")
    reads: Counter[str] = Counter()
    read_file = _readers.read_file
    monkeypatch.setattr(_readers, "read_file", lambda p, *a, **k: (reads.update([p]), read_file(p, *a, **k))[1])
    config = delaycomm.DelayConfig(delay=f"trace:{trace}")
    cfg = delaycomm.resolve(config, env={})
    native = _C.BackendOptions()
    _fill_delay_options(native, cfg, 0, timedelta(seconds=30))
    assert reads == {str(trace): 1}
    spec = native.delay.spec
    assert spec is cfg.delay.spec and spec.family == "trace" and list(spec.trace) == [0.001, 0.003]
    assert spec.digest == _C.parse_delay_spec(f"trace:{trace}")["trace_digest"]  # content, as the ranks compare it
    assert spec.quantile(0.5) == pytest.approx(0.002)
