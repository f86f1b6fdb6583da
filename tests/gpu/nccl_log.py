"""NCCL's own INFO lines about the settings it read from the environment (``NCCL_DEBUG=INFO``, subsystem ENV).

NCCL writes ``<host>:<pid>:<tid> [<dev>] NCCL INFO <VAR> set by environment to <value>`` (integers through
``ncclLoadParam`` in its ``src/misc/param.cc``, with a final period; NCCL_ALGO / NCCL_PROTO from
``src/graph/tuning.cc``, without one) and ``NCCL INFO NCCL version <version>`` at communicator creation.
"""

from __future__ import annotations

import re

__all__ = ["nccl_lines"]

_SET_BY_ENV = re.compile(r"NCCL INFO (NCCL_[A-Z0-9_]+) set by environment to (.+?)\.?\s*$")
_VERSION = re.compile(r"NCCL INFO .*NCCL version (\S+)")


def nccl_lines(text: str) -> dict:
    """``{"set_by_environment": {var: [values in order]}, "version": str | None, "lines": [the matching lines]}``."""
    found: dict = {"set_by_environment": {}, "lines": [], "version": None}
    for line in text.splitlines():
        m = _SET_BY_ENV.search(line)
        if m:
            found["set_by_environment"].setdefault(m.group(1), []).append(m.group(2))
            found["lines"].append(line.strip())
        v = _VERSION.search(line)
        if v and found["version"] is None:
            found["version"] = v.group(1)
    return found
