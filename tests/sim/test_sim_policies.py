"""Stale policies and step-size rules against hand-computed steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from delaycomm.sim import ServerOptimizer, StalePolicy, StepConfig

W0 = np.array([1.0, -2.0])
G = np.array([0.5, 0.25])
W_READ = np.array([0.8, -1.5])  # the (stale) parameters the worker read; w_now - w_read = [0.2, -0.5]


# --- policies: N = 4, alpha = 0.1, fresh iff staleness <= 2; arrivals with staleness 0, 5, 1, 7, 0 -----------
# window (last 4, current included): F | F S | F S F | F S F S | S F S F
@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("apply", [1.0, 1.0, 1.0, 1.0, 1.0]),
        # fresh: m / n_f; stale: 0
        ("drop", [1.0, 0.0, 3 / 2, 0.0, 4 / 2]),
        # no stale in window: 1; else fresh (1 - a) m / n_f, stale a m / n_s
        ("ema", [1.0, 0.1 * 2 / 1, 0.9 * 3 / 2, 0.1 * 4 / 2, 0.9 * 4 / 2]),
    ],
)
def test_policy_scales(kind, expected):
    policy = StalePolicy(kind, workers=4, stale_after=2, alpha=0.1)
    got = [policy.scale(tau) for tau in (0, 5, 1, 7, 0)]
    assert got == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(("kind", "expected"), [("apply", 1.0), ("drop", 0.0), ("ema", 1.0)])
def test_policy_when_every_contribution_is_stale(kind, expected):
    # The backend's policies (docs/staleness.md): drop applies nothing, ema applies N * mean(due-stale), i.e. weight 1
    # each.
    policy = StalePolicy(kind, workers=3, stale_after=0, alpha=0.1)
    assert [policy.scale(tau) for tau in (4, 5, 6, 7)] == [expected] * 4


def test_policy_weights_preserve_the_step_of_a_full_window():
    # Over a window of N arrivals, ema gives stale ones total weight alpha * N and fresh ones (1 - alpha) * N.
    policy = StalePolicy("ema", workers=4, stale_after=2, alpha=0.25)
    for tau in (0, 0, 0, 9):
        policy.scale(tau)
    weights = [policy.scale(tau) for tau in (0, 0, 0, 9)]  # window stays 3 fresh + 1 stale
    assert sum(weights[:3]) == pytest.approx(0.75 * 4)
    assert weights[3] == pytest.approx(0.25 * 4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("mean", 4, 2, 0.1), r"StalePolicy: unknown policy 'mean': expected one of apply, drop, ema"),
        (("ema", 0, 2, 0.1), r"StalePolicy: workers must be >= 1, got 0"),
        (("ema", 4, -1, 0.1), r"StalePolicy: stale_after must be >= 0, got -1"),
        (("ema", 4, 2, 0.0), r"StalePolicy: alpha must be in \(0, 1\], got 0.0"),
        (("ema", 4, 2, 1.5), r"StalePolicy: alpha must be in \(0, 1\], got 1.5"),
    ],
)
def test_policy_rejects(args, message):
    with pytest.raises(ValueError, match=message):
        StalePolicy(*args)


# --- step-size rules: one update of w0 = [1, -2] with g = [0.5, 0.25], staleness 3, lr 0.1, L = 0.5 -----------
def _one_step(rule: str, scale: float = 1.0, **kw) -> ServerOptimizer:
    opt = ServerOptimizer(W0, StepConfig(rule=rule, lr=0.1, **kw), smoothness=0.5)
    opt.w = W0.copy()
    opt.apply(G, staleness=3, read_point=W_READ, scale=scale)
    return opt


def test_const_step():
    assert _one_step("const").w == pytest.approx([1 - 0.05, -2 - 0.025], rel=1e-15)


def test_const_step_with_policy_scale():
    # ema weight 0.2 (a stale arrival) scales the gradient.
    assert _one_step("const", scale=0.2).w == pytest.approx([1 - 0.01, -2 - 0.005], rel=1e-15)


def test_staleness_scaled_step_is_lr_over_one_plus_tau():
    opt = _one_step("staleness")
    assert opt.last_step == pytest.approx(0.1 / 4)
    assert opt.w == pytest.approx([1 - 0.0125, -2 - 0.00625], rel=1e-15)


def test_adadelay_step():
    # alpha_t = 1 / (L + c sqrt(t + tau)), c = 1 / lr, t = 1 for the first update.
    opt = _one_step("adadelay")
    step = 1 / (0.5 + math.sqrt(1 + 3) / 0.1)
    assert step == pytest.approx(1 / 20.5)
    assert opt.last_step == pytest.approx(step, rel=1e-15)
    assert opt.w == pytest.approx(W0 - step * G, rel=1e-15)
    opt.apply(G, staleness=0, read_point=opt.w.copy())  # second update: t = 2, tau = 0
    assert opt.last_step == pytest.approx(1 / (0.5 + math.sqrt(2) / 0.1), rel=1e-15)


def test_dcasgd_constant_lambda():
    # g + lambda g*g*(w_now - w_read) = [0.5 + 0.04*0.25*0.2, 0.25 + 0.04*0.0625*(-0.5)] = [0.502, 0.24875]
    opt = _one_step("dcasgd", dc_lambda=0.04)
    assert opt.w == pytest.approx([1 - 0.0502, -2 - 0.024875], rel=1e-14)


def test_dcasgd_adaptive_lambda():
    # MeanSquare = (1 - m) g^2 = [0.0125, 0.003125]; lambda = lambda0 / sqrt(MeanSquare).
    opt = _one_step("dcasgd-a", dc_lambda=2.0, dc_momentum=0.95)
    lam = np.array([2 / math.sqrt(0.0125), 2 / math.sqrt(0.003125)])
    g_dc = G + lam * G * G * np.array([0.2, -0.5])  # = [1.394427.., -0.868033..]
    assert g_dc == pytest.approx([1.3944272, -0.8680340], rel=1e-7)
    assert opt.w == pytest.approx(W0 - 0.1 * g_dc, rel=1e-9)


def test_dcasgd_is_plain_sgd_on_fresh_weights():
    opt = ServerOptimizer(W0, StepConfig(rule="dcasgd", lr=0.1, dc_lambda=5.0), smoothness=0.5)
    opt.apply(G, staleness=0, read_point=W0.copy())
    assert opt.w == pytest.approx(W0 - 0.1 * G, rel=1e-15)


def test_anytime_two_steps():
    # a_t = t, eta_t = 2R / sqrt(sum a_k^2 |g_k|^2), projection onto |w| <= R, x = weighted average.
    opt = ServerOptimizer(np.zeros(2), StepConfig(rule="anytime", radius=1.0), smoothness=0.5)
    opt.apply(np.array([3.0, 4.0]), staleness=0, read_point=opt.read())
    # eta_1 = 2 / 5; w = -0.4 [3, 4] = [-1.2, -1.6], |w| = 2 -> [-0.6, -0.8]; x_1 = w_1
    assert opt.w == pytest.approx([-0.6, -0.8], rel=1e-15)
    assert opt.read() == pytest.approx([-0.6, -0.8], rel=1e-15)
    opt.apply(np.array([0.0, 1.0]), staleness=5, read_point=np.zeros(2))
    eta2 = 2 / math.sqrt(25 + 4)
    w2 = np.array([-0.6, -0.8 - eta2 * 2])
    w2 /= np.linalg.norm(w2)
    x2 = np.array([-0.6, -0.8]) + (2 / 3) * (w2 - np.array([-0.6, -0.8]))
    assert opt.w == pytest.approx(w2, rel=1e-14)
    assert opt.weights() == pytest.approx(x2, rel=1e-14)
    assert x2 == pytest.approx([-0.441641, -0.887999], abs=1e-6)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"rule": "adam"}, r"StepConfig: unknown step rule 'adam': expected one of const, staleness, adadelay"),
        ({"lr": 0.0}, r"StepConfig: lr must be a finite number > 0, got 0.0"),
        ({"lr": math.inf}, r"StepConfig: lr must be a finite number > 0, got inf"),
        ({"dc_lambda": -1.0}, r"StepConfig: dc_lambda must be a finite number >= 0, got -1.0"),
        ({"dc_momentum": 1.0}, r"StepConfig: dc_momentum must be in \[0, 1\), got 1.0"),
        ({"radius": -2.0}, r"StepConfig: radius must be a finite number > 0, got -2.0"),
    ],
)
def test_step_config_rejects(kw, message):
    with pytest.raises(ValueError, match=message):
        StepConfig(**kw).validate()
