"""Delay spec grammar, durations and trace files: every form, and bad input with pinned messages."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import delaycomm
from delaycomm import _C

GOOD = [
    ("none", "none"),
    ("const:50ms", "const"),
    ("const: 1.5s", "const"),
    ("const:0ns", "const"),
    ("exp:p99=400ms", "exp"),
    ("EXP:mean=400ms", "exp"),
    ("exp:p50=2.5us", "exp"),
    ("exp:p99.9=1s", "exp"),
    ("lognormal:p50=60ms,p99=400ms", "lognormal"),
    ("lognormal:p99=400ms,p50=60ms", "lognormal"),
    ("lognormal:p50=60ms,p99=400ms,p999=2s", "lognormal"),
    ("pareto:p50=60ms,p99=400ms", "pareto"),
    ("pareto:p50=60ms,p99=400ms,p999=700ms", "pareto"),
    ("pareto:p05=1ms,p95=1e2ms", "pareto"),
]


@pytest.mark.parametrize("spec,family", GOOD)
def test_every_good_form_parses(spec, family):
    d = _C.parse_delay_spec(spec)
    assert d["family"] == family


def test_percentile_keys_mean_what_they_say():
    assert _C.DelaySampler("exp:p999=1s").quantile(0.999) == pytest.approx(1.0, rel=1e-12)
    assert _C.DelaySampler("exp:p99.9=1s").quantile(0.999) == pytest.approx(1.0, rel=1e-12)
    assert _C.DelaySampler("exp:p05=1s").quantile(0.05) == pytest.approx(1.0, rel=1e-12)
    assert _C.DelaySampler("exp:p5=1s").quantile(0.5) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("1ns", 1e-9),
        ("2.5us", 2.5e-6),
        ("2.5\u00b5s", 2.5e-6),
        ("40ms", 0.04),
        ("3s", 3.0),
        ("1e3ms", 1.0),
        (" 7 ms ", 0.007),
        ("+1s", 1.0),
    ],
)
def test_durations(text, seconds):
    assert _C.parse_duration(text) == pytest.approx(seconds, rel=1e-12)


BAD = [
    ("exp", r"'exp': expected FAMILY:ARGUMENTS"),
    ("gauss:p50=1ms", r"unknown family 'gauss'"),
    ("exp:p99=400", r"value of 'p99' '400' has no unit \(expected one of ns, us, ms, s"),
    ("exp:p99=400 parsecs", r"has an unknown unit 'parsecs'"),
    ("exp:p99=-4ms", r"is negative \(a delay must be >= 0\)"),
    ("exp:p99=nanms", r"is not a number with a unit"),
    ("exp:p99=infms", r"is not a number with a unit"),
    ("exp:p99=1e999s", r"value of 'p99' '1e999s' is out of range \(a delay is 0 or from 1ns to 86400s, 24 hours\)"),
    (
        "exp:p99=86401s",
        r"value of 'p99' '86401s' is longer than 86400s \(a delay is 0 or from 1ns to 86400s, 24 "
        r"hours\)",
    ),
    ("const:1e300ms", r"const duration '1e300ms' is longer than 86400s"),
    ("pareto:p50=1ns,p99=1e300s", r"value of 'p99' '1e300s' is longer than 86400s"),
    ("exp:mean=0.5ns", r"value of 'mean' '0.5ns' is shorter than 1ns \(a delay is 0 or from 1ns to 86400s"),
    ("exp:p99=0ms", r"the exp parameter must be > 0"),
    ("exp:p50=1ms,p99=2ms", r"exp takes exactly one of mean=DURATION or one percentile"),
    ("exp:mean=1ms,mean=2ms", r"key 'mean' is given twice"),
    ("exp:rate=0.0025", r"key 'rate' expected a percentile key such as p50, p99, p999 or p99.9 \(or mean= for exp\)"),
    ("exp:p100=1ms", r"key 'p100' is ambiguous"),
    ("exp:p0=1ms", r"must name a percentile strictly between 0 and 100"),
    ("exp:p99.=1ms", r"expected digits after the '.'"),
    ("exp:p99", r"expects KEY=DURATION arguments"),
    ("const:", r"const duration '' is empty"),
    ("const:5", r"has no unit"),
    ("lognormal:p50=60ms", r"lognormal takes two percentiles"),
    ("lognormal:mean=60ms,p99=1s", r"lognormal is given by percentiles"),
    ("lognormal:p50=60ms,p99=40ms", r"percentiles must increase with the quantile"),
    ("lognormal:p50=0ms,p99=40ms", r"lognormal percentiles must be > 0"),
    ("lognormal:p50=60ms,p99.0=400ms,p99=1s", r"names a percentile that is given twice"),
    ("lognormal:p50=60ms,p99=400ms,p999=500ms", r"p99.9 must be at least 745.762ms \(the plain lognormal's\)"),
    ("pareto:p50=60ms,p99=400ms,p999=410ms", r"no generalised Pareto with a location >= 0 has p99.9=410ms"),
    ("pareto:p10=1ms,p50=2ms,p90=3ms,p99=4ms", r"pareto takes two percentiles"),
    ("trace:", r"trace needs a file path"),
]


@pytest.mark.parametrize("spec,message", BAD)
def test_bad_specs_say_what_is_wrong_and_what_is_accepted(spec, message):
    with pytest.raises(ValueError, match=message) as e:
        _C.parse_delay_spec(spec)
    text = str(e.value)
    assert text.startswith(f"delaycomm: invalid delay spec '{spec}': ")
    if "no lognormal" not in text and "no generalised Pareto" not in text:
        assert text.endswith(
            "; expected a delay spec: none, const:50ms, exp:p99=400ms, exp:mean=400ms, "
            "lognormal:p50=60ms,p99=400ms[,p999=2s], pareto:p50=60ms,p99=400ms[,p999=2s], trace:FILE, profile:FILE "
            "(durations need a unit: ns, us, ms, s; each is 0 or from 1ns to 86400s)"
        )


def test_bad_spec_through_the_option_keeps_the_cause_once():
    with pytest.raises(ValueError) as e:
        delaycomm.DelayConfig(delay="exp:p99=400")
    assert str(e.value) == (
        "delaycomm: invalid value 'exp:p99=400' for option 'delay' from the keyword delay= of DelayConfig: value of "
        "'p99' '400' has no unit (expected one of ns, us, ms, s, e.g. 50ms); expected a delay spec: none, const:50ms, "
        "exp:p99=400ms, exp:mean=400ms, lognormal:p50=60ms,p99=400ms[,p999=2s], pareto:p50=60ms,p99=400ms"
        "[,p999=2s], trace:FILE, profile:FILE (durations need a unit: ns, us, ms, s; each is 0 or from 1ns to 86400s)"
    )


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("86400s", 86400.0),
        ("86400000ms", 86400.0),
        ("1ns", 1e-9),
        ("0.001us", 1e-9),
        ("1e-9s", 1e-9),
        ("0s", 0.0),
        ("0ns", 0.0),
    ],
)
def test_durations_at_the_bounds(text, seconds):
    assert _C.parse_duration(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize(
    "text,why",
    [
        ("86401s", "is longer than 86400s"),
        ("1e19ns", "is longer than 86400s"),
        ("0.9ns", "is shorter than 1ns"),
        ("1e-300s", "is shorter than 1ns"),
    ],
)
def test_durations_out_of_bounds(text, why):
    with pytest.raises(ValueError) as e:
        _C.parse_duration(text)
    assert str(e.value) == f"delaycomm: duration '{text}' {why} (a delay is 0 or from 1ns to 86400s, 24 hours)"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_random_strings_parse_or_raise_value_error(text):
    try:
        d = _C.parse_delay_spec(text)
    except ValueError as e:
        error = str(e)
    else:
        assert d["family"] in {"none", "const", "exp", "lognormal", "pareto", "trace"}
        return
    assert error.startswith("delaycomm: ")


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"(exp|lognormal|pareto|const):[p0-9.=,a-z\-+e ]{0,30}", fullmatch=True))
def test_random_near_miss_specs_parse_or_raise_value_error(text):
    try:
        d = _C.parse_delay_spec(text)
    except ValueError as e:
        error = str(e)
    else:
        s = _C.DelaySampler(text)
        assert math.isfinite(s.quantile(0.5)) and s.quantile(0.5) >= 0
        assert d["family"] in {"const", "exp", "lognormal", "pareto"}
        return
    assert error.startswith("delaycomm: ")


# ---------------------------------------------------------------------------------------------------------------
# Trace files


def _write(tmp_path, text, name="t.txt"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_trace_file_format(tmp_path):
    path = _write(tmp_path, "# latencies of one day\n\n 12ms\n800us\n1.5s\n  # a comment\n3ms\n")
    s = _C.DelaySampler(f"trace:{path}")
    d = s.describe()
    assert d["family"] == "trace" and d["trace_path"] == path
    assert d["parameters"] == pytest.approx({"n": 4.0, "min_s": 0.0008, "max_s": 1.5}, rel=1e-12)
    assert s.quantile(0.0) == pytest.approx(0.0008) and s.quantile(1.0) == pytest.approx(1.5)


@pytest.mark.parametrize(
    "text,message",
    [
        ("", r"has no latencies"),
        ("# only comments\n\n", r"has no latencies"),
        ("1ms\n2ms\n-3ms\n", r"line 3: '-3ms' is negative"),
        ("1ms\nnan\n", r"line 2: 'nan' is not a number with a unit"),
        ("1ms\nNaNms\n", r"line 2: 'NaNms' is not a number with a unit"),
        ("1ms\n\n# c\n12\n", r"line 4: '12' has no unit"),
        ("1ms\n5 furlongs\n", r"line 2: '5 furlongs' has an unknown unit 'furlongs'"),
        ("1ms,2ms\n", r"line 1: '1ms,2ms' has an unknown unit"),
    ],
)
def test_malformed_trace_files_name_the_line(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as e:
        _C.parse_delay_spec(f"trace:{path}")
    assert path in str(e.value)
    if "line" in message:
        assert "expected one latency per line with a unit (ns, us, ms, s)" in str(e.value)


def test_missing_trace_file(tmp_path):
    path = f"{tmp_path}/nope.txt"
    with pytest.raises(ValueError) as e:
        _C.parse_delay_spec(f"trace:{path}")
    assert str(e.value) == (
        f"delaycomm: invalid delay spec 'trace:{path}': trace file '{path}' cannot be opened: No "
        "such file or directory (expected a readable regular file)"
    )


_TRACE_FORMAT = (
    "expected one latency per line with a unit (ns, us, ms, s) such as 12.5ms; blank lines and lines "
    "starting with # are ignored"
)


@pytest.mark.parametrize(
    "data,where",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "line 1 is not text: byte 0x89 at column 1 (a binary file?)"),
        (b"1ms\n2ms\n\x00\x01\x02\n", "line 3 is not text: byte 0x00 at column 1 (a binary file?)"),
        (b"1ms\n12\xffms\n", "line 2 is not text: byte 0xff at column 3 (a binary file?)"),
        (b"# caf\xc3\xa9 latencies\n1ms\n\x1b[0m\n", "line 3 is not text: byte 0x1b at column 1 (a binary file?)"),
        (b"1ms\n1e300s\n", "line 2: '1e300s' is longer than 86400s (a delay is 0 or from 1ns to 86400s, 24 hours)"),
        (b"1ms\n5e12ms\n", "line 2: '5e12ms' is longer than 86400s (a delay is 0 or from 1ns to 86400s, 24 hours)"),
    ],
)
def test_binary_or_out_of_range_trace_names_the_first_bad_line(tmp_path, monkeypatch, data, where):
    # Binary content used to surface as a UTF-8 codec error; values past 4.6e12 ms were silently saturated.
    # NOTE: a relative path: messages quote at most 80 characters of a spec, and tmp_path's length varies.
    monkeypatch.chdir(tmp_path)
    path = "t.bin"
    (tmp_path / path).write_bytes(data)
    with pytest.raises(ValueError) as e:
        _C.parse_delay_spec(f"trace:{path}")
    assert str(e.value) == f"delaycomm: invalid delay spec 'trace:{path}': trace file '{path}' {where}; {_TRACE_FORMAT}"


def test_utf8_in_a_trace_line_stays_readable(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("1ms\n5 \u00b5m\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: '5 \u00b5m' has an unknown unit '\u00b5m'"):
        _C.parse_delay_spec(f"trace:{path}")


def test_a_trace_larger_than_64_mib_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a short, relative path (see above)
    path = "big.txt"
    with open(path, "wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: no disk used
    with pytest.raises(ValueError) as e:
        _C.parse_delay_spec(f"trace:{path}")
    assert str(e.value) == (
        f"delaycomm: invalid delay spec 'trace:{path}': trace file '{path}' has 67108865 bytes, "
        "more than the limit of 64 MiB"
    )


_PARSE_IN_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a parser that reads forever fails here, not the host
from delaycomm import _C
for spec in sys.argv[1:]:
    try:
        _C.parse_delay_spec(spec)
        print("accepted", spec, flush=True)
    except ValueError as e:
        print(e, flush=True)
"""


