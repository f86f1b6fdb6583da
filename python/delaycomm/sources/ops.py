"""The collectives of nccl-tests, of NCCL's kernels and of PyTorch's profiler, and the delaycomm ops they stand for.

One table (:data:`COLLECTIVES`) says, per nccl-tests collective, which ops of delaycomm's op table
(csrc/ops/OpTable.hpp, the names ``stats()`` and profiles use) a torch job calls for it, how nccl-tests counts its
bytes, and its bus-bandwidth factor (nccl-tests' doc/PERFORMANCE.md). docs/profile.md, "Where production latency
comes from", has the table in prose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "Collective",
    "COLLECTIVES",
    "collective",
    "collective_of_op",
    "op_of_trace_name",
    "element_size",
    "OP_NAMES_HELP",
]


@dataclass(frozen=True)
class Collective:
    """One nccl-tests collective.

    Attributes:
        name: nccl-tests' name (``all_reduce`` for ``all_reduce_perf``).
        ops: the delaycomm ops a torch job calls for it, first the one a profile names it by.
        size_is_total: nccl-tests' ``size`` column is ``count x element size x ranks`` (every rank's part), not
            ``count x element size``.
        per_rank_bytes_from_count: the bytes a rank passes in (delaycomm's size convention) are ``count x element
            size``; otherwise they are nccl-tests' ``size``.
        reduces: the collective takes a reduction (nccl-tests prints one in its ``redop`` column).
        rooted: the collective has a root (nccl-tests prints it in its ``root`` column).
        in_place: torch calls it in place (one tensor in and out), so its in-place column is the one a job sees.
    """

    name: str
    ops: tuple[str, ...]
    size_is_total: bool
    per_rank_bytes_from_count: bool
    reduces: bool
    rooted: bool
    in_place: bool

    def bus_factor(self, ranks: int) -> float:
        """busbw / algbw for ``ranks`` ranks (nccl-tests' doc/PERFORMANCE.md)."""
        if self.name == "all_reduce":
            return 2.0 * (ranks - 1) / ranks
        if self.name in ("all_gather", "reduce_scatter", "alltoall", "gather", "scatter"):
            return (ranks - 1) / ranks
        return 1.0

    def per_rank_bytes(self, size: int, count: int, elsize: int | None, ranks: int | None) -> int:
        """The bytes one rank passes in for a table row (delaycomm's convention), from its ``size`` and ``count``."""
        if not self.per_rank_bytes_from_count:
            return size
        if elsize is not None:
            return count * elsize
        if ranks:
            return size // ranks
        raise ValueError(f"{self.name}: the per-rank size needs the element size or the rank count")

    def total_bytes(self, per_rank: int, ranks: int) -> int:
        """nccl-tests' ``size`` for a call of ``per_rank`` bytes (the inverse of :meth:`per_rank_bytes`)."""
        return per_rank * ranks if self.per_rank_bytes_from_count else per_rank


# NOTE: all_gather, reduce_scatter and all_reduce name their coalesced variants too (FSDP2 and
# torch's _coalescing_manager call them): the same NCCL collective, on the same bytes.
COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("all_reduce", ("allreduce", "allreduce_coalesced"), False, False, True, False, True),
        Collective(
            "all_gather",
            ("_allgather_base", "allgather", "allgather_into_tensor_coalesced"),
            True,
            True,
            False,
            False,
            False,
        ),
        Collective(
            "reduce_scatter",
            ("_reduce_scatter_base", "reduce_scatter", "reduce_scatter_tensor_coalesced"),
            True,
            False,
            True,
            False,
            False,
        ),
        Collective("alltoall", ("alltoall_base", "alltoall"), True, False, False, False, False),
        Collective("broadcast", ("broadcast",), False, False, False, True, True),
        Collective("reduce", ("reduce",), False, False, True, True, True),
        Collective("sendrecv", ("send", "recv"), False, False, False, False, False),
        Collective("gather", ("gather",), True, True, False, True, False),
        Collective("scatter", ("scatter",), True, True, False, True, False),
    )
}

# Every name a user, a log or a trace may give a collective, lower case, to the nccl-tests name.
_ALIASES: dict[str, str] = {}
for _c in COLLECTIVES.values():
    for _name in (_c.name, _c.name + "_perf", _c.name.replace("_", ""), *_c.ops):
        _ALIASES[_name.lower()] = _c.name
_ALIASES.update(
    {
        # torch.distributed's functions
        "all_gather_into_tensor": "all_gather",
        "all_gather_coalesced": "all_gather",
        "reduce_scatter_tensor": "reduce_scatter",
        "all_to_all": "alltoall",
        "all_to_all_single": "alltoall",
        "isend": "sendrecv",
        "irecv": "sendrecv",
        "batch_isend_irecv": "sendrecv",
        "send": "sendrecv",
        "recv": "sendrecv",
        "alltoallv": "alltoall",
    }
)

OP_NAMES_HELP = (
    "nccl-tests' names (all_reduce, all_gather, reduce_scatter, alltoall, broadcast, reduce, sendrecv, gather, "
    "scatter, with or without _perf) or torch's (all_reduce, all_gather_into_tensor, reduce_scatter_tensor, "
    "all_to_all_single, send, allreduce, _allgather_base, ...)"
)


