"""Options: keyword > configure() > environment > default; every bad value is a ValueError in one format: the value,
the option, where the value came from, what is accepted (pinned exactly here)."""

from __future__ import annotations

import json
import math
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import delaycomm
from delaycomm._config import OPTIONS, DelayConfig, configure, format_value, resolve
from tests.harness import run_cli

ENV0: dict[str, str] = {}


def _outcome(call):
    """(what ``call`` returns, None), or (None, the message) when it raises ValueError (anything else propagates)."""
    try:
        return call(), None
    except ValueError as e:
        return None, str(e)


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
    auto = {"delay_mode", "delay_carrier"}  # resolved from auto (add and all without a profile)
    assert {k: v for k, v in cfg.sources.items() if k in auto} == dict.fromkeys(auto, "default (auto)")
    assert {v for k, v in cfg.sources.items() if k not in auto} == {"default"}


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
        ("slowdown", "1:1000x", ((1, 1000.0),)),
        ("staleness", "ssp:10000", "ssp:10000"),
        ("step_ms", "0.001", 0.001),
        ("step_ms", "86400000", 86400000.0),
        ("nccl_buffsize", "1GiB", 1 << 30),
        ("delay", "const:86400s", "const:86400s"),
        ("delay", "exp:p99=1ns", "exp:p99=1ns"),
        ("delay", "off", "none"),
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


# (option, raw value, what the message says after "from <origin>: "), pinned exactly.
_RANKS = "expected 'all' or a list of ranks in [0, 2147483647] such as '0' or '0,3'"
_SLOWDOWN = (
    "expected 'none' or RANK:FACTORx entries such as '0:4x' or '0:4x,2:1.5x' (each rank once, a factor in [1, 1000])"
)
_STALENESS = "expected 'bsp', 'ssp:S' with an integer S in [0, 10000], or 'asp'"
_STEP = "expected 'auto' (calibrated at init) or a number of milliseconds in [0.001, 86400000] (1 us to 24 h)"
_BYTES = (
    "expected a number of bytes in [1, 1GiB], optionally with K/M/G (KiB/MiB/GiB) such as 2097152 or '2MiB' "
    "(NCCL keeps it in a C int)"
)
_STATS = (
    "expected 'none', a directory (one JSON file per rank and group in it), or a JSON file path whose "
    "placeholders {rank}, {group} and {restart} name the rank, the group and torchrun's restart (see "
    "docs/config.md, 'Stats files')"
)
_SPECS = (
    "expected a delay spec: none, const:50ms, exp:p99=400ms, exp:mean=400ms, lognormal:p50=60ms,p99=400ms"
    "[,p999=2s], pareto:p50=60ms,p99=400ms[,p999=2s], trace:FILE, profile:FILE (durations need a unit: ns, us, ms, "
    "s; each is 0 or from 1ns to 86400s)"
)
_NCCL = (
    "expected 'auto' (leave NCCL's tuner alone) or an NCCL_ALGO value such as 'allreduce:tree', 'ring', "
    "'allreduce:tree;broadcast:ring' (algorithms: collnetchain, collnetdirect, nvls, nvlstree, pat, ring, tree)"
)
BAD = [
    ("delay", "exp:p99=400", "value of 'p99' '400' has no unit (expected one of ns, us, ms, s, e.g. 50ms); " + _SPECS),
    ("delay_fraction", "1.5", "expected a number in [0, 1]"),
    ("delay_fraction", "nan", "expected a number in [0, 1]"),
    ("delay_ranks", "0,x", _RANKS),
    ("delay_ranks", "-1", _RANKS),
    (
        "delay_ops",
        "allreduce,foo",
        "expected 'all' or a comma-separated list of: broadcast, allreduce, "
        "allreduce_coalesced, reduce, allgather, _allgather_base, allgather_coalesced, "
        "allgather_into_tensor_coalesced, "
        "gather, scatter, reduce_scatter, _reduce_scatter_base, reduce_scatter_tensor_coalesced, alltoall_base, "
        "alltoall, send, recv, recv_anysource, barrier",
    ),
    ("delay_where", "disk", "expected one of 'network', 'host'"),
    ("slowdown", "0:0.5x", _SLOWDOWN),
    ("slowdown", "zero:4x", _SLOWDOWN),
    ("seed", "-3", "expected an integer in [0, 2^63)"),
    ("seed", "1.5", "expected an integer in [0, 2^63)"),
    ("staleness", "ssp", _STALENESS),
    ("staleness", "ssp:-1", _STALENESS),
    ("stale_policy", "average", "expected one of 'ema', 'apply', 'drop'"),
    ("ema_alpha", "0", "expected a number in (0, 1]"),
    ("ema_alpha", "1.01", "expected a number in (0, 1]"),
    ("step_ms", "-1", _STEP),
    ("max_pending", "0", "expected an integer in [1, 1048576]"),
    ("nccl_algo", "Tre", _NCCL),
    ("nccl_algo", "allreduce:tree;bogus:ring", _NCCL),
    ("nccl_buffsize", "2 parsecs", _BYTES),
    ("nccl_buffsize", "0", _BYTES),
    ("stats", "/no/such/dir/x.json", "the directory '/no/such/dir' does not exist; " + _STATS),
    ("stats", "s-{pid}.json", "unknown placeholder {pid}; " + _STATS),
    ("stats", "s-{rank.json", "unbalanced braces (write {{ and }} for literal ones); " + _STATS),
    (
        "stats",
        "r{rank}/../stats.json",
        "'..' cancels the directory that holds {rank} (the path is 'stats.json' whatever the value), so the files "
        "would collide; " + _STATS,
    ),
]

