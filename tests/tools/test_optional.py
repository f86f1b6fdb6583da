"""The tools' optional modules: a command whose flag needs one that is missing exits 2 naming the extra to install,
before any work, never with a traceback; ``pyproject.toml``'s ``tools`` extra installs every one of them.

A module is hidden as Python's import system allows: ``sys.modules[name] = None`` makes ``import name`` raise
``ImportError``. The CLIs run in this process (their ``main``, or ``python -m`` through runpy): what is tested is
the check, not an interpreter's start-up.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import tomllib

from delaycomm._tools import optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _hide(monkeypatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_the_tools_extra_installs_every_optional_module():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    listed = {req.split(">")[0].split("=")[0].split("<")[0].strip().lower() for req in extras[optional.EXTRA]}
    assert {package for package, _ in optional.OPTIONAL.values()} == listed
    # the test extra installs them too: the tests exercise plots, bars and the experiment
    test_listed = {req.split(">")[0].strip().lower() for req in extras["test"]}
    assert listed <= test_listed


def test_require_names_the_package_and_the_extra(monkeypatch):
    _hide(monkeypatch, "sklearn")
    with pytest.raises(optional.MissingOptional) as e:
        optional.require("sklearn")
    assert str(e.value) == (
        "the experiment's data set needs scikit-learn, which is not installed: pip install scikit-learn"
    )
    assert optional.require("tqdm").__name__ == "tqdm"  # present: the module itself
    with pytest.raises(KeyError, match="'yaml' is not an optional module of the tools"):
        optional.require("yaml")


def test_a_progress_bar_by_default_is_left_out_without_tqdm_and_asked_for_is_an_error(monkeypatch):
    assert optional.progress_enabled("auto", is_terminal=True)
    assert not optional.progress_enabled("auto", is_terminal=False)
    assert optional.progress_enabled("on", is_terminal=False)
    _hide(monkeypatch, "tqdm")
    assert not optional.progress_enabled("auto", is_terminal=True)
    assert not optional.progress_enabled("off", is_terminal=True)
    with pytest.raises(optional.MissingOptional, match="a progress bar needs tqdm, which is not installed"):
        optional.progress_enabled("on", is_terminal=True)


def test_python_m_delaycomm_sim_plot_without_matplotlib_exits_2_naming_the_extra(tmp_path, monkeypatch, capsys):
    """The newcomer's command as typed (``python -m delaycomm.sim table --plot DIR``, run as ``__main__`` by runpy in
    this process), with matplotlib hidden: refused before the simulation runs."""
    import runpy

    out = tmp_path / "plots"
    _hide(monkeypatch, "matplotlib", "matplotlib.pyplot")
    monkeypatch.setattr(sys, "argv", ["delaycomm.sim", "table", "--plot", str(out)])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("delaycomm.sim", run_name="__main__", alter_sys=True)
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert (
        "error: argument --plot: plotting needs matplotlib, which is not installed: pip install matplotlib"
        in captured.err
    )
    assert captured.out == "" and not out.exists()  # nothing simulated, nothing written


@pytest.mark.parametrize(
    "argv",
    [
        ["-b", "8", "-e", "8", "--plot", "PLOT"],  # python -m delaycomm.bench --plot
        ["--from-json", "RECORD", "--plot", "PLOT"],
    ],
)
def test_bench_plot_without_matplotlib_exits_2_before_measuring(argv, tmp_path, monkeypatch, capsys):
    from delaycomm.bench import cli

    measured = []
    monkeypatch.setattr(cli, "_measure", lambda *a: measured.append(a))
    _hide(monkeypatch, "matplotlib", "matplotlib.pyplot")
    argv = [str(tmp_path / "p.png") if a == "PLOT" else str(tmp_path / "r.json") if a == "RECORD" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and not measured
    err = capsys.readouterr().err
    assert "error: argument --plot: plotting needs matplotlib, which is not installed: pip install matplotlib" in err


@pytest.mark.parametrize("command", [[], ["percall"]], ids=["bench", "percall"])
def test_bench_progress_on_without_tqdm_exits_2(command, monkeypatch, capsys):
    from delaycomm.bench import cli, percall

    monkeypatch.setattr(cli, "_measure", lambda *a: pytest.fail("measured"))
    monkeypatch.setattr(percall, "measure", lambda *a: pytest.fail("measured"))
    _hide(monkeypatch, "tqdm")
    with pytest.raises(SystemExit) as e:
        cli.main([*command, "-b", "8", "-e", "8", "--progress", "on"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --progress: a progress bar needs tqdm, which is not installed: pip install tqdm" in err


def test_profile_png_without_matplotlib_exits_2_naming_the_extra_and_keeps_the_profile(tmp_path, monkeypatch, capsys):
    """``python -m delaycomm profile STATS -o P.json --png P.png`` (its ``main``, in this process) with matplotlib
    hidden: exit 2 with ``error:`` and the extra; the profile asked for is written, the plot is not."""
    from delaycomm.__main__ import main
    from tests.delay.test_profile_replay import _stats_file

    stats, out, png = _stats_file(tmp_path / "s.json", 2), tmp_path / "p.json", tmp_path / "p.png"
    _hide(monkeypatch, "matplotlib", "matplotlib.pyplot")
    assert main(["profile", stats, "-o", str(out), "--png", str(png)]) == 2
    err = capsys.readouterr().err
    assert (
        "error: delaycomm: profile: --png: plotting needs matplotlib, which is not installed: pip install "
        "matplotlib; the profile was written" in err
    )
    assert json.loads(out.read_text())["metadata"]["world_size"] == 2 and not png.exists()
