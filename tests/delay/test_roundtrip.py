"""The round trip as a user runs it (bench/roundtrip.py; docs/delay.md, "Round trip"): job A records its stats under
a heavy-tailed delay, `python -m delaycomm profile` builds a profile, job B replays it with nothing but
DELAYCOMM_DELAY=profile:FILE (a profile's defaults: match mode, one carrier per call); B's
latency per size, timed by the script's own clock, matches A's at p50 and p90. Real torchrun jobs, DELAYCOMM_*
variables only."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.harness import run_cli

# NOTE: slow (about a minute of CI: two torchrun jobs and the profile CLI, each a fresh interpreter per process);
# scripts/test.sh --slow runs it. The default run covers record, profile and replay with the real profile CLI in
# tests/delay/test_profile_replay.py, and match mode in tests/delay/test_match.py (docs/ci.md).
pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_a_recorded_job_is_replayed_with_the_profile_alone(tmp_path):
    out = tmp_path / "rt"
    calls, warmup = 200, 10
    argv = [str(ROOT / "bench" / "roundtrip.py"), "--calls", str(calls), "--warmup", str(warmup)]
    argv += ["--out", str(out), "--jobs", "A,B", "--quantiles", "0.5,0.9"]
    p = run_cli(argv, timeout=230)
    log = (out / "jobs.log").read_text() if (out / "jobs.log").exists() else ""
    assert p.returncode in (0, 1), p.stdout + p.stderr + log
    result = json.loads((out / "result.json").read_text())
    profile = json.loads((out / "profile.json").read_text())
    assert profile  # the profile CLI built it from A's stats files
    b = result["jobs"]["B"]
    for size in ("1KiB", "4MiB"):
        row = b["sizes"][size]
        assert row["n"] == 2 * calls
        for q in ("p50", "p90"):
            # 35%, not the full round trip's 25% (bench/roundtrip.py, 500 calls, result committed): with 200 calls
            # a quantile of this lognormal (sigma ~1) has a sampling error of ~10% per job, and CI runs this beside
            # another test worker on 2 cores (one CI run saw +30% at the 1 KiB p50).
            assert abs(row[f"{q}_vs_A"]) <= 0.35, (size, q, result)
    # One rank carried each call of B (delay_carrier=one by default for a profile, delay_fraction=1), drawn per call
    # from the shared schedule: the ranks' counts add up to every call, and both ranks carried some.
    carried = sorted(s["calls"] for s in b["stats"].values())
    assert sum(carried) == 2 * (calls + warmup) and carried[0] > 0, b["stats"]
    # (The script's own verdict judges the full run's 25%: exit 1 here may only mean a quantile between 25% and 35%.)
