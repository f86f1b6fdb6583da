"""The simulator driven by the backend's own delay sampler, ``delaycomm.DelaySampler``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from delaycomm.sim import cli, simulate
from delaycomm.sim.engine import SIM_DELAY_STREAM

from ._fakes import small

try:
    from delaycomm import DelaySampler
except ImportError:  # the compiled extension is not built in this environment
    DelaySampler = None

pytestmark = pytest.mark.skipif(DelaySampler is None, reason="delaycomm.DelaySampler is not importable (no _C)")


def test_real_sampler_drives_the_schedule():
    # One worker, 1 s steps, every update 500 ms in flight (network mode): same trace as with the test fake.
    r = simulate(
        small(model="asp", workers=1, stragglers=0, jitter="none", budget=4.6, delay="const:500ms"),
        [DelaySampler("const:500ms", seed=0, rank=0)],
    )
    assert r.arrival_time == pytest.approx([1.5, 2.5, 3.5, 4.5], abs=1e-9)
    assert r.staleness.tolist() == [0, 1, 1, 1]


def test_real_sampler_delays_are_the_kth_draws_of_each_rank():
    spec = "exp:p99=400ms"
    cfg = small(model="asp", workers=3, jitter="none", straggler=1.0, budget=20.5, delay=spec)
    r = simulate(cfg, [DelaySampler(spec, seed=7, rank=i) for i in range(3)])
    for rank in range(3):
        mine = r.arrival_worker == rank
        steps = r.arrival_step[mine]
        # No jitter: worker `rank` sends its k-th update at time k (k = 1, 2, ...), FIFO per worker.
        delays = DelaySampler(spec, seed=7, rank=rank).sample_many(steps.size, stream=SIM_DELAY_STREAM)
        expected = np.maximum.accumulate(steps + delays)
        assert r.arrival_time[mine] == pytest.approx(expected, abs=1e-9)


def test_cli_run_with_a_real_delay_is_deterministic(capsys, tmp_path):
    docs = []
    for i in range(2):
        path = tmp_path / f"r{i}.json"
        assert (
            cli.main(
                [
                    "run",
                    "--model",
                    "lead:2",
                    "--delay",
                    "lognormal:p50=60ms,p99=400ms",
                    "--budget",
                    "60",
                    "--seed",
                    "3",
                    "--json",
                    str(path),
                ]
            )
            == 0
        )
        docs.append(json.loads(path.read_text())["runs"][0])
    capsys.readouterr()
    assert docs[0]["curve_loss"] == docs[1]["curve_loss"]
    assert docs[0]["staleness_histogram"] == docs[1]["staleness_histogram"]
    assert docs[0]["max_staleness"] <= docs[0]["staleness_bound"] == 7 * 3 + 1


@pytest.mark.parametrize("spec", ["exp:p99=-5ms", "gauss:p50=1ms", "const:", "pareto:p50=10ms"])
def test_cli_reports_the_backend_parsers_rejection(capsys, spec):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--delay", spec])
    assert exc.value.code == 2
    # the backend's own parser (the C++ one, through the binding) names what is wrong and the syntax it accepts
    err = capsys.readouterr().err
    assert f"argument --delay: invalid delay spec {spec!r}: " in err and "expected a delay spec: none" in err, err
