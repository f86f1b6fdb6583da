"""One small spec per collective: element counts, buffers, the call, the expected result, the bus-bandwidth factor.

The engine (:mod:`delaycomm.bench.engine`) is generic; everything collective-specific lives here, in the style of
nccl-tests' per-collective plug-ins: one small class per collective (its buffer sizes, its input data, the call,
its expected result, its bus-bandwidth factor), and :class:`Collective` holds what they share. Adding a collective
is one class and one entry of ``COLLECTIVES``. The formulas are derived in ``docs/benchmark.md``.

Conventions (n = number of ranks):

- ``size`` (bytes) and ``count`` (elements) describe the *larger* buffer of a call: the all-reduce buffer, the
  all-gather output (n chunks), the reduce-scatter input (n chunks), the broadcast buffer, the all-to-all
  buffer (n chunks). Collectives with chunks round ``count`` down to a multiple of n.
- Check data: rank r holds ``BASE[(i + r) % P]`` at global index i, with ``BASE = 1..P`` (P = 4, or 2 for PROD so
  that products stay exact). Every expected value is then a small integer (or its average), exact in every dtype
  we accept, and computed from a P-periodic table instead of n full tensors.
"""

from __future__ import annotations

import abc
from typing import ClassVar

from delaycomm import _ops

__all__ = ["Collective", "COLLECTIVES", "REDOPS", "DTYPES", "get"]

# Reduction ops: CLI name -> torch.distributed.ReduceOp attribute.
REDOPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}
# dtypes: CLI name -> (torch attribute, bytes per element). Aliases map to the same entries.
DTYPES = {
    "float32": ("float32", 4),
    "float64": ("float64", 8),
    "float16": ("float16", 2),
    "bfloat16": ("bfloat16", 2),
    "int8": ("int8", 1),
    "uint8": ("uint8", 1),
    "int32": ("int32", 4),
    "int64": ("int64", 8),
}
DTYPE_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "fp64": "float64",
    "fp16": "float16",
    "int": "int32",
    "long": "int64",
}
# Relative tolerance of the check per floating dtype (only AVG can be inexact: all other results are small ints).
_RTOL = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1e-6, "float64": 1e-12}


