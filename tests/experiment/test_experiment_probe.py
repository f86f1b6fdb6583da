"""The update metrics: exact values from per-step series, and the probe on a real model (applied = fresh gives a
noise ratio of 1 and no deviation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from delaycomm.experiment.probe import UpdateProbe, summarize_probe


def test_summarize_probe_exact():
    nan = float("nan")
    series = {
        "full_loss": [3.0, 2.0, 2.5, 1.0, 1.2, 0.5],
        "u_norm": [2.0, 1.0, 1.0, 3.0, 1.0, 1.0],
        "f_norm": [1.0, 1.0, 2.0, 3.0, 1.0, 1.0],
        "u_g_sq": [4.0, nan, 2.0, nan, 0.0, nan],
        "f_g_sq": [2.0, nan, 2.0, nan, 4.0, nan],
        "u_f_sq": [1.0, 0.0, 1.0, 0.0, 0.0, 0.0],
    }
    m = summarize_probe(series, lr=0.1, oscillation_steps=3, steps_per_epoch=2)
    assert m["update_noise_ratio"] == pytest.approx(6.0 / 8.0)  # only the steps with a full-batch gradient
    assert m["update_deviation"] == pytest.approx(2.0 / 17.0)
    assert m["effective_lr"] == pytest.approx(0.1 * (2 + 1 + 0.5 + 1 + 1 + 1) / 6)
    assert m["oscillation"] == pytest.approx(0.5)  # 3 -> 2 -> 2.5 -> 1: one rise of 0.5
    assert m["oscillation_2epochs"] == pytest.approx(0.5 + 0.2)  # the first 4 steps: rises 0.5 and 0.2
    assert m["full_loss_2epochs"] == 1.2


def test_probe_on_a_model_whose_applied_gradient_is_the_fresh_one():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    probe = UpdateProbe(model, torch.nn.functional.cross_entropy, x, y, every=2)
    for step in range(4):
        batch = torch.arange(8 * step, 8 * step + 8)
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()  # p.grad = the fresh gradient
        probe.record(batch)
    series = probe.result()
    assert len(series["full_loss"]) == 4
    assert np.isfinite(series["u_g_sq"][0]) and math.isnan(series["u_g_sq"][1])
    m = summarize_probe(series, lr=0.5, oscillation_steps=10, steps_per_epoch=1)
    assert m["update_noise_ratio"] == pytest.approx(1.0, rel=1e-6)
    assert m["update_deviation"] == pytest.approx(0.0, abs=1e-12)
    assert m["effective_lr"] == pytest.approx(0.5, rel=1e-6)
    assert all(p.grad is not None for p in model.parameters())
