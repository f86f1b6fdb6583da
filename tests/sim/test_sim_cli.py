"""The command line: output, JSON, plots, determinism and bad input."""

from __future__ import annotations

import json

import pytest

from delaycomm.sim import cli

from ._fakes import FakeSampler


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def fail_cli(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(list(argv))
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_table_is_reproducible_bit_for_bit(capsys, tmp_path):
    outs = []
    for i in range(2):
        path = tmp_path / f"t{i}.json"
        code, out, _ = run_cli(capsys, "table", "--seeds", "2", "--budget", "120", "--json", str(path), "--no-progress")
        assert code == 0
        doc = json.loads(path.read_text())
        doc.pop("elapsed_s")
        outs.append((out.rsplit("\n# ", 1)[0], json.dumps(doc["rows"]), json.dumps(doc["sweep"])))
    assert outs[0] == outs[1]
    assert "sync (BSP)" in outs[0][0] and "SSP lead:2" in outs[0][0] and "async (ASP)" in outs[0][0]
    assert "published numbers not compared" in outs[0][0]  # --budget differs from the seed's


def test_table_writes_json_and_plots(capsys, tmp_path):
    code, _, _ = run_cli(
        capsys,
        "table",
        "--seeds",
        "1",
        "--budget",
        "40",
        "--sweep",
        "2,inf",
        "--json",
        str(tmp_path / "t.json"),
        "--plot",
        str(tmp_path / "plots"),
        "--no-progress",
    )
    assert code == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    assert [r["model"] for r in doc["rows"]] == ["bsp", "lead:2", "asp"]
    run = doc["rows"][2]["runs"][0]
    assert {"updates", "updates_per_s", "mean_staleness", "max_staleness", "final_loss", "curve_time_s"} <= set(run)
    for name in ("table_loss.png", "table_staleness.png", "sweep_staleness.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_with_delay_uses_the_injected_sampler(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "delay_sampler_class", lambda: FakeSampler)
    code, out, _ = run_cli(
        capsys,
        "run",
        "--lead",
        "2",
        "--delay",
        "const:500ms",
        "--budget",
        "30",
        "--workers",
        "3",
        "--policy",
        "ema",
        "--step",
        "adadelay",
        "--json",
        str(tmp_path / "r.json"),
    )
    assert code == 0
    assert "lead:2" in out and "delay const:500ms" in out
    run = json.loads((tmp_path / "r.json").read_text())["runs"][0]
    assert run["config"]["delay"] == "const:500ms" and run["config"]["policy"] == "ema"
    assert run["max_staleness"] <= run["staleness_bound"] == 2 * 3 + 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["run", "--model", "hogwild"],
            r"argument --model: unknown consistency model 'hogwild': expected 'bsp', 'asp'",
        ),
        (["run", "--model", "lead:-2"], r"argument --model: lead bound must be >= 1 .*got -2"),
        (["run", "--model", "ssp:2"], r"argument --model: 'ssp:2' is the backend's staleness bound"),
        (["run", "--lead", "0"], r"argument --lead: 0 is too small; expected an integer >= 1"),
        (["run", "--budget", "-5"], r"argument --budget: -5 is out of range; expected a finite number > 0"),
        (["table", "--budget", "0"], r"argument --budget: 0 is out of range; expected a finite number > 0"),
        (["run", "--budget", "nan"], r"argument --budget: nan is out of range; expected a finite number > 0"),
        (["run", "--workers", "two"], r"argument --workers: 'two' is not an integer; expected an integer >= 1"),
        (["run", "--alpha", "1.5"], r"argument --alpha: 1.5 is out of range; expected a finite number in \(0, 1\]"),
        (["run", "--policy", "mean"], r"argument --policy: invalid choice: 'mean'"),
        (
            ["run", "--jitter", "gamma:1"],
            r"argument --jitter: bad jitter 'gamma:1': expected 'none', 'lognormal:SIGMA'",
        ),
        (["table", "--sweep", "2,x"], r"argument --sweep: 'x' is not an integer; expected an integer >= 1"),
        (["table", "--lead", "0"], r"argument --lead: 0 is too small; expected an integer >= 1"),
        (["table", "--sweep", "2,0"], r"argument --sweep: 0 is too small; expected an integer >= 1"),
        # no command: the table's options
        (["--budget", "0"], r"argument --budget: 0 is out of range; expected a finite number > 0"),
        (["run", "--model", "asp", "--lead", "2"], r"argument --lead: not allowed with argument --model"),
        (
            ["scenarios", "--short-budget", "500", "--delay", "none"],
            r"--short-budget \(500\) must be below --budget \(400\)",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_option(capsys, argv, message):
    import re

    err = fail_cli(capsys, *argv)
    assert re.search(message, err), err


def test_without_a_command_the_table_runs(monkeypatch):
    ran = []
    monkeypatch.setattr(cli, "cmd_table", lambda args: ran.append(args) or 0)
    assert cli.main([]) == 0
    assert cli.main(["--seeds", "3", "--no-progress"]) == 0
    assert [(a.command, a.seeds, a.lead, a.sweep, a.budget) for a in ran] == [
        ("table", None, 2, [2, 8, None], None),
        ("table", 3, 2, [2, 8, None], None),
    ]


def test_python_m_delaycomm_sim_runs_the_table_without_a_command(tmp_path, monkeypatch, capsys):
    # `python -m delaycomm.sim ...` runs the package's __main__ with sys.argv; so does runpy, in this process.
    import runpy

    monkeypatch.setattr(
        "sys.argv",
        [
            "python -m delaycomm.sim",
            "--seeds",
            "1",
            "--budget",
            "20",
            "--sweep",
            "2",
            "--no-progress",
            "--json",
            str(tmp_path / "t.json"),
        ],
    )
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("delaycomm.sim", run_name="__main__", alter_sys=True)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "# delaycomm.sim table: N=8" in out and "SSP lead:2" in out
    assert json.loads((tmp_path / "t.json").read_text())["command"] == "table"


def test_scenarios_judge_short_and_long_budgets(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "delay_sampler_class", lambda: FakeSampler)
    code, out, _ = run_cli(
        capsys,
        "scenarios",
        "--seeds",
        "2",
        "--budget",
        "30",
        "--short-budget",
        "10",
        "--delay",
        "exp:mean=300ms",
        "--json",
        str(tmp_path / "s.json"),
        "--no-progress",
    )
    assert code == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    assert [len(g["rows"]) for g in doc["groups"]] == [3, 5, 7]
    assert all([v["budget"] for v in g["verdicts"]] == [10, 30] for g in doc["groups"])
    assert "peak, 2nd half" in out
    assert out.count("best at 10 s (short budget)") == 3 and out.count("best at 30 s (long budget)") == 3