# Values that overflow the native type they become, or pass a bound that keeps the
# arithmetic on them exact; each was accepted (or raised TypeError at group creation) before.
OVERFLOW = [
    ("staleness", "ssp:99999999999999999999999", _STALENESS),
    ("staleness", "ssp:10001", _STALENESS),
    ("slowdown", "0:1e19x", _SLOWDOWN),
    ("slowdown", "0:inf", _SLOWDOWN),
    ("slowdown", "3000000000:2x", _SLOWDOWN),
    ("step_ms", "1e300", _STEP),
    ("step_ms", "1e-300", _STEP),
    ("step_ms", "inf", _STEP),
    ("delay_ranks", "99999999999", _RANKS),
    ("delay_fraction", "1e400", "expected a number in [0, 1]"),
    ("seed", "9223372036854775808", "expected an integer in [0, 2^63)"),
    ("max_pending", "99999999999999999999", "expected an integer in [1, 1048576]"),
    ("nccl_buffsize", "2GiB", _BYTES),
    ("nccl_buffsize", "99999999999999999999G", _BYTES),
    (
        "delay",
        "const:1e300ms",
        "const duration '1e300ms' is longer than 86400s (a delay is 0 or from 1ns to 86400s, 24 hours); " + _SPECS,
    ),
    (
        "delay",
        "pareto:p50=1ns,p99=1e300s",
        "value of 'p99' '1e300s' is longer than 86400s (a delay is 0 or from 1ns to 86400s, 24 hours); " + _SPECS,
    ),
    (
        "delay",
        "exp:p99=0.5ns",
        "value of 'p99' '0.5ns' is shorter than 1ns (a delay is 0 or from 1ns to 86400s, 24 hours); " + _SPECS,
    ),
    # the same rank twice in slowdown (the last one used to win silently)
    ("slowdown", "0:4x,0:2x", "rank 0 is given twice; " + _SLOWDOWN),
]


@pytest.mark.parametrize("name, raw, why", BAD + OVERFLOW)
def test_bad_env_value_message(name, raw, why):
    var = "DELAYCOMM_" + name.upper()
    with pytest.raises(ValueError) as info:
        resolve(env={var: raw})
    assert str(info.value) == (
        f"delaycomm: invalid value {raw!r} for option '{name}' from the environment variable {var}: {why}"
    )