class Collective(abc.ABC):
    """What the engine needs to know about one collective; a subclass per collective fills in the specifics.

    Class attributes of each subclass:
        name: the CLI name (``all_reduce``).
        torch_name: torch.distributed's name of the call timed, as the op table knows it (its telemetry name and
            whether it reduces come from there, delaycomm._ops).
        chunked: True when the larger buffer is n chunks (count rounded down to a multiple of n).
        factor_text: the bus-bandwidth factor's formula, for the report and the docs (:meth:`bus_factor`).

    Derived: ``stats_op`` (the op name in ``delaycomm.stats()``), ``reduces`` (the redop applies; else the redop
    column says ``none``).
    """

    name: ClassVar[str]
    torch_name: ClassVar[str]
    chunked: ClassVar[bool]
    factor_text: ClassVar[str]

    def __init__(self) -> None:
        op = _ops.info(self.torch_name)
        self.stats_op: str = op.name
        self.reduces: bool = op.reduces

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # ---------------------------------------------------------------- per collective
    @abc.abstractmethod
    def bus_factor(self, n: int) -> float:
        """busbw / algbw for n ranks (docs/benchmark.md)."""

    def buffer_counts(self, count: int, n: int) -> tuple[int, int | None]:
        """Elements of (input, output) for ``count`` (the larger buffer); output None: the call is in place."""
        return count, None

    def input(self, count: int, rank: int, n: int, redop: str, root: int, for_check: bool, dtype, device):
        """This rank's input buffer (``count`` elements): the check pattern of the module doc by default."""
        return _pattern(count, rank, redop, dtype, device)

    @abc.abstractmethod
    def expected(self, count: int, rank: int, n: int, redop: str, root: int):
        """This rank's expected result for the check inputs, as float64."""

    @abc.abstractmethod
    def issue(self, inp, out, group, op, root: int) -> None:
        """The torch.distributed call (synchronous) with ``op`` a ``ReduceOp``."""

    # ---------------------------------------------------------------- shared
    def count_for(self, size_bytes: int, elsize: int, n: int) -> int:
        """Elements of the larger buffer for a requested size (0: the size is too small for n ranks)."""
        count = size_bytes // elsize
        if self.chunked:
            count -= count % n
        return count

    def buffers(self, count: int, dtype, device, rank: int, n: int, redop: str, root: int, for_check: bool):
        """(input, output) tensors for one call. ``output`` is None for in-place collectives.

        Timing buffers hold data that repeated calls leave unchanged (see :class:`AllReduce`) so that values never
        overflow over hundreds of calls; check buffers hold the pattern of the module doc.
        """
        import torch

        in_count, out_count = self.buffer_counts(count, n)
        inp = self.input(in_count, rank, n, redop, root, for_check, dtype, device)
        out = None if out_count is None else torch.empty(out_count, dtype=dtype, device=device)
        return inp, out

    def run(self, inp, out, group, redop: str, root: int) -> None:
        """Issue the collective on ``group`` and wait for it (torch's synchronous form)."""
        import torch.distributed as dist

        self.issue(inp, out, group, getattr(dist.ReduceOp, REDOPS[redop]), root)

    def result(self, inp, out):
        """The tensor that holds this rank's result after :meth:`run`."""
        return inp if out is None else out

    def count_wrong(self, got, expected, dtype_name: str, redop: str) -> int:
        """Elements of ``got`` that differ from ``expected`` (NaN counts as wrong).

        Exact comparison in the tensor's own dtype (every expected value but AVG's is a small integer, exact in
        every dtype we accept; integer types wrap as the dtype does); AVG's floats to a relative tolerance.
        """
        import torch

        got = got.detach().to("cpu")
        if redop == "avg" and self.reduces:
            g = got.to(torch.float64)
            exp = expected.to(got.dtype).to(torch.float64)
            tol = _RTOL[dtype_name] * exp.abs().clamp(min=1.0)
            return int((~((g - exp).abs() <= tol)).sum().item())
        exp = expected.to(got.dtype) if got.dtype.is_floating_point else expected.to(torch.int64).to(got.dtype)
        return int(torch.count_nonzero(got != exp).item())


# ------------------------------------------------------------------------------------------------------------------
# One class per collective. NOTE: all_gather and reduce_scatter time the single-tensor forms (torch.distributed's
# all_gather_into_tensor and reduce_scatter_tensor): the op table's aliases of _allgather_base and
# _reduce_scatter_base.


class AllReduce(Collective):
    name, torch_name, chunked, factor_text = "all_reduce", "all_reduce", False, "2(n-1)/n"

    def bus_factor(self, n: int) -> float:
        return 2.0 * (n - 1) / n

    def input(self, count, rank, n, redop, root, for_check, dtype, device):
        if not for_check and redop in ("sum", "prod"):
            import torch

            # NOTE: in-place SUM/PROD would grow the values call after call (fp16 overflows after ~16 calls).
            return torch.full((count,), 0 if redop == "sum" else 1, dtype=dtype, device=device)
        return super().input(count, rank, n, redop, root, for_check, dtype, device)

    def expected(self, count, rank, n, redop, root):
        return _tile(_reduced_table(n, redop), count, 0)

    def issue(self, inp, out, group, op, root):
        import torch.distributed as dist

        dist.all_reduce(inp, op=op, group=group)


