"""Consistency-model specs (``lead:S``, not the backend's ``ssp:S``), the SSP gate and the staleness bound."""

from __future__ import annotations

import math

import pytest

from delaycomm.sim import ConsistencyModel, parse_model, staleness_bound


@pytest.mark.parametrize(
    ("spec", "kind", "bound", "label"),
    [
        ("bsp", "bsp", None, "bsp"),
        ("BSP", "bsp", None, "bsp"),
        ("asp", "asp", None, "asp"),
        ("lead:2", "ssp", 2, "lead:2"),
        (" LEAD:8 ", "ssp", 8, "lead:8"),
        ("lead:1", "ssp", 1, "lead:1"),
        ("lead:inf", "asp", None, "asp"),
    ],
)
def test_parse_model_accepts(spec, kind, bound, label):
    model = parse_model(spec)
    assert (model.kind, model.bound, model.label) == (kind, bound, label)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("hogwild", r"unknown consistency model 'hogwild': expected 'bsp', 'asp', 'lead:S' with an integer S >= 1"),
        (
            "lead:-1",
            r"lead bound must be >= 1 \(with 0 no worker could start; a barrier is 'bsp'\), got -1 in "
            r"'lead:-1'",
        ),
        ("lead:0", r"lead bound must be >= 1 .*got 0 in 'lead:0'"),
        ("lead:two", r"bad lead bound in 'lead:two'"),
        ("lead:", r"bad lead bound in 'lead:'"),
        # the backend's spelling names another bound: refused, not read as the simulator's gate
        (
            "ssp:2",
            r"'ssp:2' is the backend's staleness bound \(a contribution at most S steps late\); the "
            r"simulator's SSP gate is 'lead:S'",
        ),
        ("ssp:0", r"'ssp:0' is the backend's staleness bound"),
        (3, r"model must be a string"),
    ],
)
def test_parse_model_rejects(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_model(spec)


@pytest.mark.parametrize(
    ("bound", "pushed", "applied", "worker", "expected"),
    [
        # After its next update is applied the worker may be at most s ahead of the slowest.
        (2, [0, 0, 0], [0, 0, 0], 1, True),
        (2, [0, 1, 0], [0, 1, 0], 1, True),  # would be 2 ahead: allowed
        (2, [0, 2, 0], [0, 2, 0], 1, False),  # would be 3 ahead
        (2, [1, 2, 1], [1, 2, 1], 1, True),
        (1, [0, 1], [0, 1], 1, False),  # s = 1 is lock-step
        (1, [1, 1], [1, 1], 0, True),
        # In flight (pushed, not yet applied) counts against the worker, not for it.
        (2, [2, 0], [0, 0], 0, False),
        (2, [1, 0], [0, 0], 0, True),
    ],
)
def test_ssp_gate(bound, pushed, applied, worker, expected):
    assert ConsistencyModel("ssp", bound).may_start(worker, pushed, applied) is expected


def test_asp_gate_always_open_and_bsp_never():
    assert ConsistencyModel("asp").may_start(0, [100, 0], [100, 0])
    assert not ConsistencyModel("bsp").may_start(0, [0, 0], [0, 0])


@pytest.mark.parametrize(
    ("spec", "workers", "network", "expected"),
    [
        ("bsp", 8, False, 0),
        ("asp", 8, False, math.inf),
        ("lead:1", 8, False, 7),
        ("lead:2", 8, False, 21),
        ("lead:2", 8, True, 22),
        ("lead:8", 8, False, 105),
        ("lead:3", 2, True, 7),
    ],
)
def test_staleness_bound_formula(spec, workers, network, expected):
    assert staleness_bound(parse_model(spec), workers, network) == expected
