"""Delay sampler throughput: samples per second of each distribution family (delaycomm.DelaySampler)."""

import math

import pytest

import delaycomm

SPECS = ["exp:p99=400ms", "exp:mean=400ms", "lognormal:p50=60ms,p99=400ms", "pareto:p50=60ms,p99=400ms", "const:50ms"]
N = 100_000


@pytest.mark.parametrize("spec", SPECS)
def test_sample_many(benchmark, spec):
    sampler = delaycomm.DelaySampler(spec, seed=0, rank=0)
    assert sampler.quantile(0.5) > 0
    benchmark.group = "sampler: sample_many(100000)"
    benchmark.extra_info["samples_per_round"] = N
    out = benchmark(sampler.sample_many, N)
    assert len(out) == N
    assert all(math.isfinite(x) and x >= 0 for x in out[:100])
