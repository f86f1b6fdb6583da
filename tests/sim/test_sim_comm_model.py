"""``--comm-model``: the simulator prices a step's communication with the collectives' cost model
(docs/costmodel.md), the same one ``python -m delaycomm profile --ranks`` re-targets profiles with."""

from __future__ import annotations

import json

import pytest

from delaycomm import costmodel as cm
from delaycomm.sim import cli


def _model_file(tmp_path) -> tuple[str, cm.CostModel]:
    fit = cm.CollectiveFit("all_reduce", 4e-6, 10e-6, 400e9, 45e9, rows=0, rms_relative_error=0.0)
    model = cm.CostModel({"all_reduce": fit})
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"format": "delaycomm-profile", "metadata": {"costmodel": model.as_dict()}}))
    return str(p), model


def test_the_step_communication_time_is_the_models_all_reduce_over_the_workers(tmp_path, capsys):
    path, model = _model_file(tmp_path)
    out = tmp_path / "r.json"
    argv = ["run", "--model", "bsp", "--budget", "30", "--workers", "4", "--no-progress", "--json", str(out)]
    assert cli.main([*argv, "--comm-model", path, "--comm-bytes", "64M", "--comm-nodes", "2"]) == 0
    run = json.loads(out.read_text())["runs"][0]
    want = model.seconds("all_reduce", 64 << 20, cm.Topology(4, 2))
    assert run["config"]["comm"] == pytest.approx(want) and want > 1e-3  # 64 MiB at 45 GB/s: milliseconds
    assert cli.main(argv) == 0  # without the option, seed 002's fixed 0.07 s
    assert json.loads(out.read_text())["runs"][0]["config"]["comm"] == 0.07
    capsys.readouterr()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--comm-bytes", "1M"], r"--comm-bytes and --comm-nodes need --comm-model FILE"),
        (["--comm-model", "{p}"], r"--comm-model needs --comm-bytes SIZE"),
        (["--comm-model", "{p}", "--comm-bytes", "1M", "--comm", "0.1"], r"--comm and --comm-model both set"),
        (["--comm-model", "{p}", "--comm-bytes", "1M", "--comm-nodes", "3"], r"4 ranks on 3 nodes"),
        (["--comm-model", "{missing}", "--comm-bytes", "1M"], r"cost model file '.*nope.json' cannot be read"),
    ],
)
def test_bad_model_options_exit_2_naming_the_option(tmp_path, capsys, extra, message):
    import re

    path, _ = _model_file(tmp_path)
    extra = [a.format(p=path, missing=str(tmp_path / "nope.json")) for a in extra]
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--model", "bsp", "--workers", "4", "--budget", "5", "--no-progress", *extra])
    assert e.value.code == 2
    assert re.search(message, capsys.readouterr().err)
