"""delaycomm.fit: specs whose overall (mixture) latency percentiles hit the targets, or a reason why not."""

from __future__ import annotations

import numpy as np
import pytest

import delaycomm
from delaycomm import _C

N = 1_000_000


def _overall(fit: delaycomm.DelayFit, seed: int = 3) -> np.ndarray:
    """The added latency of N calls under the fitted options, through the runtime's own schedule."""
    return _C.DelaySchedule(fit.delay, fit.fraction, seed).delays_ns(0, 0, 0, N) * 1e-9


@pytest.mark.parametrize(
    "kwargs,family",
    [
        (dict(p50="60ms", p99="400ms", fraction=0.8), "lognormal"),
        (dict(p50=0.06, p99=0.4, fraction=1.0), "lognormal"),
        (dict(p99="400ms", fraction=0.3), "exp"),
        (dict(p99="400ms", p999="2s", fraction=0.3), "lognormal"),
        (dict(p50="60ms", p99="400ms", p999="3s", fraction=0.9), "lognormal"),
        (dict(p50="60ms", p99="400ms", p999="700ms", fraction=0.9), "pareto"),
        (dict(p50="60ms", p99="400ms", fraction=0.8, family="pareto"), "pareto"),
    ],
)
def test_fit_hits_the_overall_percentiles(kwargs, family):
    f = delaycomm.fit(**kwargs)
    assert f.family == family
    targets = {k: delaycomm._delay.parse_duration(v) for k, v in kwargs.items() if k in ("p50", "p99", "p999")}
    for k, v in targets.items():
        assert f.achieved[k] == pytest.approx(v, rel=1e-9)
    x = _overall(f)
    qs = {"p50": 0.5, "p99": 0.99, "p999": 0.999}
    for k, v in targets.items():
        assert np.quantile(x, qs[k]) == pytest.approx(v, rel=0.03)
    if "p50" not in targets:
        assert np.quantile(x, 0.5) == 0.0  # the undelayed majority
    assert f.options() == {"delay": f.delay, "delay_fraction": f.fraction}
    assert delaycomm.DelayConfig(**f.options()).given["delay"] == str(f)
    assert f.env()["DELAYCOMM_DELAY"] == f.delay


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(p50="60ms", p99="400ms", fraction=0.3),
            r"with fraction=0.3, 70% of the calls are not delayed, so the overall p50 is the undelayed "
            r"latency \(0 added\), "
            r"not 60ms; p50 > 0 needs fraction > 0.5",
        ),
        (dict(p99="400ms", fraction=0.005), r"the overall p99 is the undelayed latency"),
        (dict(p50="400ms", p99="60ms", fraction=0.8), r"p99 must be greater than p50"),
        (
            dict(p50="60ms", p99="400ms", p999="410ms", fraction=0.9),
            r"no lognormal with a shift >= 0 .*; .*no generalised Pareto with a location >= 0",
        ),
        (dict(p50="60ms", p99="400ms", fraction=0.8, family="exp"), r"exp has one parameter"),
        (dict(p99="400ms", fraction=0.3, family="lognormal"), r"lognormal needs two percentiles above the undelayed"),
        (dict(p99="400ms", fraction=0.0), r"fraction must be in \(0, 1\]"),
        (
            dict(p99="400ms", fraction=0.3, family="weibull"),
            r"family must be one of 'auto', 'exp', 'lognormal', 'pareto'",
        ),
        (dict(), r"give at least one of p50, p99, p999"),
        (dict(p99="400"), r"delaycomm.fit: p99 '400' has no unit"),
        (dict(p99=-1.0), r"must be a finite number of seconds >= 0"),
    ],
)
def test_fit_says_why_it_cannot(kwargs, message):
    with pytest.raises(ValueError, match=message):
        delaycomm.fit(**kwargs)
