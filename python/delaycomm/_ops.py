"""The native op table (csrc/ops/OpTable.hpp) as Python reads it: the one list of ops and their names.

Telemetry (``delaycomm.stats()["ops"]``), ``delay_ops`` and the benchmark name ops by ``OpInfo.name`` (the c10d
Backend method); ``delay_ops`` also accepts torch.distributed's function names (``OpInfo.aliases``).
"""

from __future__ import annotations

from delaycomm import _C

__all__ = ["OPS", "BY_NAME", "DELAYABLE_OPS", "ALIASES", "canonical", "info"]

OPS: tuple = _C.op_table()
BY_NAME = {o.name: o for o in OPS}
# The names delay_ops accepts, in table order (the coalescing window's own work is not one).
DELAYABLE_OPS: tuple[str, ...] = tuple(o.name for o in OPS if o.delayable)
# torch.distributed function name -> op name.
ALIASES: dict[str, str] = {a: o.name for o in OPS for a in o.aliases}


def canonical(name: str) -> str | None:
    """The op name for an op name or a torch.distributed function name; None when it names no op."""
    name = ALIASES.get(name, name)
    return name if name in BY_NAME else None


def info(name: str):
    """The table row (``_C.OpInfo``) for an op name or alias.

    Raises:
        KeyError: ``name`` names no op.
    """
    op = canonical(name)
    if op is None:
        raise KeyError(name)
    return BY_NAME[op]