@pytest.mark.timeout(120)
def test_only_regular_files_are_read(tmp_path, monkeypatch):
    # A FIFO used to block init forever and /dev/zero to read until memory ran out: one child (one import of torch)
    # parses each, with a timeout and a memory limit, so a regression fails this test instead of hanging or
    # exhausting the machine; the FIFO comes first, so a reader that blocks on it leaves the others unprinted.
    from tests.harness import run_cli

    monkeypatch.chdir(tmp_path)  # short, relative paths (see above); the child runs here too
    os.mkfifo("fifo")
    os.mkdir("d")
    kinds = {"fifo": "a FIFO", "/dev/zero": "a character device", "d": "a directory"}
    proc = run_cli(["-c", _PARSE_IN_CHILD, *(f"trace:{path}" for path in kinds)], timeout=60)
    assert proc.stdout.splitlines() == [
        f"delaycomm: invalid delay spec 'trace:{path}': trace file '{path}' is {what} (expected a regular file)"
        for path, what in kinds.items()
    ], proc.stderr[-2000:]


def test_trace_digest_is_the_content_not_the_path(tmp_path):
    a, b, c, d = (tmp_path / n for n in "abcd")
    a.write_text("1ms\n2ms\n3ms\n")
    b.write_text("# the same latencies, another order\n3ms\n\n1ms\n2000us\n")
    c.write_text("1ms\n2ms\n4ms\n")
    d.write_text("1ms\n2ms\n3ms\n3ms\n")
    digest = {p.name: _C.parse_delay_spec(f"trace:{p}")["trace_digest"] for p in (a, b, c, d)}
    assert digest["a"] == digest["b"]
    assert len({digest["a"], digest["c"], digest["d"]}) == 3


