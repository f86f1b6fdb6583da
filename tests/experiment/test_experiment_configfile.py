"""Config files of DELAYCOMM_* settings: what is accepted, and each error naming the file and the line."""

from __future__ import annotations

import pytest

from delaycomm.experiment.configfile import parse_config_file


def _file(tmp_path, text):
    path = tmp_path / "configs.txt"
    path.write_text(text)
    return str(path)


def test_sections_in_file_order(tmp_path):
    path = _file(
        tmp_path,
        "# my configs\n\n[ref]   # nothing set\n[tail-ssp2]\nDELAYCOMM_DELAY = pareto:p50=2ms,p99=40ms\n"
        "DELAYCOMM_STALENESS=ssp:2\n",
    )
    configs = parse_config_file(path)
    assert [c.name for c in configs] == ["ref", "tail-ssp2"]
    assert configs[0].env == {}
    assert configs[1].env == {"DELAYCOMM_DELAY": "pareto:p50=2ms,p99=40ms", "DELAYCOMM_STALENESS": "ssp:2"}
    assert configs[1].source == f"{path}:4"


BAD = [
    ("DELAYCOMM_DELAY=const:1ms\n", ":1: 'DELAYCOMM_DELAY=const:1ms' is outside a section; start a config with [name]"),
    ("[a b]\n", ":1: config name 'a b' is not accepted; expected letters, digits, _ . -"),
    ("[a]\n[a]\n", ":2: config [a] is defined twice"),
    ("[a]\nDELAY=const:1ms\n", ":2: 'DELAY=const:1ms' is not DELAYCOMM_<OPTION> = value"),
    ("[a]\nDELAYCOMM_SEED=3\n", ":2: DELAYCOMM_SEED is set by the experiment for every run"),
    ("[a]\nDELAYCOMM_STATS=/tmp/x\n", ":2: DELAYCOMM_STATS is set by the experiment for every run"),
    ("[a]\nDELAYCOMM_DELAY=const:1ms\nDELAYCOMM_DELAY=const:2ms\n", ":3: DELAYCOMM_DELAY is set twice in config [a]"),
    (
        "[a]\nDELAYCOMM_DELAYY=const:1ms\n",
        ":1: config [a]: delaycomm: unknown environment variable(s) DELAYCOMM_DELAYY",
    ),
    (
        "[a]\nDELAYCOMM_STALENESS=ssp:x\n",
        ":1: config [a]: delaycomm: invalid value 'ssp:x' for option 'staleness' from the environment variable "
        "DELAYCOMM_STALENESS",
    ),
    ("# nothing\n", "defines no config; start one with [name]"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[m[:40] for _, m in BAD])
def test_errors_name_the_file_and_line(tmp_path, text, message):
    path = _file(tmp_path, text)
    with pytest.raises(ValueError) as e:
        parse_config_file(path)
    assert message in str(e.value), str(e.value)
    assert path in str(e.value)