class AllGather(Collective):
    name, torch_name, chunked, factor_text = "all_gather", "all_gather_into_tensor", True, "(n-1)/n"

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def buffer_counts(self, count, n):
        return count // n, count

    def expected(self, count, rank, n, redop, root):
        import torch

        # chunk s comes from rank s, which holds BASE[(i + s) % P] at its local index i.
        base = _base(_period(redop))
        return torch.cat([_tile(base, count // n, s) for s in range(n)])

    def issue(self, inp, out, group, op, root):
        _ALL_GATHER(out, inp, group=group)


class ReduceScatter(Collective):
    name, torch_name, chunked, factor_text = "reduce_scatter", "reduce_scatter_tensor", True, "(n-1)/n"

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def buffer_counts(self, count, n):
        return count, count // n

    def expected(self, count, rank, n, redop, root):
        chunk = count // n
        return _tile(_reduced_table(n, redop), chunk, rank * chunk)

    def issue(self, inp, out, group, op, root):
        _REDUCE_SCATTER(out, inp, op=op, group=group)


class Broadcast(Collective):
    name, torch_name, chunked, factor_text = "broadcast", "broadcast", False, "1"

    def bus_factor(self, n: int) -> float:
        return 1.0

    def input(self, count, rank, n, redop, root, for_check, dtype, device):
        if for_check and rank != root:
            import torch

            return torch.zeros(count, dtype=dtype, device=device)  # the check sees that the root's data arrived
        return super().input(count, rank, n, redop, root, for_check, dtype, device)

    def expected(self, count, rank, n, redop, root):
        return _tile(_base(_period(redop)), count, root)

    def issue(self, inp, out, group, op, root):
        import torch.distributed as dist

        dist.broadcast(inp, src=root, group=group)


class AllToAll(Collective):
    name, torch_name, chunked, factor_text = "all_to_all", "all_to_all_single", True, "(n-1)/n"

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def buffer_counts(self, count, n):
        return count, count

    def expected(self, count, rank, n, redop, root):
        import torch

        # chunk s comes from rank s: its input chunk `rank`, global index rank*chunk + i.
        chunk = count // n
        base = _base(_period(redop))
        return torch.cat([_tile(base, chunk, rank * chunk + s) for s in range(n)])

    def issue(self, inp, out, group, op, root):
        import torch.distributed as dist

        dist.all_to_all_single(out, inp, group=group)


COLLECTIVES: dict[str, Collective] = {
    c.name: c for c in (AllReduce(), AllGather(), ReduceScatter(), Broadcast(), AllToAll())
}


def _tile(table, count: int, offset: int):
    """``table[(i + offset) % P]`` for i in [0, count): the P-periodic pattern, built by repetition (cheap)."""
    import torch

    period = table.numel()
    rolled = table[(torch.arange(period) + offset) % period]
    return rolled.repeat(-(-count // period))[:count]


def _resolve_tensor_ops():
    """torch >= 2.13 names the single-tensor forms ``*_single`` (the older names warn); older torch lacks them."""
    import torch.distributed as dist

    return (
        getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor,
        getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor,
    )


_ALL_GATHER = _REDUCE_SCATTER = None


def bind_torch_ops() -> None:
    """Look up torch's collective functions once (called by the engine, so importing this module stays cheap)."""
    global _ALL_GATHER, _REDUCE_SCATTER
    _ALL_GATHER, _REDUCE_SCATTER = _resolve_tensor_ops()


def _period(redop: str) -> int:
    return 2 if redop == "prod" else 4


def _base(period: int):
    import torch

    return torch.arange(1, period + 1, dtype=torch.float64)


def _pattern(count: int, rank: int, redop: str, dtype, device):
    return _tile(_base(_period(redop)).to(dtype), count, rank).to(device)


def _reduced_table(n: int, redop: str):
    """R[j] = reduce over ranks r of BASE[(j + r) % P], for j in [0, P)."""
    import torch

    period = _period(redop)
    base = _base(period)
    stacked = torch.stack([base[(torch.arange(period) + r) % period] for r in range(n)])
    if redop == "sum":
        return stacked.sum(0)
    if redop == "prod":
        return stacked.prod(0)
    if redop == "min":
        return stacked.min(0).values
    if redop == "max":
        return stacked.max(0).values
    return stacked.mean(0)


def get(name: str) -> Collective:
    """The spec of a collective by CLI name.

    Raises:
        ValueError: an unknown name (the message lists the accepted ones).
    """
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; expected one of: {', '.join(COLLECTIVES)}") from None
