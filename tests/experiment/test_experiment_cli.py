"""Bad command lines: each is a ValueError naming the flag (exit status 2 from main), checked before any process
starts."""

from __future__ import annotations

import pytest

from delaycomm.experiment import CONFIGS
from delaycomm.experiment.cli import main, parse_args

NAMES = ", ".join(c.name for c in CONFIGS)

BAD = [
    (["--configs", "bsp,nope"], f"argument --configs: unknown config 'nope'; accepted: {NAMES}"),
    (["--configs", "bsp,bsp"], "argument --configs: config 'bsp' is listed twice"),
    (["--model", "resnet"], "argument --model: invalid choice: 'resnet' (choose from 'mlp', 'logreg')"),
    (["--epochs", "-1"], "argument --epochs: -1 is too small; expected an integer >= 1"),
    (["--epochs", "0"], "argument --epochs: 0 is too small; expected an integer >= 1"),
    (["--epochs", "two"], "argument --epochs: 'two' is not an integer; expected an integer >= 1"),
    (["--budget", "-5"], "argument --budget: -5 is out of range; expected a finite number > 0"),
    (["--budget", "0"], "argument --budget: 0 is out of range; expected a finite number > 0"),
    (["--budget", "nan"], "argument --budget: nan is out of range; expected a finite number > 0"),
    (["--nproc", "1"], "argument --nproc: 1 is too small; expected an integer in [2, 64]"),
    (["--nproc", "65"], "argument --nproc: 65 is too large; expected an integer in [2, 64]"),
    (["--batch-size", "0"], "argument --batch-size: 0 is too small; expected an integer >= 1"),
    (["--lr", "0"], "argument --lr: 0 is out of range; expected a finite number > 0"),
    (["--momentum", "1"], "argument --momentum: 1 is out of range; expected a finite number in [0, 1)"),
    (["--seed", "-3"], "argument --seed: -3 is too small; expected an integer in [0, 2^63)"),
    (["--timeout", "-1"], "argument --timeout: -1 is out of range; expected a finite number > 0"),
    (["--step-ms", "0"], "argument --step-ms: 0 is out of range; expected a finite number > 0"),
    (
        ["--delay", "none"],
        "argument --delay: expected a delay distribution for the delayed configs, got 'none'; to "
        "compare without delay, run --configs gloo,bsp",
    ),
    (["--plot", "out.txt"], "argument --plot: 'out.txt': expected a file name ending in .png, .pdf, .svg"),
    (
        ["--json", "/no/such/dir/x.json"],
        "argument --json: '/no/such/dir/x.json': directory '/no/such/dir' does not exist",
    ),
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
    # the backend's own parser (the C++ one, through the binding): its reason, then the syntax it accepts
    assert text.startswith(f"argument --delay: invalid delay spec {spec!r}: "), text
    assert "expected a delay spec: none, const:50ms" in text


def test_main_exits_2_with_the_message_on_stderr(capsys):
    assert main(["--model", "resnet"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "python -m delaycomm.experiment: error: argument --model: invalid choice: 'resnet' (choose from "
        "'mlp', 'logreg')\n"
    )


def test_batch_larger_than_a_shard_is_refused_before_training(capsys):
    # 1437 training samples over 2 ranks: at most 718 per rank and step. Checked once the data is loaded,
    # before any process starts.
    assert main(["--batch-size", "719", "--configs", "bsp", "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        "python -m delaycomm.experiment: error: argument --batch-size: expected at most 718 (the 1437 training samples "
        "split over 2 ranks), got 719\n"
    )


def test_defaults_and_quick():
    hp, configs, _ = parse_args([])
    assert [c.name for c in configs] == [c.name for c in CONFIGS]
    assert (hp.model, hp.nproc, hp.epochs, hp.batch_size, hp.seed, hp.budget_s) == ("mlp", 2, 30, 32, 0, None)
    hp, _, _ = parse_args(["--quick"])
    assert (hp.epochs, hp.timeout_s) == (2, 120.0)
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


def test_run_update_stats_turns_it_on_for_the_stale_configs_only(capsys):
    assert main(["run", "--update-stats", "--list-configs"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()}
    for name in ("ssp2-ema", "asp-apply", "asp-drop"):
        assert "DELAYCOMM_UPDATE_STATS=1" in lines[name], lines[name]
    for name in ("gloo", "bsp", "bsp-delay", "straggler"):
        assert "DELAYCOMM_UPDATE_STATS" not in lines[name], lines[name]