@pytest.mark.timeout(60)
def test_a_million_line_trace_is_fine(tmp_path):
    path = tmp_path / "big.txt"
    with open(path, "w") as f:
        f.write("\n".join(f"{(i % 1000) + 1}us" for i in range(10**6)))
        f.write("\n")
    s = _C.DelaySampler(f"trace:{path}")
    assert s.describe()["parameters"]["n"] == 1e6
    assert s.quantile(0.5) == pytest.approx(500.5e-6, rel=1e-3)


def test_creator_fills_the_native_options_and_warns_when_the_tail_passes_the_timeout():
    from datetime import timedelta

    from delaycomm._backend import _fill_delay_options
    from delaycomm._config import resolve

    cfg = resolve(
        delaycomm.DelayConfig(
            delay="exp:p99=10s",
            delay_ranks="1",
            delay_ops="all_reduce,broadcast",
            delay_where="host",
            seed=3,
            slowdown="1:4x",
        ),
        env={},
    )
    native = _C.BackendOptions()
    with pytest.warns(RuntimeWarning, match=r"has a P99.99 of 20.000 s, longer than the group's timeout of 5 s"):
        _fill_delay_options(native, cfg, 1, timedelta(seconds=5))
    d = native.delay  # the nested DelayOptions: the parsed spec, never its text, crosses into the backend
    assert (d.spec.text, d.fraction, d.ranks, d.ops, d.where, d.seed, d.slowdown) == (
        "exp:p99=10s", 0.3, [1], [_C.OpKind.allreduce, _C.OpKind.broadcast], _C.DelayWhere.HOST, 3, 4.0
    )  # fmt: skip
    assert d.spec is cfg.delay.spec  # the very object the option check parsed
