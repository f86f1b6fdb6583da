"""The statistics: the t quantile against scipy, intervals, the paired comparison and its verdicts, directions."""

from __future__ import annotations

import math

import pytest

from delaycomm.experiment import stats as st


def test_t_quantile_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for nu in [*range(1, 60), 99, 250, 1000]:
        for confidence in (0.5, 0.9, 0.95, 0.99):
            want = scipy_stats.t.ppf(0.5 + confidence / 2, nu)
            assert st.t_quantile(confidence, nu) == pytest.approx(want, rel=1e-9), (nu, confidence)
            assert st.t_two_sided(want, nu) == pytest.approx(confidence, abs=1e-12)


def test_t_quantile_known_values_and_bad_input():
    assert st.t_quantile(0.95, 1) == pytest.approx(12.7062047361747, rel=1e-12)
    assert st.t_quantile(0.95, 4) == pytest.approx(2.7764451051977987, rel=1e-12)
    with pytest.raises(ValueError, match=r"^t_quantile: nu must be an integer >= 1, got 0$"):
        st.t_quantile(0.95, 0)
    with pytest.raises(ValueError, match=r"^t_quantile: confidence must be in \(0, 1\), got 1.0$"):
        st.t_quantile(1.0, 3)


def test_interval_is_mean_plus_minus_t_sd_over_root_n():
    iv = st.interval([1.0, 2.0, 3.0, 4.0])
    sd = math.sqrt(5.0 / 3.0)
    assert iv["n"] == 4 and iv["mean"] == 2.5 and iv["sd"] == pytest.approx(sd)
    assert iv["half"] == pytest.approx(st.t_quantile(0.95, 3) * sd / 2.0)
    assert (iv["lo"], iv["hi"]) == pytest.approx((2.5 - iv["half"], 2.5 + iv["half"]))
    assert st.interval([7.0]) == {"n": 1, "mean": 7.0, "sd": None, "half": None, "lo": None, "hi": None}
    assert st.interval([])["mean"] is None


VERDICTS = [
    # (config by seed, baseline by seed, direction, verdict)
    ({0: 2.0, 1: 2.1, 2: 2.2}, {0: 1.0, 1: 1.0, 2: 1.1}, st.LOWER, "worse"),
    ({0: 2.0, 1: 2.1, 2: 2.2}, {0: 1.0, 1: 1.0, 2: 1.1}, st.HIGHER, "better"),
    ({0: 2.0, 1: 2.1, 2: 2.2}, {0: 1.0, 1: 1.0, 2: 1.1}, st.UNKNOWN, "higher"),
    ({0: 0.0, 1: 0.1, 2: 0.2}, {0: 1.0, 1: 1.0, 2: 1.1}, st.LOWER, "better"),
    ({0: 1.0, 1: 3.0, 2: 0.5}, {0: 1.1, 1: 1.0, 2: 1.9}, st.LOWER, "no difference shown"),
    ({0: 1.0}, {0: 2.0}, st.LOWER, "not enough seeds"),
    # pairing: seed 3 has no baseline and is left out; identical runs show no difference
    ({0: 1.0, 1: 2.0, 3: 9.0}, {0: 1.0, 1: 2.0}, st.LOWER, "no difference shown"),
]


@pytest.mark.parametrize("config,baseline,how,verdict", VERDICTS)
def test_paired_verdict(config, baseline, how, verdict):
    p = st.paired(config, baseline, how)
    assert p["verdict"] == verdict
    assert p["seeds"] == sorted(set(config) & set(baseline))


def test_paired_uses_the_differences_not_the_two_means():
    # Each seed's pair moves together: the difference is clear though the two groups overlap widely.
    base = {0: 1.0, 1: 5.0, 2: 9.0}
    config = {s: v + 0.1 + 0.001 * s for s, v in base.items()}
    p = st.paired(config, base, st.LOWER)
    assert p["mean"] == pytest.approx(0.101) and p["verdict"] == "worse"
    assert st.interval(list(config.values()))["lo"] < st.interval(list(base.values()))["hi"]
    assert st.paired({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}, st.LOWER)["identical"] is True


@pytest.mark.parametrize(
    "name,how",
    [
        ("loss", st.LOWER),
        ("test_loss", st.LOWER),
        ("val.mse", st.LOWER),
        ("wall_s", st.LOWER),
        ("update_noise_ratio", st.LOWER),
        ("test_accuracy", st.HIGHER),
        ("val_acc", st.HIGHER),
        ("test_r2", st.HIGHER),
        ("effective_lr", st.UNKNOWN),
        ("throughput", st.UNKNOWN),
    ],
)
def test_direction_by_name(name, how):
    assert st.direction(name) == how


def test_direction_as_the_user_says():
    assert st.direction("loss", higher=["loss"]) == st.HIGHER
    assert st.direction("throughput", higher=["throughput"]) == st.HIGHER
    assert st.direction("acc", lower=["acc"]) == st.LOWER
