"""The size syntax of every tool (``-b 8 -e 64M``, ``--sizes 1M,16M``) and the formatting of sizes.

Sizes are binary, as in nccl-tests: ``1K`` = 1024 bytes, ``64M`` = 64 MiB.
"""

from __future__ import annotations

import re

__all__ = ["parse_size", "format_size", "SIZE_SYNTAX", "MAX_SIZE"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
SIZE_SYNTAX = "a whole number of bytes with an optional binary unit: 8, 512B, 4K, 64M, 1G (also KiB, MiB, GiB)"
# The largest buffer a tool agrees to allocate per rank (per backend): 16 GiB.
MAX_SIZE = 16 << 30


def parse_size(text: str, max_bytes: int = MAX_SIZE) -> int:
    """Parse ``8``, ``512B``, ``4K``, ``64M``, ``1G`` (or ``KiB/MiB/GiB``) into bytes.

    Args:
        text: the size.
        max_bytes: the largest size accepted (default 16 GiB).

    Raises:
        ValueError: anything else (decimal units such as ``MB`` are refused: ambiguous), zero, or more than
            ``max_bytes``.
    """
    m = re.fullmatch(r"\s*(\d{1,30})\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size; expected {SIZE_SYNTAX}")
    n = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if n <= 0 or n > max_bytes:
        raise ValueError(f"{text!r} is out of range; expected a size in [1 B, {format_size(max_bytes)}]")
    return n


def format_size(nbytes: int) -> str:
    """``8 B``, ``4 KiB``, ``1.5 MiB``: for messages, headers and plot labels (tables print plain bytes)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{nbytes} B"