@pytest.mark.parametrize("name, raw, why", BAD + OVERFLOW)
def test_bad_keyword_message(name, raw, why):
    with pytest.raises(ValueError) as info:
        DelayConfig(**{name: raw})
    assert (
        str(info.value) == f"delaycomm: invalid value {raw!r} for option '{name}' from the keyword {name}= of "
        f"DelayConfig: {why}"
    )
    with pytest.raises(ValueError) as info:
        configure(**{name: raw})
    assert (
        str(info.value) == f"delaycomm: invalid value {raw!r} for option '{name}' from the keyword {name}= of "
        f"delaycomm.configure(): {why}"
    )


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: o.name)
def test_an_empty_variable_is_rejected_for_every_option(opt):
    # DELAYCOMM_DELAY='' (and SLOWDOWN, STATS) used to mean 'none' while every other empty variable was an error.
    with pytest.raises(ValueError) as info:
        resolve(env={opt.env: "  "})
    assert str(info.value) == (
        f"delaycomm: invalid value '  ' for option '{opt.name}' from the environment "
        f"variable {opt.env}: the value is empty (leave the option unset for its default)"
    )


def test_message_names_where_the_value_came_from_once():
    # No "(environment variable ...)" for a keyword, no variable named twice, no "expected delaycomm:".
    msgs = []
    for make in (
        lambda: resolve(env={"DELAYCOMM_DELAY": "exp:p99=400"}),
        lambda: DelayConfig(delay="exp:p99=400"),
        lambda: configure(delay="exp:p99=400"),
    ):
        with pytest.raises(ValueError) as info:
            make()
        msgs.append(str(info.value))
    for m in msgs:
        assert m.count("delaycomm:") == 1 and "expected delaycomm" not in m and "invalid delay spec" not in m, m
    assert msgs[0].count("DELAYCOMM_DELAY") == 1
    assert "DELAYCOMM_" not in msgs[1] and "DELAYCOMM_" not in msgs[2]


def test_unknown_keyword_and_unknown_variable():
    with pytest.raises(ValueError, match=r"unknown option.*ema_alhpa given to DelayConfig"):
        DelayConfig(ema_alhpa=0.2)
    with pytest.raises(ValueError, match=r"unknown environment variable.*DELAYCOMM_EMA_ALHPA"):
        resolve(env={"DELAYCOMM_EMA_ALHPA": "0.2"})


def test_bool_is_not_a_number():
    with pytest.raises(ValueError, match="option 'ema_alpha'"):
        DelayConfig(ema_alpha=True)
    with pytest.raises(ValueError, match="option 'seed'"):
        DelayConfig(seed=True)


def test_pg_options_must_be_delayconfig():
    with pytest.raises(ValueError, match=re.escape("pg_options must be a delaycomm.DelayConfig, got dict")):
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
    _, error = _outcome(lambda: resolve(env={"DELAYCOMM_" + name.upper(): text}))
    assert error is None or f"option '{name}'" in error


# Property over huge / tiny / NaN / infinite / overflowing numbers for every numeric option: the value
# is refused with the one message, or it is inside the documented range and fits the native options it becomes.
_NUMBER_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**200), max_value=2**200).map(str),
    st.from_regex(r"[+-]?\d{1,40}(\.\d{0,8})?([eE][+-]?\d{1,4})?", fullmatch=True),
    st.sampled_from(
        [
            "nan",
            "NaN",
            "inf",
            "-inf",
            "1e308",
            "1e309",
            "4.9e-324",
            "-0",
            "0x10",
            "1_000",
            "9223372036854775807",
            "9223372036854775808",
            "18446744073709551616",
            "2147483648",
        ]
    ),
)
# option -> how a number is written into its value
NUMERIC = [
    ("delay_fraction", "{}"),
    ("delay_burst", "{}"),
    ("ema_alpha", "{}"),
    ("step_ms", "{}"),
    ("seed", "{}"),
    ("max_pending", "{}"),
    ("nccl_buffsize", "{}"),
    ("nccl_buffsize", "{}G"),
    ("staleness", "ssp:{}"),
    ("slowdown", "0:{}x"),
    ("slowdown", "{}:2x"),
    ("delay_ranks", "{}"),
    ("delay", "const:{}ms"),
    ("delay", "exp:p99={}s"),
    ("delay", "exp:mean={}us"),
    ("delay", "lognormal:p50=1ms,p99={}s"),
    ("delay", "pareto:p50=1ns,p99={}s"),
]


