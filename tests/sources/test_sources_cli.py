"""``python -m delaycomm profile`` on nccl-tests logs and traces, as users run it: the file's kind read from its
content, the errors (exit status 2, ``error:`` and the file), and a test job replaying a cluster's log."""

from __future__ import annotations

import json
import os

import pytest

from delaycomm.__main__ import main
from tests.harness import run_threads
from tests.sources.logs import run, write

MiB = 1 << 20
LOG02 = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "nccl-tests",
                     "02-h200-gke-allreduce-2r-2n.txt")  # fmt: skip


def cluster_log(tmp_path) -> str:
    """A 2-rank all_reduce log: the public one when ../shared/data has it, else one written here."""
    if os.path.exists(LOG02):
        return LOG02
    return write(tmp_path, "allreduce.log", run("all_reduce", 2, [1024, MiB], nodes=2))


def test_a_log_a_trace_and_stats_are_told_apart_by_content_and_errors_name_the_file(tmp_path, capsys):
    log = cluster_log(tmp_path)
    out = str(tmp_path / "p.json")
    assert main(["profile", log, "-o", out, "--tail", "2"]) == 0
    doc = json.loads(open(out).read())
    assert doc["metadata"]["sources"][0]["kind"] == "nccl-tests" and doc["metadata"]["spread"]["p99_over_p50"] == 2
    assert "# wrote" in capsys.readouterr().err

    ambiguous = write(tmp_path, "ag.log", run("all_gather", 8, [64 * MiB], starting=False))
    assert main(["profile", ambiguous, "-o", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: delaycomm: profile: nccl-tests log ") and "ag.log:" in err and "--op NAME" in err
    assert main(["profile", ambiguous, "-o", out, "--op", "all_gather_into_tensor"]) == 0
    capsys.readouterr()

    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    assert main(["profile", str(text), "-o", out]) == 2
    err = capsys.readouterr().err
    assert "notes.txt' is none of the sources delaycomm reads: it starts with 'hello'. Expected delaycomm stats" in err
    assert main(["profile", log, "-o", out, "--ranks", "16"]) == 2
    assert "--ranks N and --nodes M go together" in capsys.readouterr().err
    assert main(["profile", log, "-o", out, "--ranks", "16", "--nodes", "3"]) == 2
    assert "16 ranks on 3 nodes" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse: a p99/p50 below 1
        main(["profile", log, "-o", out, "--tail", "0.5"])
    assert e.value.code == 2 and "argument --tail: 0.5 is out of range" in capsys.readouterr().err
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"group": "0", "rank": 0, "world_size": 2, "ops": {}}))
    assert main(["profile", str(stats), "-o", out, "--op", "all_reduce"]) == 2
    assert "apply to nccl-tests logs and Kineto traces" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_test_job_replays_its_clusters_nccl_tests_log(tmp_path):
    """The README's path: the cluster's nccl-tests log -> profile -> DELAYCOMM_DELAY=profile:FILE in a 2-rank job
    that sets nothing else. A profile replays by default in match mode with one carrier per call: every call is
    carried by exactly one rank, drawn from its class (the log's mean time for that size). The cluster's 1 MiB
    all-reduce (~93 us on its GPUs) is shorter than this CPU's own, and match mode cannot make a call faster: that
    is counted per size (the warning, once per size: tests/delay/test_replay.py), never replayed another way."""
    from delaycomm import _C

    prof = str(tmp_path / "cluster.json")
    assert main(["profile", cluster_log(tmp_path), "-o", prof]) == 0
    sampler = _C.DelaySampler(f"profile:{prof}")
    want_p50_us = sampler.quantile(0.5, op="allreduce", nbytes=MiB) * 1e6
    (cls,) = [c for c in json.loads(open(prof).read())["ops"]["allreduce"] if c["bytes"] == MiB]
    mean_us = cls["sum_ns"] / cls["count"] / 1e3
    assert want_p50_us < mean_us  # a spread whose mean is the table's time, not a constant

    def job(ctx):
        import torch
        import torch.distributed as dist

        import delaycomm

        g = ctx.group(delay=f"profile:{prof}")
        t = torch.ones(MiB // 4)
        for _ in range(60):
            dist.all_reduce(t, group=g, async_op=True).wait()
        return delaycomm.stats(g)["ops"]["allreduce"]

    results = run_threads(job, 2, timeout=90)
    assert sum(s["delayed_calls"] for s in results) == 60  # one carrier per call, every call carried
    for s in results:
        (size,) = s["by_size"]
        assert size["bytes"] == MiB and size["calls"] == 60, size
        m = size["match"]
        assert m["nothing_added"] + m["uncalibrated"] > 0 and s["match"]["calls"] == s["delayed_calls"], s
        assert s["delay"]["max_us"] <= cls["max_ns"] / 1e3 * 1.02  # what is added never exceeds the class's draws