def collective(name: str) -> Collective | None:
    """The collective a name stands for (nccl-tests', torch.distributed's, delaycomm's or NCCL's), or None."""
    key = name.strip()
    m = re.fullmatch(r"(?:nccl|rccl)([A-Z]\w*)", key)  # ncclAllReduce, rcclAllGather
    c = _ALIASES.get((m.group(1) if m else key).lower())
    return COLLECTIVES[c] if c else None


def collective_of_op(op: str) -> Collective | None:
    """The collective whose ops include the delaycomm op ``op`` (None for barrier and the like)."""
    for c in COLLECTIVES.values():
        if op in c.ops:
            return c
    return None


# The names c10d records for a call (record_param_comms' "Collective name", and the profiling titles
# "nccl:all_reduce", "gloo:all_gather": ProcessGroupNCCL.cpp, ProcessGroupGloo.cpp) -> the delaycomm op.
_TRACE_OPS: dict[str, str] = {
    "allreduce": "allreduce",
    "all_reduce": "allreduce",
    "allreduce_coalesced": "allreduce_coalesced",
    "all_reduce_coalesced": "allreduce_coalesced",
    "broadcast": "broadcast",
    "_broadcast_oop": "broadcast",
    "reduce": "reduce",
    "_reduce_oop": "reduce",
    "all_gather": "allgather",
    "allgather": "allgather",
    "_allgather_base": "_allgather_base",
    "_all_gather_base": "_allgather_base",
    "all_gather_base": "_allgather_base",
    "all_gather_into_tensor": "_allgather_base",
    "allgather_coalesced": "allgather_coalesced",
    "allgather_into_tensor_coalesced": "allgather_into_tensor_coalesced",
    "all_gather_into_tensor_coalesced": "allgather_into_tensor_coalesced",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "_reduce_scatter_base",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all": "alltoall_base",
    "all_to_allv": "alltoall_base",
    "alltoall_base": "alltoall_base",
    "all_to_all_single": "alltoall_base",
    "alltoall": "alltoall",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv_anysource",
    "recvanysource": "recv_anysource",
    "sparse_all_reduce": "allreduce",
    "sparse_allreduce": "allreduce",
    "all_reduce_sparse": "allreduce",
    "_reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_gather_coalesced": "allgather_coalesced",
    "alltoallv": "alltoall_base",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
}
# NCCL kernel names (ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllGather_RING_LL): the collective
# alone. NOTE: a kernel cannot tell all_gather from all_gather_into_tensor: it counts as the tensor form,
# FSDP's; a SendRecv kernel may be a send, a recv or an all_to_all and has no op of its own.
_KERNEL_OPS = {
    "AllReduce": "allreduce",
    "AllGather": "_allgather_base",
    "ReduceScatter": "_reduce_scatter_base",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
}


_P2P = re.compile(r"(send|recv)\s+-?\d+\s*(?:->|<-)\s*-?\d+")


def op_of_trace_name(name: str) -> str | None:
    """The delaycomm op for a trace's name of a call: ``nccl:all_reduce``, ``gloo:broadcast``, a record_param_comms
    ``Collective name`` (``allreduce``, ``_allgather_base``) or an NCCL kernel (``ncclDevKernel_AllGather_RING_LL``);
    None when the name does not say."""
    m = re.match(r"nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\(|$)", name)
    if m:
        return _KERNEL_OPS.get(m.group(1))
    for prefix in ("nccl:", "gloo:", "ucc:", "mpi:", "xccl:"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    # ProcessGroupNCCL's point-to-point titles name the peers: "nccl:send 0->1", "nccl:recv 1<-0"
    m = _P2P.fullmatch(name.strip())
    if m:
        return m.group(1)
    key = name.strip()
    return _TRACE_OPS.get(key) or _TRACE_OPS.get(key.lower())


# Element sizes by the names nccl-tests prints (its test_typenames), c10's ScalarType names (record_param_comms'
# dtype) and the C++ names Kineto writes in "Input type".
_ELEMENT_SIZES = {
    1: (
        "int8",
        "uint8",
        "char",
        "byte",
        "bool",
        "signed char",
        "unsigned char",
        "f8e4m3",
        "f8e5m2",
        "fp8_e4m3",
        "fp8_e5m2",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "c10::float8_e4m3fn",
        "c10::float8_e5m2",
        "c10::float8_e4m3fnuz",
        "c10::float8_e5m2fnuz",
        "quint8",
        "qint8",
    ),
    2: (
        "half",
        "float16",
        "fp16",
        "bfloat16",
        "bf16",
        "short",
        "short int",
        "int16",
        "c10::half",
        "c10::bfloat16",
    ),
    4: (
        "int32",
        "uint32",
        "int",
        "float",
        "float32",
        "unsigned int",
        "qint32",
        "complexhalf",
        "c10::complex<c10::half>",
    ),
    8: (
        "int64",
        "uint64",
        "double",
        "float64",
        "long",
        "long int",
        "long long",
        "unsigned long",
        "long long int",
        "int64_t",
        "complexfloat",
        "c10::complex<float>",
    ),
    16: ("complexdouble", "c10::complex<double>"),
}
_ELEMENT_SIZE = {name: size for size, names in _ELEMENT_SIZES.items() for name in names}


def element_size(type_name: str) -> int | None:
    """Bytes per element for a type name as nccl-tests, c10 or Kineto print it; None when unknown."""
    return _ELEMENT_SIZE.get(type_name.strip().lower())
