"""Samplers: fidelity to the requested distribution (KS, percentiles), exact parameterisations, determinism."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

import delaycomm
from delaycomm import _C
from tests.harness import run_cli

KS_N = 10_000
PCT_N = 1_000_000


@pytest.fixture(scope="module")
def scipy_stats():
    """scipy.stats, for the tests that compare with a reference distribution (the others run without scipy)."""
    return pytest.importorskip("scipy.stats")


def _lognorm(st, p50, p99):
    sigma = math.log(p99 / p50) / st.norm.ppf(0.99)
    return st.lognorm(s=sigma, scale=p50)


def _pareto(st, x1, q1, x2, q2):
    alpha = math.log((1 - q1) / (1 - q2)) / math.log(x2 / x1)
    return st.pareto(b=alpha, scale=x1 * (1 - q1) ** (1 / alpha))


def _shifted_lognorm(st, pcts):
    """The shifted lognormal (shift + exp(mu + sigma Z)) through three percentiles, solved here with scipy's root
    finder, independently of the sampler's own solution (a reference built from the sampler's parameters could
    not catch a wrong solver)."""
    from scipy.optimize import brentq

    (q1, x1), (q2, x2), (q3, x3) = sorted(pcts.items())
    z1, z2, z3 = st.norm.ppf([q1, q2, q3])
    want = (z3 - z1) / (z2 - z1)
    shift = brentq(
        lambda c: math.log((x3 - c) / (x1 - c)) / math.log((x2 - c) / (x1 - c)) - want,
        -100.0,
        x1 * (1 - 1e-12),
        xtol=1e-15,
    )
    sigma = math.log((x2 - shift) / (x1 - shift)) / (z2 - z1)
    return st.lognorm(s=sigma, loc=shift, scale=math.exp(math.log(x1 - shift) - sigma * z1))


def _shifted_pareto(st, pcts):
    """The shifted Pareto (survival (scale / (x - shift))^b) through three percentiles, solved here as above."""
    from scipy.optimize import brentq

    (q1, x1), (q2, x2), (q3, x3) = sorted(pcts.items())
    want = math.log((1 - q3) / (1 - q2)) / math.log((1 - q2) / (1 - q1))
    shift = brentq(
        lambda c: math.log((x3 - c) / (x2 - c)) / math.log((x2 - c) / (x1 - c)) - want,
        -100.0,
        x1 * (1 - 1e-12),
        xtol=1e-15,
    )
    b = -math.log((1 - q2) / (1 - q1)) / math.log((x2 - shift) / (x1 - shift))
    return st.pareto(b=b, loc=shift, scale=(x1 - shift) * (1 - q1) ** (1 / b))


# spec -> (a reference distribution built independently of the sampler, from scipy.stats; the requested
# percentiles)
FAMILIES = {
    "exp:p99=400ms": (lambda st: st.expon(scale=0.4 / math.log(100)), {0.99: 0.4}),
    "exp:mean=400ms": (lambda st: st.expon(scale=0.4), {}),
    "exp:p50=60ms": (lambda st: st.expon(scale=0.06 / math.log(2)), {0.5: 0.06}),
    "lognormal:p50=60ms,p99=400ms": (lambda st: _lognorm(st, 0.06, 0.4), {0.5: 0.06, 0.99: 0.4}),
    "lognormal:p50=60ms,p99=400ms,p999=2s": (
        lambda st: _shifted_lognorm(st, {0.5: 0.06, 0.99: 0.4, 0.999: 2.0}),
        {0.5: 0.06, 0.99: 0.4, 0.999: 2.0},
    ),
    "pareto:p50=60ms,p99=400ms": (lambda st: _pareto(st, 0.06, 0.5, 0.4, 0.99), {0.5: 0.06, 0.99: 0.4}),
    "pareto:p50=60ms,p99=400ms,p999=700ms": (
        lambda st: _shifted_pareto(st, {0.5: 0.06, 0.99: 0.4, 0.999: 0.7}),
        {0.5: 0.06, 0.99: 0.4, 0.999: 0.7},
    ),
}


@pytest.mark.parametrize("spec", FAMILIES)
def test_ks_against_the_requested_cdf(spec, scipy_stats):
    ref = FAMILIES[spec][0](scipy_stats)
    x = delaycomm.DelaySampler(spec, seed=1234, rank=0).sample_many(KS_N)
    assert scipy_stats.kstest(x, ref.cdf).pvalue > 0.01
    # The sampler's own CDF is the same function.
    grid = np.quantile(x, np.linspace(0.01, 0.99, 50))
    np.testing.assert_allclose(_C.DelaySampler(spec).cdf(grid), ref.cdf(grid), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("spec", FAMILIES)
def test_requested_percentiles_are_exact_and_empirically_within_3_percent(spec):
    _, wanted = FAMILIES[spec]
    s = delaycomm.DelaySampler(spec, seed=99)
    x = s.sample_many(PCT_N)
    for q, v in wanted.items():
        assert s.quantile(q) == pytest.approx(v, rel=1e-9)
        assert np.quantile(x, q) == pytest.approx(v, rel=0.03)
    # and, for every spec, P50 and P99 within 3% of the distribution's own
    for q in (0.5, 0.99):
        assert np.quantile(x, q) == pytest.approx(s.quantile(q), rel=0.03)


def test_exp_p99_400ms_has_its_p99_at_400ms():
    s = delaycomm.DelaySampler("exp:p99=400ms")
    assert s.quantile(0.99) == pytest.approx(0.400, rel=1e-12)
    assert s.describe()["parameters"]["rate_per_s"] == pytest.approx(math.log(100) / 0.4, rel=1e-12)
    assert s.cdf(0.4) == pytest.approx(0.99, rel=1e-12)


def test_rate_0_0025_per_ms_is_a_mean_of_400ms_not_a_p99_of_400ms():
    # The seed blog's "P99 400 ms -> lambda ~ 0.0025" confuses the mean with the P99: rate 0.0025/ms is a mean of
    # 400 ms, whose P99 is 400 ms * ln(100) ~ 1842 ms. The rate for a P99 of 400 ms is ln(100)/400 ~ 0.0115/ms.
    by_rate = delaycomm.DelaySampler("exp:mean=400ms")
    assert by_rate.describe()["parameters"]["rate_per_s"] == pytest.approx(2.5)  # 0.0025 per ms
    assert by_rate.quantile(0.99) == pytest.approx(0.4 * math.log(100), rel=1e-12)
    assert by_rate.quantile(0.99) == pytest.approx(1.842, abs=0.001)
    by_p99 = delaycomm.DelaySampler("exp:p99=400ms")
    assert by_p99.describe()["parameters"]["rate_per_s"] * 1e-3 == pytest.approx(0.0115, abs=1e-4)


def test_const_and_trace(tmp_path, scipy_stats):
    x = delaycomm.DelaySampler("const:50ms").sample_many(1000)
    assert np.all(x == 0.05)
    values = np.random.default_rng(3).lognormal(mean=-3, sigma=0.7, size=2000)
    path = tmp_path / "trace.txt"
    path.write_text("".join(f"{v * 1e3:.9f}ms\n" for v in values))
    s = delaycomm.DelaySampler(f"trace:{path}", seed=5)
    srt = np.sort(values)
    # Reference: the inverse of numpy's linear-interpolation quantile.
    ref_cdf = lambda x: np.interp(x, srt, np.linspace(0.0, 1.0, len(srt)))  # noqa: E731
    xs = s.sample_many(KS_N)
    assert scipy_stats.kstest(xs, ref_cdf).pvalue > 0.01
    for q in (0.0, 0.1, 0.5, 0.99, 0.999, 1.0):
        assert s.quantile(q) == pytest.approx(np.quantile(srt, q, method="linear"), rel=1e-9)
    assert xs.min() >= srt[0] and xs.max() <= srt[-1]
    assert s.mean() == pytest.approx(np.trapezoid(np.quantile(srt, np.linspace(0, 1, 200001)), dx=1 / 200000), rel=1e-4)


@pytest.mark.parametrize("spec", ["exp:p99=400ms", "lognormal:p50=60ms,p99=400ms", "pareto:p50=60ms,p99=400ms"])
def test_quantile_and_cdf_are_inverse_and_the_mean_is_right(spec):
    s = delaycomm.DelaySampler(spec)
    u = np.linspace(0.001, 0.999, 101)
    np.testing.assert_allclose(s.cdf(s.quantile(u)), u, rtol=1e-9)
    assert np.mean(s.sample_many(PCT_N, stream=3)) == pytest.approx(s.mean(), rel=0.02)


def test_the_tail_is_not_capped():
    s = delaycomm.DelaySampler("exp:p99=400ms")
    assert s.quantile(1 - 1e-12) == pytest.approx(0.4 / math.log(100) * math.log(1e12), rel=1e-6)
    assert s.quantile(1.0) == math.inf
    assert np.isfinite(s.sample_many(100_000)).all()


def test_bad_arguments_of_the_sampler():
    s = delaycomm.DelaySampler("exp:p99=400ms")
    with pytest.raises(ValueError, match=r"DelaySampler.quantile: q must be in \[0, 1\], got 1.5"):
        s.quantile(1.5)
    with pytest.raises(ValueError, match=r"DelaySampler.quantile: q must be in \[0, 1\]"):
        s.quantile(np.array([0.5, -0.1]))
    with pytest.raises(ValueError, match=r"DelaySampler: seed must be >= 0, got -1"):
        delaycomm.DelaySampler("exp:p99=400ms", seed=-1)
    with pytest.raises(ValueError, match=r"DelaySampler.sample_many: n must be >= 0, got -3"):
        s.sample_many(-3)


# ---------------------------------------------------------------------------------------------------------------
# Determinism


def test_philox_known_answers():
    # Random123's known-answer vectors for Philox4x32-10.
    assert _C._philox4x32([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert _C._philox4x32([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert _C._philox4x32([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == [
        0xD16CFE09,
        0x94FDCCEB,
        0x5001E420,
        0x24126EA1,
    ]


def test_a_draw_is_a_pure_function_of_seed_rank_stream_seq():
    a = delaycomm.DelaySampler("lognormal:p50=60ms,p99=400ms", seed=7, rank=3)
    b = delaycomm.DelaySampler("lognormal:p50=60ms,p99=400ms", seed=7, rank=3)
    np.testing.assert_array_equal(a.sample_many(1000, stream=2, start=50), b.sample_many(1000, stream=2, start=50))
    many = a.sample_many(100, stream=2, start=50)
    assert [a.sample(2, 50 + i) for i in range(100)] == list(many)


def _digest(seed, rank):
    x = delaycomm.DelaySampler("exp:p99=400ms", seed=seed, rank=rank).sample_many(10_000)
    return hashlib.sha256(x.tobytes()).hexdigest()


def test_same_seed_same_schedule_in_another_process():
    code = (
        "import hashlib, delaycomm; x = delaycomm.DelaySampler('exp:p99=400ms', seed=42, rank=1)"
        ".sample_many(10000); print(hashlib.sha256(x.tobytes()).hexdigest())"
    )
    out = run_cli(["-c", code], timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == _digest(42, 1)


def test_ranks_streams_and_seeds_are_decorrelated():
    base = _C.DelaySampler("exp:mean=1s", seed=1, rank=0)
    u0 = base.cdf(base.sample_many(20_000))
    for other in (_C.DelaySampler("exp:mean=1s", seed=1, rank=1), _C.DelaySampler("exp:mean=1s", seed=2, rank=0)):
        u1 = other.cdf(other.sample_many(20_000))
        assert not np.array_equal(u0, u1)
        assert abs(np.corrcoef(u0, u1)[0, 1]) < 0.05
    u_stream = base.cdf(base.sample_many(20_000, stream=1))
    assert abs(np.corrcoef(u0, u_stream)[0, 1]) < 0.05
    u_lag = u0[1:], u0[:-1]
    assert abs(np.corrcoef(*u_lag)[0, 1]) < 0.05


def test_schedule_fraction_ranks_and_agreement_with_the_sampler():
    sch = _C.DelaySchedule("exp:p99=400ms", 0.3, seed=5, ranks=[1, 3])
    d1 = sch.delays_ns(1, 0, 0, 100_000)
    assert abs(np.mean(d1 > 0) - 0.3) < 0.0075  # 5 standard deviations of a binomial share
    assert np.all(sch.delays_ns(0, 0, 0, 1000) == 0)  # rank 0 is not targeted
    assert sch.delayed(1, 0, 17) == (sch.delay_ns(1, 0, 17) > 0)
    sampler = _C.DelaySampler("exp:p99=400ms", seed=5, rank=1)
    hit = np.nonzero(d1[:1000])[0]
    np.testing.assert_allclose(d1[hit] * 1e-9, [sampler.sample(0, int(i)) for i in hit], rtol=0, atol=0.5e-9)  # ns
    # whether rank 1 and rank 3 are delayed at the same step: independent draws
    d3 = sch.delays_ns(3, 0, 0, 100_000)
    both = np.mean((d1 > 0) & (d3 > 0))
    assert abs(both - 0.09) < 0.005
    assert _C.DelaySchedule("none", 0.5).active is False
    assert _C.DelaySchedule.key_stream(7) == (1 << 32) + 7
    with pytest.raises(ValueError, match=r"DelaySchedule: fraction must be in \[0, 1\], got 1.5"):
        _C.DelaySchedule("exp:p99=400ms", 1.5)
