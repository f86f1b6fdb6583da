"""The config table, option resolution and the check that an option left a trace in the telemetry."""

from __future__ import annotations

import pytest

from delaycomm.experiment.configs import CONFIGS, effect_problems, resolved_options, select_configs

BY_NAME = {c.name: c for c in CONFIGS}


def test_table_names_are_unique_and_backends_known():
    assert len(BY_NAME) == len(CONFIGS)
    assert {c.backend for c in CONFIGS} == {"gloo", "delaycomm"}
    assert "seed" not in {k for c in CONFIGS for k in c.options}
    assert "delay" not in {k for c in CONFIGS for k in c.options}


def test_every_config_is_a_valid_delayconfig():
    import delaycomm

    for c in CONFIGS:
        delaycomm.DelayConfig(**resolved_options(c, "exp:p99=40ms", 3))


@pytest.mark.parametrize(
    "name,expected",
    [
        ("gloo", {}),
        ("bsp", {"seed": 3}),
        ("bsp-delay", {"seed": 3, "delay": "const:5ms"}),
        ("straggler", {"seed": 3, "slowdown": "0:4x"}),
        ("ssp2-ema", {"seed": 3, "delay": "const:5ms", "staleness": "ssp:2", "stale_policy": "ema"}),
        ("asp-apply", {"seed": 3, "delay": "const:5ms", "staleness": "asp", "stale_policy": "apply"}),
        ("asp-drop", {"seed": 3, "delay": "const:5ms", "staleness": "asp", "stale_policy": "drop"}),
    ],
)
def test_resolved_options(name, expected):
    assert resolved_options(BY_NAME[name], "const:5ms", 3) == expected


def test_step_ms_goes_to_every_delaycomm_config_when_given():
    assert resolved_options(BY_NAME["bsp"], "const:5ms", 3, 2.5) == {"seed": 3, "step_ms": 2.5}
    assert resolved_options(BY_NAME["gloo"], "const:5ms", 3, 2.5) == {}


def test_select_keeps_the_given_order():
    assert [c.name for c in select_configs(["asp-drop", "gloo"])] == ["asp-drop", "gloo"]
    assert select_configs(None) == list(CONFIGS)
    with pytest.raises(ValueError, match=r"^--configs: no config given"):
        select_configs([])


def _stats(delayed=0, steps=0, slowed=0, stale=0, dropped=0):
    return {
        "ops": {"allreduce": {"calls": 10, "delayed_calls": delayed}},
        "staleness": {"steps": steps, "stale": stale, "dropped": dropped},
        "slowdown": {"calls": slowed},
    }


EFFECTS = [
    # (config, per-rank stats, expected problems)
    ("gloo", [{}, {}], []),
    ("bsp", [_stats(), _stats()], []),
    ("bsp-delay", [_stats(delayed=0), _stats(delayed=3)], []),
    ("bsp-delay", [_stats(), _stats()], ["delay='exp:p99=40ms' was set but no rank recorded a delayed call"]),
    ("straggler", [_stats(slowed=9), _stats()], []),
    ("straggler", [{"ops": {}}, {"ops": {}}], ["slowdown='0:4x' was set but no rank recorded a slowed call"]),
    ("ssp2-ema", [_stats(steps=5, stale=2), _stats(steps=5, stale=2)], []),
    ("asp-drop", [_stats(steps=5, dropped=1), _stats(steps=5, dropped=1)], []),
    # delayed calls are no evidence under ssp/asp: the schedule's delays must show up as late contributions
    (
        "asp-apply",
        [_stats(delayed=4, steps=5), _stats(delayed=4, steps=5)],
        ["delay='exp:p99=40ms' was set but no contribution arrived late"],
    ),
    (
        "ssp2-ema",
        [_stats(), _stats()],
        [
            "delay='exp:p99=40ms' was set but no contribution arrived late",
            "staleness='ssp:2' was set but the staleness engine recorded no step",
        ],
    ),
]


@pytest.mark.parametrize("name,stats,expected", EFFECTS)
def test_effect_problems(name, stats, expected):
    c = BY_NAME[name]
    assert effect_problems(c.backend, resolved_options(c, "exp:p99=40ms", 0), stats) == expected
