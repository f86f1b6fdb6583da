"""Options: keyword > configure() > environment > default; every bad value is a ValueError that names the option,
its variable, the value and what is accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import delaycomm
from delaycomm._config import OPTIONS, DelayConfig, configure, format_value, resolve

ENV0: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _clean_process_config():
    configure()
    yield
    configure()


def test_defaults():
    cfg = resolve(env=ENV0)
    assert cfg.delay == "none"
    assert cfg.delay_fraction == 0.0
    assert cfg.delay_ranks is None and cfg.delay_ops is None
    assert cfg.delay_where == "network"
    assert cfg.staleness == "bsp" and cfg.stale_policy == "ema" and cfg.ema_alpha == 0.1
    assert cfg.step_ms is None
    assert cfg.nccl_algo == "allreduce:tree" and cfg.nccl_buffsize == 2097152
    assert cfg.stats is None and cfg.seed == 0 and cfg.slowdown == ()
    assert set(cfg.sources.values()) == {"default"}


def test_precedence_keyword_over_configure_over_env_over_default():
    env = {"DELAYCOMM_EMA_ALPHA": "0.5", "DELAYCOMM_SEED": "7", "DELAYCOMM_STALE_POLICY": "drop"}
    configure(seed=9, stale_policy="apply")
    cfg = resolve(DelayConfig(stale_policy="ema"), env=env)
    assert cfg.ema_alpha == 0.5 and cfg.sources["ema_alpha"] == "environment (DELAYCOMM_EMA_ALPHA)"
    assert cfg.seed == 9 and cfg.sources["seed"] == "keyword"
    assert cfg.stale_policy == "ema"
    assert cfg.staleness == "bsp" and cfg.sources["staleness"] == "default"


@pytest.mark.parametrize(
    "name, raw, expected",
    [
        ("delay_fraction", "0.25", 0.25),
        ("delay_ranks", "0,3", (0, 3)),
        ("delay_ranks", [2, 0, 2], (0, 2)),
        ("delay_ranks", "all", None),
        ("delay_ops", "all_reduce,broadcast", ("allreduce", "broadcast")),
        ("delay_where", "HOST", "host"),
        ("slowdown", "0:4x", ((0, 4.0),)),
        ("slowdown", "0:4x, 2:1.5", ((0, 4.0), (2, 1.5))),
        ("staleness", "ssp:2", "ssp:2"),
        ("staleness", "ssp:0", "bsp"),
        ("staleness", "ASP", "asp"),
        ("ema_alpha", "1", 1.0),
        ("step_ms", "12.5", 12.5),
        ("step_ms", "auto", None),
        ("nccl_algo", "auto", "auto"),
        ("nccl_algo", "allreduce:tree;broadcast:ring", "allreduce:tree;broadcast:ring"),
        ("nccl_algo", "^ring", "^ring"),
        ("nccl_buffsize", "2MiB", 2 << 20),
        ("max_pending", "5", 5),
    ],
)
def test_good_values_from_env(name, raw, expected):
    env = {"DELAYCOMM_" + name.upper(): raw} if isinstance(raw, str) else {}
    cfg = resolve(DelayConfig(**{name: raw}) if not isinstance(raw, str) else None, env=env)
    assert cfg.values[name] == expected


BAD = [
    ("delay_fraction", "1.5", "a number in [0, 1]"),
    ("delay_fraction", "nan", "a number in [0, 1]"),
    ("delay_ranks", "0,x", "'all' or a list of ranks"),
    ("delay_ranks", "-1", "'all' or a list of ranks"),
    ("delay_ops", "allreduce,foo", "'all' or a comma-separated list of"),
    ("delay_where", "disk", "one of 'network', 'host'"),
    ("slowdown", "0:0.5x", "factor >= 1"),
    ("slowdown", "zero:4x", "RANK:FACTORx"),
    ("seed", "-3", "an integer in [0, 2^63)"),
    ("seed", "1.5", "an integer in [0, 2^63)"),
    ("staleness", "ssp", "'bsp', 'ssp:S'"),
    ("staleness", "ssp:-1", "'bsp', 'ssp:S'"),
    ("stale_policy", "average", "one of 'ema', 'apply', 'drop'"),
    ("ema_alpha", "0", "a number in (0, 1]"),
    ("ema_alpha", "1.01", "a number in (0, 1]"),
    ("step_ms", "-1", "'auto' (calibrated at init) or a number of milliseconds > 0"),
    ("max_pending", "0", "an integer in [1, 1048576]"),
    ("nccl_algo", "Tre", "NCCL_ALGO value"),
    ("nccl_algo", "allreduce:tree;bogus:ring", "NCCL_ALGO value"),
    ("nccl_buffsize", "2 parsecs", "a positive number of bytes"),
    ("nccl_buffsize", "0", "a positive number of bytes"),
    ("stats", "/no/such/dir/x.json", "a path to a JSON file in an existing directory"),
]


@pytest.mark.parametrize("name, raw, accepted", BAD)
def test_bad_env_value_names_option_variable_value_and_accepted(name, raw, accepted):
    var = "DELAYCOMM_" + name.upper()
    with pytest.raises(ValueError) as info:
        resolve(env={var: raw})
    msg = str(info.value)
    assert f"option '{name}'" in msg and var in msg and repr(raw) in msg and accepted in msg, msg


@pytest.mark.parametrize("name, raw, accepted", BAD)
def test_bad_keyword_raises_at_construction(name, raw, accepted):
    with pytest.raises(ValueError, match=f"option '{name}'.*from a keyword: expected"):
        DelayConfig(**{name: raw})


def test_unknown_keyword_and_unknown_variable():
    with pytest.raises(ValueError, match="unknown option.*ema_alhpa"):
        DelayConfig(ema_alhpa=0.2)
    with pytest.raises(ValueError, match="unknown environment variable.*DELAYCOMM_EMA_ALHPA"):
        resolve(env={"DELAYCOMM_EMA_ALHPA": "0.2"})


def test_bool_is_not_a_number():
    with pytest.raises(ValueError, match="option 'ema_alpha'"):
        DelayConfig(ema_alpha=True)


def test_pg_options_must_be_delayconfig():
    with pytest.raises(ValueError, match="pg_options must be a delaycomm.DelayConfig, got dict"):
        resolve({"delay": "none"}, env=ENV0)


def test_format_value_round_trips_through_the_parsers():
    cfg = resolve(DelayConfig(delay_ranks=[0, 2], slowdown="1:2.5x", delay_ops="broadcast"), env=ENV0)
    for opt in OPTIONS:
        text = format_value(opt.name, cfg.values[opt.name])
        again = resolve(env={opt.env: text})
        assert again.values[opt.name] == cfg.values[opt.name], (opt.name, text)


# Property: random strings to every parser give a valid config or a ValueError, never anything else.
@settings(max_examples=60, deadline=None)
@given(st.sampled_from([o.name for o in OPTIONS]), st.text(max_size=40))
def test_random_strings_give_config_or_value_error(name, text):
    try:
        resolve(env={"DELAYCOMM_" + name.upper(): text})
    except ValueError as e:
        assert f"option '{name}'" in str(e)


def test_cli_shows_effective_config_and_sources():
    env = {**os.environ, "DELAYCOMM_EMA_ALPHA": "0.25"}
    out = subprocess.run([sys.executable, "-m", "delaycomm", "config", "--json"], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    data = json.loads(out)
    assert data["config"]["ema_alpha"] == 0.25
    assert data["sources"]["ema_alpha"] == "environment (DELAYCOMM_EMA_ALPHA)"
    assert data["nccl"]["NCCL_ALGO"]["value"] == "allreduce:tree"
    table = subprocess.run([sys.executable, "-m", "delaycomm", "config"], env=env, capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert "ema_alpha" in table and "0.25" in table and "DELAYCOMM_EMA_ALPHA" in table


def test_cli_rejects_bad_environment():
    env = {**os.environ, "DELAYCOMM_STALENESS": "sometimes"}
    proc = subprocess.run([sys.executable, "-m", "delaycomm", "config"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "option 'staleness'" in proc.stderr and "DELAYCOMM_STALENESS" in proc.stderr


def test_nccl_settings_before_any_group(monkeypatch):
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    monkeypatch.delenv("NCCL_BUFFSIZE", raising=False)
    s = delaycomm.nccl_settings()
    assert s["NCCL_ALGO"]["value"] == "allreduce:tree"
    assert s["NCCL_BUFFSIZE"]["value"] == "2097152"
    monkeypatch.setenv("NCCL_ALGO", "ring")
    s = delaycomm.nccl_settings()
    assert s["NCCL_ALGO"] == {"value": "ring", "source": "user environment"}


def test_public_api_is_documented():
    for name in delaycomm.__all__:
        obj = getattr(delaycomm, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__) > 20, name


def test_readme_lists_every_option():
    readme = (__import__("pathlib").Path(__file__).resolve().parents[1] / "README.md").read_text()
    for opt in OPTIONS:
        assert f"| `{opt.name}` | `{opt.env}` |" in readme, f"README's options table lacks {opt.name}"
