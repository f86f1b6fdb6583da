"""`python -m delaycomm.bench --profile`: delaycomm replays a latency profile (docs/profile.md), side by side with
raw Gloo, and the table shows the profile's quantiles per size. Real ranks, real Gloo."""

import json
import math

import pytest

from delaycomm.bench import results
from delaycomm.bench.cli import main
from tests.harness import run_procs

pytestmark = pytest.mark.multiproc


def _rank(rank, world_size, settings):
    from delaycomm.bench import engine

    return engine.run_rank(rank, world_size, settings, "env://")


@pytest.fixture
def forked_ranks(monkeypatch):
    """The CLI in this process, its ranks forked by the test harness instead of the bench's launcher."""
    from delaycomm.bench import cli

    monkeypatch.setattr(cli, "_measure", lambda settings, nproc: run_procs(_rank, nproc, settings, timeout=80)[0])


def _class(ms: float, nbytes: int) -> dict:
    ns = ms * 1e6
    b = math.floor(math.log(ns) / math.log(1.02))
    return {"bytes": nbytes, "count": 10, "min_ns": ns, "max_ns": ns * 1.019, "buckets": [[b, 10]]}


@pytest.mark.timeout(90)
def test_the_bench_replays_a_profile_per_size_beside_the_raw_backend(tmp_path, forked_ranks, capsys):
    prof = tmp_path / "p.json"
    doc = {
        "format": "delaycomm-profile",
        "version": 1,
        "histogram": {"base": 1.02, "unit": "ns"},
        "metadata": {},
        "ops": {"allreduce": [_class(3.0, 1024), _class(12.0, 65536)]},
    }
    prof.write_text(json.dumps(doc))
    out = tmp_path / "run.json"
    argv = ["--nproc", "2", "-b", "1K", "-e", "64K", "-f", "64", "-n", "5", "-w", "1", "-r", "1"]
    assert main([*argv, "--profile", str(prof), "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert f"# delaycomm: delay=profile:{prof}, delay_fraction=1.0" in stdout
    assert "delaycomm: profile" in stdout  # the target columns' group bar
    record = results.load(str(out))
    config = next(b["config"] for b in record["backends"] if b["label"] == "delaycomm")  # its group's options
    assert (config["delay"], config["delay_fraction"]) == (f"profile:{prof}", 1.0)
    targets = {t["size_bytes"]: t for t in record["profile_targets"]}
    assert targets[1024]["p50_us"] == pytest.approx(3000, rel=0.02)
    assert targets[65536]["p50_us"] == pytest.approx(12000, rel=0.02)
    stats = {(r.size_bytes, r.backend): r for r in results.row_stats(record)}
    for size, ms in ((1024, 3.0), (65536, 12.0)):
        # Each size waits at least its own class's delay (added to the raw call's time). Upper bounds and the raw
        # column are left out: interleaved with delayed calls on a loaded machine, both are noisy (tests/delay's
        # test_profile checks the injected delay per size exactly).
        assert stats[(size, "delaycomm")].p50_us >= ms * 1000 * 0.98
    row = next(line.split() for line in stdout.splitlines() if line.split()[:1] == ["1024"])
    assert f"{targets[1024]['p50_us']:.1f}" in row
    # Beside each of the profile's quantiles, the error of the measured one against it (measured / profile - 1).
    assert "err p50" in stdout and "err p99" in stdout
    measured = stats[(1024, "delaycomm")]
    err50 = row[row.index(f"{targets[1024]['p50_us']:.1f}") + 1]
    assert err50 == f"{100 * (measured.p50_us / targets[1024]['p50_us'] - 1):+.0f}", row
    # A profile's defaults, shown in the header: match mode, one carrier per call.
    assert "delay_mode=match, delay_carrier=one" in stdout


def test_delay_mode_and_carrier_reach_delaycomms_options_and_bad_ones_are_refused(tmp_path, capsys):
    from delaycomm.bench import cli

    p = cli.build_parser()
    settings, _ = cli._resolve(
        p, p.parse_args(["--delay", "const:1ms", "--delay-mode", "match", "--delay-carrier", "one"])
    )
    options = next(b.options for b in settings.backends if b.name == "delaycomm")
    assert options == {"delay": "const:1ms", "delay_mode": "match", "delay_carrier": "one"}
    settings, _ = cli._resolve(p, p.parse_args(["--delay", "const:1ms"]))
    assert next(b.options for b in settings.backends if b.name == "delaycomm") == {"delay": "const:1ms"}
    with pytest.raises(SystemExit) as e:
        main(["--delay-mode", "fast"])
    assert e.value.code == 2
    assert "argument --delay-mode: invalid choice: 'fast' (choose from" in capsys.readouterr().err


def test_a_bad_profile_and_profile_with_delay_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--profile", str(tmp_path / "missing.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --profile: invalid delay spec 'profile:{tmp_path / 'missing.json'}': profile file" in err
    assert "missing.json' cannot be opened: No such file or directory" in err
    prof = tmp_path / "p.json"
    prof.write_text(
        json.dumps(
            {
                "format": "delaycomm-profile",
                "version": 1,
                "histogram": {"base": 1.02, "unit": "ns"},
                "metadata": {},
                "ops": {"allreduce": [_class(3.0, 1024)]},
            }
        )
    )
    with pytest.raises(SystemExit) as e:
        main(["--profile", str(prof), "--delay", "const:1ms"])
    assert e.value.code == 2
    assert "argument --profile: not allowed with --delay" in capsys.readouterr().err
