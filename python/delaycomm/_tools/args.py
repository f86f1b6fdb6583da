"""argparse types shared by the tools' command lines: each names what it accepts and what it got.

argparse turns an :class:`argparse.ArgumentTypeError` into ``error: argument --flag: <message>`` and exit status 2,
so the messages here say only what is wrong with the value.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence

from delaycomm._tools.units import parse_size

__all__ = ["number", "integer", "size", "size_list", "delay_spec", "check_delay_spec", "output_path", "choices_list"]


def number(
    lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False
) -> Callable[[str], float]:
    """A finite number in the interval given (``lo_open``/``hi_open``: the bound itself excluded)."""
    if lo is not None and hi is not None:
        lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
        accepted = f"a finite number in {lb}{lo:g}, {hi:g}{rb}"
    elif lo is not None:
        accepted = f"a finite number {'>' if lo_open else '>='} {lo:g}"
    elif hi is not None:
        accepted = f"a finite number {'<' if hi_open else '<='} {hi:g}"
    else:
        accepted = "a finite number"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; expected {accepted}") from None
        if (
            not math.isfinite(v)
            or (lo is not None and (v < lo or (lo_open and v == lo)))
            or (hi is not None and (v > hi or (hi_open and v == hi)))
        ):
            raise argparse.ArgumentTypeError(f"{text} is out of range; expected {accepted}")
        return v

    parse.__name__ = "number"
    return parse


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An integer in ``[lo, hi]`` (either bound may be None: unbounded)."""
    if lo is not None and hi is not None and hi >= 2**31 and (hi + 1) & hi == 0:
        accepted = f"an integer in [{lo}, 2^{(hi + 1).bit_length() - 1})"
    elif lo is not None and hi is not None:
        accepted = f"an integer in [{lo}, {hi}]"
    elif lo is not None:
        accepted = f"an integer >= {lo}"
    elif hi is not None:
        accepted = f"an integer <= {hi}"
    else:
        accepted = "an integer"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected {accepted}") from None
        if lo is not None and v < lo:
            raise argparse.ArgumentTypeError(f"{v} is too small; expected {accepted}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"{v} is too large; expected {accepted}")
        return v

    parse.__name__ = "integer"
    return parse


def size(text: str) -> int:
    """A size in bytes (:func:`delaycomm._tools.units.parse_size`: ``8``, ``4K``, ``64M``, ``1G``)."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def size_list(text: str) -> list[int]:
    """Comma-separated sizes (``1M,16M,64M``)."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of sizes such as 1M,16M")
    return [size(p) for p in parts]


def check_delay_spec(text: str) -> str:
    """Check a delay spec with the backend's own parser (delaycomm._spec: the native grammar, a file read in Python);
    return it normalised.

    ``none``, ``off`` and ``0`` come back as ``none``, anything else stripped.

    Raises:
        ValueError: what the native parser found wrong, with the spec quoted.
    """
    from delaycomm import _spec
    from delaycomm._config import delay_spec_error

    spec = text.strip()
    if spec.lower() in ("none", "off", "0"):
        return "none"
    try:
        _spec.parse(spec)
    except ValueError as e:
        raise ValueError(f"invalid delay spec {spec!r}: {delay_spec_error(str(e))}") from None
    return spec


def delay_spec(text: str) -> str:
    """A delay spec (``exp:p99=400ms``, ``const:5ms``, ``none``...), checked by :func:`check_delay_spec`."""
    try:
        return check_delay_spec(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def output_path(suffixes: Sequence[str] = (), stdout: bool = False) -> Callable[[str], str]:
    """A file to write: its directory exists, it is not a directory, its name ends in one of ``suffixes``.

    Args:
        suffixes: accepted endings (case-insensitive); empty: any name.
        stdout: accept ``-`` (standard output).
    """
    ends = tuple(s.lower() for s in suffixes)

    def parse(text: str) -> str:
        if text == "-" and stdout:
            return text
        parent = os.path.dirname(os.path.abspath(text))
        if not os.path.isdir(parent):
            raise argparse.ArgumentTypeError(f"{text!r}: directory {parent!r} does not exist")
        if os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text!r} is a directory; expected a file name")
        if ends and not text.lower().endswith(ends):
            raise argparse.ArgumentTypeError(f"{text!r}: expected a file name ending in {', '.join(suffixes)}")
        return text

    parse.__name__ = "output path"
    return parse


def choices_list(
    choices: Sequence[str], what: str, aliases: dict[str, str] | None = None
) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated list of ``choices`` (each once, in the order given; ``aliases`` map other spellings)."""

    def parse(text: str) -> tuple[str, ...]:
        names = [n.strip().lower() for n in text.split(",")]
        names = [(aliases or {}).get(n, n) for n in names]
        bad = [n for n in names if n not in choices]
        if not text.strip() or bad:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(repr(b) for b in bad) or repr(text)}; expected a comma-separated list "
                "of: " + ", ".join(choices)
            )
        return tuple(dict.fromkeys(names))

    parse.__name__ = f"{what} list"
    return parse
