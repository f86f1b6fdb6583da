"""Units of the benchmark: size sweeps; the size syntax and the formatting of sizes are the tools' own
(:mod:`delaycomm._tools.units`, re-exported here), so that the CLI, the table, the plot and the gate all say the
same thing. Sizes are binary, as in nccl-tests: ``1K`` = 1024 bytes, ``64M`` = 64 MiB.
"""

from __future__ import annotations

from delaycomm._tools.units import MAX_SIZE, SIZE_SYNTAX, format_size, parse_size

__all__ = ["parse_size", "format_size", "size_sweep", "SIZE_SYNTAX", "MAX_SIZE"]


def size_sweep(min_bytes: int, max_bytes: int, factor: int = 2, step: int = 0) -> list[int]:
    """The sizes of a sweep, nccl-tests style: ``min, min*factor, ...`` up to ``max`` (or ``+step`` when step > 0).

    The last size is ``max`` itself when the progression does not land on it.

    Raises:
        ValueError: min > max, factor < 2 (multiplicative sweep), step < 0.
    """
    if min_bytes > max_bytes:
        raise ValueError(f"the minimum size {min_bytes} B is larger than the maximum {max_bytes} B")
    if step < 0:
        raise ValueError(f"the size increment must be >= 0, got {step}")
    if step == 0 and factor < 2:
        raise ValueError(f"the size factor must be an integer >= 2, got {factor}")
    sizes = []
    s = min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s = s + step if step > 0 else s * factor
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes
