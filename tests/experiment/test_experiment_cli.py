"""Bad command lines: each is a ValueError naming the flag (exit status 2 from main), checked before any process
starts."""

from __future__ import annotations

import pytest

from delaycomm.experiment import CONFIGS
from delaycomm.experiment.cli import main, parse_args

NAMES = ", ".join(c.name for c in CONFIGS)

BAD = [
    (["--configs", "bsp,nope"], f"--configs: unknown config 'nope'; accepted: {NAMES}"),
    (["--configs", "bsp,bsp"], "--configs: config 'bsp' is listed twice"),
    (["--model", "resnet"], "--model: unknown model 'resnet'; accepted: mlp, logreg"),
    (["--epochs", "-1"], "--epochs: expected an integer >= 1, got -1"),
    (["--epochs", "0"], "--epochs: expected an integer >= 1, got 0"),
    (["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
    (["--budget", "-5"], "--budget: expected a finite number in (0, inf), got -5"),
    (["--budget", "0"], "--budget: expected a finite number in (0, inf), got 0"),
    (["--budget", "nan"], "--budget: expected a finite number in (0, inf), got nan"),
    (["--nproc", "1"], "--nproc: expected an integer in [2, 64] (a comparison of communication needs two ranks "
                       "or more), got 1"),
    (["--batch-size", "0"], "--batch-size: expected an integer >= 1, got 0"),
    (["--lr", "0"], "--lr: expected a finite number in (0, inf), got 0"),
    (["--momentum", "1"], "--momentum: expected a finite number in [0, 1), got 1"),
    (["--seed", "-3"], "--seed: expected an integer in [0, 2^63), got -3"),
    (["--timeout", "-1"], "--timeout: expected a finite number in (0, inf), got -1"),
    (["--step-ms", "0"], "--step-ms: expected a finite number in (0, inf), got 0"),
    (["--delay", "none"], "--delay: expected a delay distribution for the delayed configs, got 'none'; to compare "
                          "without delay, run --configs gloo,bsp"),
    (["--plot", "out.txt"], "--plot: expected a file name ending in .png, .pdf, .svg, got 'out.txt'"),
    (["--json", "/no/such/dir/x.json"], "--json: directory '/no/such/dir' does not exist"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_argument_is_a_value_error_naming_the_flag(argv, message):
    with pytest.raises(ValueError) as e:
        parse_args(argv)
    assert str(e.value) == message


@pytest.mark.parametrize("spec", ["exp:p99=", "gauss:p50=3ms", "exp:p99=-4ms", "const:50"])
def test_bad_delay_spec_names_the_flag_and_the_option(spec):
    with pytest.raises(ValueError) as e:
        parse_args(["--delay", spec])
    text = str(e.value)
    assert text.startswith(f"--delay: delaycomm: invalid value {spec!r} for option 'delay'"), text
    assert "expected" in text


def test_main_exits_2_with_the_message_on_stderr(capsys):
    assert main(["--model", "resnet"]) == 2
    err = capsys.readouterr().err
    assert err == ("python -m delaycomm.experiment: error: --model: unknown model 'resnet'; "
                   "accepted: mlp, logreg\n")


def test_batch_larger_than_a_shard_is_refused_before_training(capsys):
    # 1437 training samples over 2 ranks: at most 718 per rank and step. Checked once the data is loaded,
    # before any process starts.
    assert main(["--batch-size", "719", "--configs", "bsp", "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        "python -m delaycomm.experiment: error: --batch-size: expected at most 718 (the 1437 training samples "
        "split over 2 ranks), got 719\n")


def test_defaults_and_quick():
    hp, configs, _ = parse_args([])
    assert [c.name for c in configs] == [c.name for c in CONFIGS]
    assert (hp.model, hp.nproc, hp.epochs, hp.batch_size, hp.seed, hp.budget_s) == ("mlp", 2, 30, 32, 0, None)
    hp, _, _ = parse_args(["--quick"])
    assert (hp.epochs, hp.timeout_s) == (4, 120.0)
    hp, _, _ = parse_args(["--quick", "--epochs", "2"])
    assert hp.epochs == 2
    hp, configs, _ = parse_args(["--configs", "asp-drop, gloo", "--budget", "1.5"])
    assert [c.name for c in configs] == ["asp-drop", "gloo"]
    assert hp.budget_s == 1.5 and hp.epochs == 1_000_000


def test_list_configs_prints_every_config_with_its_keywords(capsys):
    assert main(["--list-configs", "--delay", "exp:p99=20ms", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    for c in CONFIGS:
        assert f"  {c.name} " in out
    assert "delay='exp:p99=20ms'" in out and "seed=7" in out
