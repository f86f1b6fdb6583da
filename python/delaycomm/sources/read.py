"""Each source file to samples: an nccl-tests log or a Kineto trace, told apart from delaycomm stats by its content,
read into per (op, bytes) latency samples and the measurements the cost model fits (docs/profile.md)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from delaycomm import costmodel
from delaycomm.sources import kineto, nccl_tests
from delaycomm.sources.histogram import Spread, spread_samples
from delaycomm.sources.ops import collective_of_op, element_size

__all__ = ["SourceError", "Options", "Source", "DEFAULT_TAIL", "kind_of", "read_source", "row_class_bytes"]

DEFAULT_TAIL = 1.25  # p99/p50 of the spread of a mean (docs/profile.md, "Where production latency comes from")
_SNAP = 1e-3  # nccl-tests rounds counts down to whole elements per rank: a size this close under 2^k is 2^k


class SourceError(ValueError):
    """A source that cannot be made into a profile (the message names the file, and the line or field)."""


@dataclass(frozen=True)
class Options:
    """How sources become a profile (the ``profile`` command's flags)."""

    op: str | None = None  # --op: the collective of tables the logs do not name
    tail: float = DEFAULT_TAIL  # --tail: p99/p50 of the spread of a table's mean
    placement: str = "auto"  # --placement: auto (as torch calls the op), out-of-place, in-place
    ranks: int | None = None  # --ranks/--nodes: re-target to this scale
    nodes: int | None = None
    nics_per_node: int | None = None
    trace_gpus_per_node: int = 8  # the GPUs per node of the jobs that wrote the traces
    # --without-injected: per trace, microseconds to take from each backend event (sources/injected.py)
    without_injected: bool = False
    injected: dict | None = None


@dataclass
class Source:
    """What one file gave: samples per (op, bytes), the measurements the model fits, and what it said about itself."""

    path: str
    kind: str
    world_size: int | None
    nodes: int | None
    samples: dict[tuple[str, int], list[np.ndarray]] = field(default_factory=dict)
    unsized: dict[str, list[float]] = field(default_factory=dict)
    unsized_why: dict[str, dict[str, int]] = field(default_factory=dict)
    observations: list[costmodel.Observation] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    backends: set[str] = field(default_factory=set)

    @property
    def topology(self) -> costmodel.Topology | None:
        if not self.world_size or not self.nodes:
            return None
        try:
            return costmodel.Topology(self.world_size, self.nodes)
        except costmodel.ModelError:
            return None

    def add(self, op: str, nbytes: int, samples: np.ndarray) -> None:
        self.samples.setdefault((op, int(nbytes)), []).append(samples)


def kind_of(path: str) -> str:
    """``stats``, ``nccl-tests`` or ``kineto``: what the file at ``path`` holds, by its content.

    Raises:
        SourceError: it cannot be read (it is not a regular file, or is too large) or is none of them.
    """
    from delaycomm.sources.files import read_bytes

    data = read_bytes(path, "file", SourceError)  # a regular file only: a FIFO is refused, not waited on
    text = data[: 1 << 16].decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if text.startswith("{") or text.startswith("["):
        if '"traceEvents"' in text or '"schemaVersion"' in text or (text.startswith("[") and '"ph"' in text):
            return "kineto"
        if b'"out_of_place"' not in data and b'"in_place"' not in data:
            return "stats"  # no nccl-tests -J record in it: not parsed twice (the stats reader names what is wrong)
        try:
            doc = json.loads(data.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            return "stats"
        return "nccl-tests" if nccl_tests.looks_like_json(doc) else "stats"
    if nccl_tests.looks_like(data.decode("utf-8", errors="replace")):
        return "nccl-tests"
    raise SourceError(
        f"delaycomm: profile: {path!r} is not delaycomm stats (JSON), an nccl-tests log (no table header "
        "'size count type ... time algbw busbw' in it) or a PyTorch profiler trace"
    )


def _placement(c, flag: str) -> tuple[str, str]:
    if flag == "auto":
        return ("in-place", "out-of-place") if c.in_place else ("out-of-place", "in-place")
    return (flag, "in-place" if flag == "out-of-place" else "out-of-place")


def row_class_bytes(nbytes: int) -> int:
    """The bytes a row counts as: a size just under a power of two (nccl-tests' rounding) is that power of two."""
    if nbytes > 0:
        up = 1 << int(nbytes - 1).bit_length()
        if up != nbytes and (up - nbytes) <= _SNAP * up:
            return up
    return nbytes


def _read_nccl_tests(path: str, opt: Options) -> Source:
    try:
        tables = nccl_tests.read_tables(path, opt.op)
    except nccl_tests.NcclTestsError as e:
        raise SourceError(f"delaycomm: profile: {e}") from None
    worlds = {t.world_size for t in tables}
    hosts = {t.nodes for t in tables if t.nodes}
    src = Source(
        path, "nccl-tests", worlds.pop() if len(worlds) == 1 else None, hosts.pop() if len(hosts) == 1 else None
    )
    src.backends.add("nccl")
    described = []
    spreads_from_columns = 0
    for t in tables:
        c = t.collective
        first, second = _placement(c, opt.placement)
        topo = None
        if t.world_size and t.nodes:
            try:
                topo = costmodel.Topology(t.world_size, t.nodes, opt.nics_per_node)
            except costmodel.ModelError:
                topo = None
        used = {}
        for r in t.rows:
            tm = r.timings.get(first) or r.timings.get(second)
            if tm is None:
                continue
            place = first if first in r.timings else second
            used[place] = used.get(place, 0) + 1
            if tm.per_iter and "i_p99" in tm.per_iter:
                pi = tm.per_iter
                spread = Spread.from_tail(
                    tm.time_us,
                    pi["i_p99"],
                    pi.get("i_min"),
                    pi.get("i_max"),
                    pi["i_cv"] / 100 if "i_cv" in pi else None,
                )
                spread = Spread(
                    spread.p99_over_p50,
                    None if spread.lo is None else spread.lo * 1e3,
                    None if spread.hi is None else spread.hi * 1e3,
                )
                spreads_from_columns += 1
            else:
                spread = Spread(opt.tail)
            try:
                nbytes = c.per_rank_bytes(r.size, r.count, element_size(r.dtype), t.world_size)
            except ValueError as e:
                raise SourceError(f"delaycomm: profile: nccl-tests log {t.at(r)}: {e}") from None
            samples = spread_samples(tm.time_us * 1e3, spread)
            for op in c.ops:
                src.add(op, nbytes, samples)
            if topo is not None and r.size > 0:
                src.observations.append(costmodel.Observation(c.name, r.size, topo, tm.time_us * 1e-6, t.at(r)))
        described.append(
            {
                "line": t.line,
                "collective": c.name,
                "ops": list(c.ops),
                "named_by": t.collective_by,
                "world_size": t.world_size,
                "world_size_from": t.world_size_by,
                "nodes": t.nodes,
                "rows": len(t.rows),
                "placement": used,
                "elided": t.elided,
                "validation": t.validation,
                "iterations": t.params.get("iters"),
                "versions": t.versions,
            }
        )
    src.info = {"tables": described, "spread_from_per_iteration_columns": spreads_from_columns}
    return src


def _read_kineto(path: str, opt: Options) -> Source:
    try:
        tr = kineto.read_trace(path, (opt.injected or {}).get(path))
    except kineto.KinetoError as e:
        raise SourceError(f"delaycomm: profile: {e}") from None
    gpn = opt.trace_gpus_per_node
    nodes = max(1, math.ceil(tr.world_size / gpn)) if tr.world_size else None
    src = Source(path, "kineto", tr.world_size, nodes)
    if tr.backend:
        src.backends.add(tr.backend)
    groups: dict[tuple[str, int, int], list[float]] = {}
    by_source: dict[str, int] = {}
    for call in tr.calls:
        by_source[call.source] = by_source.get(call.source, 0) + 1
        if call.nbytes is None:
            src.unsized.setdefault(call.op, []).append(call.dur_ns)
            why = src.unsized_why.setdefault(call.op, {})
            why[call.why_unsized or "unknown"] = why.get(call.why_unsized or "unknown", 0) + 1
            continue
        src.add(call.op, call.nbytes, np.array([call.dur_ns]))
        c = collective_of_op(call.op)
        n = call.group_size or tr.world_size
        if c is not None and n and call.nbytes > 0:
            groups.setdefault((c.name, c.total_bytes(call.nbytes, n), n), []).append(call.dur_ns)
    for (name, size, n), durs in sorted(groups.items()):
        try:
            topo = costmodel.Topology(n, math.ceil(n / gpn), opt.nics_per_node)
        except costmodel.ModelError:
            continue  # a group that does not fill its nodes evenly: not a scale the model prices
        src.observations.append(costmodel.Observation(name, size, topo, float(np.median(durs)) * 1e-9, path))
    src.info = {
        "rank": tr.rank,
        "calls": len(tr.calls),
        "calls_by_size_source": by_source,
        "unattributed_kernels": tr.unattributed,
        "nccl_version": tr.nccl_version,
        "nodes_assumed": f"ceil(world size / {gpn}) (--trace-gpus-per-node)",
    }
    return src


def read_source(path: str, opt: Options, kind: str | None = None) -> Source:
    """What the nccl-tests log or Kineto trace at ``path`` gives (its samples and the measurements the model fits).

    Raises:
        SourceError: the file cannot be read, or is delaycomm stats (read by ``delaycomm.profile.build``).
    """
    kind = kind or kind_of(path)
    if kind == "stats":
        raise SourceError(f"delaycomm: profile: {path!r} is delaycomm stats, not an nccl-tests log or a trace")
    return (_read_kineto if kind == "kineto" else _read_nccl_tests)(path, opt)
