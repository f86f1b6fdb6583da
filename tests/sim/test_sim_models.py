"""Consistency-model specs, the SSP gate and the staleness-bound formula."""

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
        ("ssp:2", "ssp", 2, "ssp:2"),
        (" ssp:8 ", "ssp", 8, "ssp:8"),
        ("ssp:0", "bsp", None, "bsp"),
        ("ssp:inf", "asp", None, "asp"),
    ],
)
def test_parse_model_accepts(spec, kind, bound, label):
    model = parse_model(spec)
    assert (model.kind, model.bound, model.label) == (kind, bound, label)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("hogwild", r"unknown consistency model 'hogwild': expected 'bsp', 'asp', 'ssp:S'"),
        ("ssp:-1", r"SSP bound must be >= 0, got -1 in 'ssp:-1'"),
        ("ssp:two", r"bad SSP bound in 'ssp:two'"),
        ("ssp:", r"bad SSP bound in 'ssp:'"),
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
        ("ssp:1", 8, False, 7),
        ("ssp:2", 8, False, 21),
        ("ssp:2", 8, True, 22),
        ("ssp:8", 8, False, 105),
        ("ssp:3", 2, True, 7),
    ],
)
def test_staleness_bound_formula(spec, workers, network, expected):
    assert staleness_bound(parse_model(spec), workers, network) == expected
