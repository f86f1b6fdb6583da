"""The tools' argparse types: what each accepts, and messages that say what came and what is accepted."""

from __future__ import annotations

import argparse

import pytest

from delaycomm._tools import args
from delaycomm._tools.machine import machine_info, versions


def _refuses(parse, text):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        parse(text)
    return str(e.value)


def test_number_bounds_open_and_closed():
    p = args.number(0, 1, lo_open=True)
    assert p("1") == 1.0 and p("0.5") == 0.5
    assert _refuses(p, "0") == "0 is out of range; expected a finite number in (0, 1]"
    assert _refuses(p, "inf") == "inf is out of range; expected a finite number in (0, 1]"
    assert _refuses(p, "x") == "'x' is not a number; expected a finite number in (0, 1]"
    assert _refuses(args.number(1.0), "0.5") == "0.5 is out of range; expected a finite number >= 1"


def test_integer_bounds():
    assert args.integer(0, 3)("3") == 3
    assert _refuses(args.integer(2), "1") == "1 is too small; expected an integer >= 2"
    assert _refuses(args.integer(0, 3), "4") == "4 is too large; expected an integer in [0, 3]"
    assert _refuses(args.integer(0, 2**63 - 1), "-1") == "-1 is too small; expected an integer in [0, 2^63)"
    assert _refuses(args.integer(), "1.5") == "'1.5' is not an integer; expected an integer"


def test_sizes():
    assert args.size_list("4K, 1M") == [4096, 1 << 20]
    assert _refuses(args.size, "8MB").startswith("'8MB' is not a size; expected a whole number of bytes")
    assert _refuses(args.size_list, ",") == "',': expected a comma-separated list of sizes such as 1M,16M"


def test_parse_size_takes_the_callers_bound():
    from delaycomm._tools.units import parse_size

    assert parse_size("1GiB", max_bytes=1 << 30) == 1 << 30
    with pytest.raises(ValueError, match=r"^'2G' is out of range; expected a size in \[1 B, 1 GiB\]$"):
        parse_size("2G", max_bytes=1 << 30)


@pytest.mark.parametrize(
    "text, spec", [(" exp:p99=400ms ", "exp:p99=400ms"), ("off", "none"), ("0", "none"), ("const:5ms", "const:5ms")]
)
def test_delay_spec_accepts_the_backends_syntax(text, spec):
    assert args.delay_spec(text) == spec


@pytest.mark.parametrize(
    "text, why",
    [
        ("const:50", "const duration '50' has no unit"),
        ("gauss:p50=3ms", "unknown family 'gauss'"),
    ],
)
def test_delay_spec_reports_the_native_parsers_reason(text, why):
    message = _refuses(args.delay_spec, text)
    assert message.startswith(f"invalid delay spec {text!r}: {why}"), message
    assert "expected a delay spec: none, const:50ms" in message


def test_output_path(tmp_path):
    p = args.output_path((".png",))
    assert p(str(tmp_path / "a.PNG")) == str(tmp_path / "a.PNG")
    assert _refuses(p, str(tmp_path / "a.txt")).endswith("expected a file name ending in .png")
    assert _refuses(p, str(tmp_path)) == f"{str(tmp_path)!r} is a directory; expected a file name"
    assert _refuses(p, "/no/such/a.png") == "'/no/such/a.png': directory '/no/such' does not exist"
    assert args.output_path(stdout=True)("-") == "-"
    assert args.output_path()("-") == "-"  # without stdout=True, '-' is a file of that name


def test_choices_list_keeps_order_and_drops_repeats():
    p = args.choices_list(("a", "b", "c"), "thing", aliases={"x": "c"})
    assert p("b, a, b, x") == ("b", "a", "c")
    assert _refuses(p, "a,z") == "unknown thing 'z'; expected a comma-separated list of: a, b, c"


def test_machine_info_and_versions_say_where():
    m = machine_info()
    assert m["cpu_count"] >= 1 and m["cpu"] and m["hostname"]
    v = versions(("numpy", "no-such-package-here"))
    assert v["delaycomm"] and v["numpy"] and v["no-such-package-here"] is None
