"""The delay families of the claims from the existing spec grammar: a capped tail as a trace file."""

from __future__ import annotations

import math

import numpy as np
import pytest

import delaycomm
from delaycomm.experiment.families import capped_trace, const_of_mean


def test_exp_capped_at_its_mean(tmp_path):
    spec = capped_trace("exp:mean=10ms", "mean", str(tmp_path))
    assert spec.startswith("trace:") and spec.endswith(".txt")
    s = delaycomm.DelaySampler(spec, seed=3)
    x = s.sample_many(50_000)
    assert x.max() == pytest.approx(0.010, rel=1e-6)  # nothing above the cap
    # E[min(X, m)] = m (1 - 1/e) for an exponential of mean m; P(X >= m) = 1/e
    assert x.mean() == pytest.approx(0.010 * (1 - math.exp(-1)), rel=0.02)
    assert np.mean(x >= 0.00999) == pytest.approx(math.exp(-1), abs=0.01)
    # below the cap, the spec's own quantiles
    assert s.quantile(0.3) == pytest.approx(delaycomm.DelaySampler("exp:mean=10ms").quantile(0.3), rel=1e-3)


def test_a_cap_as_a_duration_and_the_fixed_delay_of_the_same_mean(tmp_path):
    spec = capped_trace("exp:p99=40ms", "5ms", str(tmp_path))
    assert delaycomm.DelaySampler(spec).sample_many(2000).max() == pytest.approx(0.005, rel=1e-6)
    assert const_of_mean("exp:mean=4ms") == "const:4ms"
    with pytest.raises(ValueError, match=r"--delay-cap"):
        capped_trace("exp:p99=40ms", "5", str(tmp_path))
