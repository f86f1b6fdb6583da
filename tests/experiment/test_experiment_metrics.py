"""The metric contract: the line report() writes is the line parse() reads; bad lines name themselves."""

from __future__ import annotations

import pytest
import torch

from delaycomm.experiment import metrics
from delaycomm.experiment.metrics import MetricLineError, format_line, parse


def test_report_writes_what_parse_reads(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    metrics.report(step=3, loss=torch.tensor(0.25))
    metrics.report(loss=0.125, acc=0.5)
    out = capsys.readouterr().out
    assert out == "DELAYCOMM_METRIC step=3 loss=0.25\nDELAYCOMM_METRIC loss=0.125 acc=0.5\n"
    p = parse(out.splitlines())
    assert p.final == {"loss": 0.125, "acc": 0.5}
    assert p.curves == {"loss": [(3, 0.25)]}


def test_report_prints_on_rank_0_only(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    metrics.report(loss=1.0)
    assert capsys.readouterr().out == ""


def test_last_value_counts_and_curves_keep_every_step():
    lines = [
        "step 1 loss 3.0",  # the job's own output
        "DELAYCOMM_METRIC step=1 loss=3.0",
        "DELAYCOMM_METRIC step=2 loss=2.0 lr=0.1",
        "DELAYCOMM_METRICS are not ours",
        "  DELAYCOMM_METRIC loss=1.5  ",
    ]
    p = parse(lines)
    assert p.final == {"loss": 1.5, "lr": 0.1}
    assert p.curves == {"loss": [(1, 3.0), (2, 2.0)], "lr": [(2, 0.1)]}
    assert p.lines == 3


@pytest.mark.parametrize(
    "line,message",
    [
        ("DELAYCOMM_METRIC", "no name=value after DELAYCOMM_METRIC"),
        ("DELAYCOMM_METRIC loss", "'loss' is not name=value"),
        ("DELAYCOMM_METRIC 1x=2", "'1x=2' is not name=value"),
        ("DELAYCOMM_METRIC loss=abc", "loss='abc' is not a number"),
        ("DELAYCOMM_METRIC loss=nan", "loss=nan is not a finite number"),
        ("DELAYCOMM_METRIC step=-1 loss=1", "step='-1' is not an integer >= 0"),
        ("DELAYCOMM_METRIC step=4", "a step with no metric"),
    ],
)
def test_a_bad_line_is_an_error_naming_it(line, message):
    with pytest.raises(MetricLineError) as e:
        parse(["ok", line], "rank 0's stdout")
    assert str(e.value).startswith(f"rank 0's stdout line 2 ({line!r}): {message}"), str(e.value)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({}, "give at least one metric"),
        ({"step": -1, "loss": 1.0}, "step must be an integer >= 0, got -1"),
        ({"step": 1, "bad-name": 1.0}, "metric name 'bad-name' is not accepted"),
        ({"loss": float("inf")}, "loss=inf is not a finite number"),
        ({"loss": "0.3"}, "loss: a metric's value must be a number, got str"),
    ],
)
def test_report_refuses_what_parse_would_refuse(kwargs, message):
    with pytest.raises(ValueError, match=message):
        format_line(**kwargs)


def test_seed(monkeypatch):
    monkeypatch.delenv("DELAYCOMM_SEED", raising=False)
    assert metrics.seed() == 0 and metrics.seed(7) == 7
    monkeypatch.setenv("DELAYCOMM_SEED", "12")
    assert metrics.seed() == 12
    monkeypatch.setenv("DELAYCOMM_SEED", "x")
    with pytest.raises(ValueError, match=r"DELAYCOMM_SEED='x' is not an integer"):
        metrics.seed()