def _fits(cfg) -> None:
    """The accepted config is in range and fills the native options (the Python -> C++ crossing)."""
    import warnings
    from datetime import timedelta

    import torch.distributed as dist

    from delaycomm import _C
    from delaycomm._backend import _fill_delay_options, _fill_stale_options

    v = cfg.values
    assert 0.0 <= v["delay_fraction"] <= 1.0 and 0.0 < v["ema_alpha"] <= 1.0
    assert v["delay_burst"] is None or 1.0 <= v["delay_burst"] <= 1e12
    assert v["step_ms"] is None or 1e-3 <= v["step_ms"] <= 86_400_000  # 1 us .. 24 h
    assert 0 <= v["seed"] < 2**63 and 1 <= v["max_pending"] <= 1 << 20
    assert 1 <= v["nccl_buffsize"] <= 1 << 30  # NCCL keeps it in a C int
    assert v["staleness"] in ("bsp", "asp") or 1 <= int(v["staleness"][4:]) <= 10_000
    assert all(0 <= r < 2**31 and 1.0 <= f <= 1000.0 for r, f in v["slowdown"])
    assert v["delay_ranks"] is None or all(0 <= r < 2**31 for r in v["delay_ranks"])
    native = _C.BackendOptions()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a tail past the timeout is a warning, not the point here
        _fill_delay_options(native, cfg, 0, timedelta(seconds=30))
    _fill_stale_options(native, cfg, dist.HashStore())
    if v["delay"] != "none":
        d = _C.parse_delay_spec(v["delay"])
        assert all(0.0 <= s <= 86400.0 for s in d["requested_percentiles_s"].values())
        assert math.isfinite(d["percentiles"]["p50_s"]) and d["percentiles"]["p50_s"] >= 0


@pytest.mark.parametrize("name, form", NUMERIC, ids=[f"{n}={f}" for n, f in NUMERIC])
@settings(max_examples=120, deadline=None)
@given(number=_NUMBER_TEXT)
def test_numbers_are_refused_or_fit(name, form, number):
    text = form.format(number)
    var = "DELAYCOMM_" + name.upper()
    cfg, error = _outcome(lambda: resolve(env={var: text}))
    if error is not None:
        assert f"invalid value {text!r} for option '{name}'" in error and var in error, error  # exact: above
        return
    _fits(cfg)


_NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2**200), max_value=2**200))
# option -> how a Python number becomes its keyword value
NUMERIC_KEYWORDS = [
    ("delay_fraction", lambda x: x),
    ("ema_alpha", lambda x: x),
    ("step_ms", lambda x: x),
    ("seed", lambda x: x),
    ("max_pending", lambda x: x),
    ("nccl_buffsize", lambda x: x),
    ("delay_ranks", lambda x: [x]),
    ("slowdown", lambda x: {0: x}),
    ("slowdown", lambda x: {x: 2.0}),
]


@pytest.mark.parametrize("name, make", NUMERIC_KEYWORDS, ids=[f"{n}{i}" for i, (n, _) in enumerate(NUMERIC_KEYWORDS)])
@settings(max_examples=120, deadline=None)
@given(number=_NUMBER)
def test_keyword_numbers_are_refused_or_fit(name, make, number):
    value = make(number)
    cfg, error = _outcome(lambda: resolve(DelayConfig(**{name: value}), env={}))
    if error is not None:
        assert f"for option '{name}' from the keyword {name}= of DelayConfig" in error, error
        return
    _fits(cfg)


