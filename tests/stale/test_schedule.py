"""delaycomm.schedule.EpochWarmup: exact learning rates, composition with torch schedulers, argument checks."""

from __future__ import annotations

import re

import pytest
import torch
from torch.optim.lr_scheduler import ChainedScheduler, ExponentialLR, StepLR

from delaycomm.schedule import EpochWarmup


def make_optimizer(*lrs: float) -> torch.optim.Optimizer:
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, lr=lrs[0])


def run(optimizer, schedulers, steps: int) -> list[list[float]]:
    """The learning rates each optimizer step uses, for `steps` steps."""
    seen = []
    for _ in range(steps):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        for s in schedulers:
            s.step()
    return seen


def test_warmup_restarts_every_epoch():
    opt = make_optimizer(0.1)
    sched = EpochWarmup(opt, warmup_steps=4, steps_per_epoch=6)
    expected = [0.025, 0.05, 0.075, 0.1, 0.1, 0.1] * 2 + [0.025, 0.05]
    assert [lr[0] for lr in run(opt, [sched], 14)] == pytest.approx(expected, rel=1e-12)
    assert sched.get_last_lr() == pytest.approx([0.075], rel=1e-12)


def test_each_param_group_is_scaled():
    opt = make_optimizer(0.1, 1.0)
    sched = EpochWarmup(opt, warmup_steps=2, steps_per_epoch=3)
    assert run(opt, [sched], 4) == [
        pytest.approx(x, rel=1e-12) for x in ([0.05, 0.5], [0.1, 1.0], [0.1, 1.0], [0.05, 0.5])
    ]


def test_default_warmup_is_500_steps():
    opt = make_optimizer(1.0)
    sched = EpochWarmup(opt, steps_per_epoch=1000)
    lrs = [lr[0] for lr in run(opt, [sched], 1002)]
    assert lrs[0] == pytest.approx(1 / 500, rel=1e-12)
    assert lrs[249] == pytest.approx(0.5, rel=1e-12)
    assert lrs[499:1000] == pytest.approx([1.0] * 501, rel=1e-12)
    assert lrs[1000:] == pytest.approx([1 / 500, 2 / 500], rel=1e-12)


def test_one_warmup_step_is_constant():
    opt = make_optimizer(0.3)
    sched = EpochWarmup(opt, warmup_steps=1, steps_per_epoch=2)
    assert [lr[0] for lr in run(opt, [sched], 5)] == pytest.approx([0.3] * 5, rel=1e-12)


@pytest.mark.parametrize("order", ["warmup-first", "steplr-first", "chained"])
def test_composes_with_steplr_as_a_product(order):
    opt = make_optimizer(0.8)
    warmup = EpochWarmup(opt, warmup_steps=3, steps_per_epoch=5)
    step_lr = StepLR(opt, step_size=4, gamma=0.5)
    schedulers = {
        "warmup-first": [warmup, step_lr],
        "steplr-first": [step_lr, warmup],
        "chained": [ChainedScheduler([warmup, step_lr])],
    }[order]
    factor = [1 / 3, 2 / 3, 1, 1, 1]
    expected = [0.8 * factor[t % 5] * 0.5 ** (t // 4) for t in range(12)]
    assert [lr[0] for lr in run(opt, schedulers, 12)] == pytest.approx(expected, rel=1e-12)


def test_composes_with_exponential_decay():
    opt = make_optimizer(1.0)
    schedulers = [ExponentialLR(opt, gamma=0.9), EpochWarmup(opt, warmup_steps=2, steps_per_epoch=3)]
    factor = [0.5, 1, 1]
    expected = [factor[t % 3] * 0.9**t for t in range(9)]
    assert [lr[0] for lr in run(opt, schedulers, 9)] == pytest.approx(expected, rel=1e-12)


def test_state_dict_resumes_the_same_schedule():
    opt = make_optimizer(0.2)
    sched = EpochWarmup(opt, warmup_steps=3, steps_per_epoch=4)
    full = [lr[0] for lr in run(opt, [sched], 11)]

    opt1 = make_optimizer(0.2)
    sched1 = EpochWarmup(opt1, warmup_steps=3, steps_per_epoch=4)
    first = [lr[0] for lr in run(opt1, [sched1], 6)]
    opt2 = make_optimizer(0.2)
    sched2 = EpochWarmup(opt2, warmup_steps=3, steps_per_epoch=4)
    opt2.load_state_dict(opt1.state_dict())
    sched2.load_state_dict(sched1.state_dict())
    second = [lr[0] for lr in run(opt2, [sched2], 5)]
    assert first + second == pytest.approx(full, rel=1e-12)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"warmup_steps": 0, "steps_per_epoch": 10}, "EpochWarmup: warmup_steps must be an integer >= 1, got 0"),
        ({"warmup_steps": -5, "steps_per_epoch": 10}, "EpochWarmup: warmup_steps must be an integer >= 1, got -5"),
        (
            {"warmup_steps": 2.5, "steps_per_epoch": 10},
            "EpochWarmup: warmup_steps must be an integer >= 1, got 2.5 (float)",
        ),
        (
            {"warmup_steps": True, "steps_per_epoch": 10},
            "EpochWarmup: warmup_steps must be an integer >= 1, got True (bool)",
        ),
        (
            {"warmup_steps": "10", "steps_per_epoch": 10},
            "EpochWarmup: warmup_steps must be an integer >= 1, got '10' (str)",
        ),
        ({"warmup_steps": 5, "steps_per_epoch": 0}, "EpochWarmup: steps_per_epoch must be an integer >= 1, got 0"),
        (
            {"warmup_steps": 5, "steps_per_epoch": None},
            "EpochWarmup: steps_per_epoch must be an integer >= 1, got None (NoneType)",
        ),
        (
            {"warmup_steps": 500, "steps_per_epoch": 100},
            "EpochWarmup: warmup_steps (500) must not exceed steps_per_epoch (100): the warmup restarts every "
            "epoch and "
            "would never finish",
        ),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, message):
    opt = make_optimizer(0.1)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        EpochWarmup(opt, **kwargs)
    assert opt.param_groups[0]["lr"] == 0.1, "a rejected scheduler must leave the learning rate alone"


def test_steps_per_epoch_is_required():
    with pytest.raises(TypeError, match="steps_per_epoch"):
        EpochWarmup(make_optimizer(0.1), warmup_steps=5)