def test_cli_shows_effective_config_and_sources(monkeypatch, capsys):
    # The entry point once, as a user runs it; the table and the refusal below through the same main(), in process.
    env = {**os.environ, "DELAYCOMM_EMA_ALPHA": "0.25"}
    proc = run_cli(["config", "--json"], timeout=60, env=env, module="delaycomm")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["config"]["ema_alpha"] == 0.25
    assert data["sources"]["ema_alpha"] == "environment (DELAYCOMM_EMA_ALPHA)"
    assert data["nccl"]["NCCL_ALGO"]["value"] == "allreduce:tree"
    assert data["must_match"] == {o.name: o.name not in ("stats", "trace", "trace_events") for o in OPTIONS}
    from delaycomm.__main__ import main

    monkeypatch.setenv("DELAYCOMM_EMA_ALPHA", "0.25")
    assert main(["config"]) == 0
    table = capsys.readouterr().out
    assert re.search(r"^  ema_alpha +0\.25 +environment \(DELAYCOMM_EMA_ALPHA\) ", table, re.M), table


def test_cli_rejects_bad_environment(monkeypatch, capsys):
    from delaycomm.__main__ import main

    monkeypatch.setenv("DELAYCOMM_STALENESS", "sometimes")
    assert main(["config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "option 'staleness'" in err and "DELAYCOMM_STALENESS" in err, err


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
    readme = (__import__("pathlib").Path(__file__).resolve().parents[2] / "README.md").read_text()
    for opt in OPTIONS:
        assert f"| `{opt.name}` | `{opt.env}` |" in readme, f"README's options table lacks {opt.name}"


def test_the_delay_options_and_the_native_fields_name_each_other():
    """Each delay option's row names its field of the native DelayOptions (csrc/delay/DelayOptions.hpp), and each
    field there is one option's: a row added on one side only fails here, not silently at the field's default
    (docs/core.md, "Options")."""
    from delaycomm import _C

    named = [opt.native.field for opt in OPTIONS if opt.native is not None]
    assert sorted(named) == sorted(_C.DelayOptions.fields), (named, _C.DelayOptions.fields)
    native = _C.DelayOptions()
    assert all(hasattr(native, field) for field in _C.DelayOptions.fields)


def test_readme_says_which_options_must_match():
    readme = (__import__("pathlib").Path(__file__).resolve().parents[2] / "README.md").read_text()
    for opt in OPTIONS:
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{opt.name}` | `{opt.env}` |"))
        last = row.rstrip(" |").rsplit("|", 1)[1].strip()
        assert last.startswith("yes" if opt.must_match else "no"), (opt.name, last)


# --- equivalent values, global ranks, edges of messages -------------------------------------------------


def _keys(cfg, members):
    from delaycomm._agree import canonical_options

    return {k: v["key"] for k, v in canonical_options(cfg, members).items()}


def test_equivalent_values_have_one_canonical_key():
    zero, minus_zero = resolve(DelayConfig(delay_fraction=0.0), env={}), resolve(DelayConfig(delay_fraction=-0.0))
    assert math.copysign(1.0, minus_zero.delay_fraction) == 1.0  # the parsed value is 0.0
    assert _keys(zero, [0, 1]) == _keys(minus_zero, [0, 1])
    assert _keys(resolve(env={"DELAYCOMM_DELAY_FRACTION": "-0"}), [0, 1]) == _keys(zero, [0, 1])
    # delay_ranks and slowdown: what they do to this group's members (global ranks)
    every, both = resolve(DelayConfig(delay_ranks="all"), env={}), resolve(DelayConfig(delay_ranks="0,1"), env={})
    assert _keys(every, [0, 1]) == _keys(both, [0, 1])
    assert _keys(every, [0, 1, 2]) != _keys(both, [0, 1, 2])  # rank 2 is delayed by one of them only
    assert _keys(resolve(DelayConfig(delay_ranks="0,3"), env={}), [0, 1]) == _keys(
        resolve(DelayConfig(delay_ranks="0"), env={}), [0, 1]
    )
    slow3, none = resolve(DelayConfig(slowdown="3:2x"), env={}), resolve(env={})
    assert _keys(slow3, [0, 1]) == _keys(none, [0, 1]) and _keys(slow3, [2, 3]) != _keys(none, [2, 3])


def test_ranks_are_global_in_the_native_options_of_a_subgroup():
    import warnings
    from datetime import timedelta

    from delaycomm import _C
    from delaycomm._backend import _check_group_config, _fill_delay_options, group_seed

    cfg = resolve(DelayConfig(delay="const:1ms", delay_ranks="0,3", slowdown="3:2x,0:4x", seed=5), env={})

    def native(rank, members, every_rank=False):
        n = _C.BackendOptions()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _fill_delay_options(n, cfg, rank, timedelta(seconds=30), members, every_rank=every_rank)
        return n.delay.ranks, n.delay.fraction, n.delay.slowdown, n.delay.seed

    assert native(1, [2, 3]) == ([1], 0.3, 2.0, group_seed(5, [2, 3]))  # global 3 is group rank 1
    assert native(0, [1, 2]) == ([], 0.0, 1.0, group_seed(5, [1, 2]))  # no member named: no delay at all
    assert native(1, [0, 3]) == ([], 0.3, 2.0, group_seed(5, [0, 3]))  # every member named: all
    assert native(3, [0, 1, 2, 3], every_rank=True) == ([0, 3], 0.3, 2.0, 5)  # every rank: the seed as given
    assert len({group_seed(5, [0, 1]), group_seed(5, [2, 3]), group_seed(6, [0, 1]), 5}) == 4
    assert 0 <= group_seed(2**63 - 1, list(range(1000))) < 2**63
    _check_group_config(cfg, 4, False)  # ranks 0 and 3 exist in a job of 4
    with pytest.raises(ValueError) as info:
        _check_group_config(cfg, 3, False)
    assert str(info.value) == (
        "delaycomm: invalid value '0,3' for option 'delay_ranks' from the keyword delay_ranks= of DelayConfig: "
        "rank 3 not in a job of 3 ranks; expected global ranks in [0, 3)"
    )


def test_a_nul_byte_in_stats_names_the_option_and_the_source():
    with pytest.raises(ValueError) as info:
        DelayConfig(stats="/tmp/s\0.json")
    assert str(info.value) == (
        "delaycomm: invalid value '/tmp/s\\x00.json' for option 'stats' from the keyword stats= of DelayConfig: the "
        "path has a NUL byte (at character 7); " + _STATS
    )


@pytest.mark.parametrize("name", ["delay", "delay_ranks", "slowdown", "staleness", "stats", "nccl_algo"])
def test_a_huge_bad_value_is_shortened_in_the_message(name):
    value = "x" * (1 << 20) + "{"  # 1 MiB, and not a valid value of any option
    with pytest.raises(ValueError) as info:
        resolve(env={"DELAYCOMM_" + name.upper(): value})
    message = str(info.value)
    assert len(message) < 2000, len(message)
    assert message.startswith("delaycomm: invalid value 'xxxx") and f"option '{name}'" in message
    assert f"[{len(value) + 2 - 200} of {len(value) + 2} characters left out]" in message
    assert "expected" in message  # what is accepted is kept


def test_a_trace_file_may_start_with_a_byte_order_mark(tmp_path):
    marked, plain = tmp_path / "marked.txt", tmp_path / "plain.txt"
    marked.write_bytes("\ufeff5ms\n7ms\n".encode())
    plain.write_text("5ms\n7ms\n")
    cfg = resolve(env={"DELAYCOMM_DELAY": f"trace:{marked}"})
    assert _keys(cfg, [0])["delay"] == _keys(resolve(env={"DELAYCOMM_DELAY": f"trace:{plain}"}), [0])["delay"]
