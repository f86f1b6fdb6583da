"""Each source file to samples: an nccl-tests log or a Kineto trace, told apart from delaycomm stats by its content,
read into per (op, bytes) latency samples and the measurements the cost model fits (docs/profile.md)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from delaycomm import costmodel
from delaycomm.sources import kineto, nccl_tests
from delaycomm.sources.histogram import Pool, Spread
from delaycomm.sources.ops import collective_of_op, element_size

__all__ = ["SourceError", "Options", "Source", "DEFAULT_TAIL", "kind_of", "read_source", "row_class_bytes"]

DEFAULT_TAIL = 1.25  # p99/p50 of the spread of a mean (docs/profile.md, "Where production latency comes from")
MAX_OBSERVATIONS = 64  # the cost model's measurements kept per (collective, size, scale) of a source
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
    nccl_algo: str | None = None  # --nccl-algo/--nccl-proto: the cluster's NCCL_ALGO/NCCL_PROTO (the model's choices)
    nccl_proto: str | None = None
    trace_gpus_per_node: int = 8  # the GPUs per node of the jobs that wrote the traces
    source_ranks: int | None = None  # --source-ranks/--source-nodes: the sources' scale, where they do not say it
    source_nodes: int | None = None
    strict: bool = False  # --strict: a log whose validation failed is refused, not warned about
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
    samples: dict[tuple[str, int], list[Pool]] = field(default_factory=dict)  # the parts of each (op, bytes)
    unsized: dict[str, list[float]] = field(default_factory=dict)
    unsized_why: dict[str, dict[str, int]] = field(default_factory=dict)
    observations: list[costmodel.Observation] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    backends: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)  # said on stderr (a validation that failed)
    _pools: dict[tuple[tuple[str, ...], int], Pool] = field(default_factory=dict, repr=False)
    _observed: dict[tuple, int] = field(default_factory=dict, repr=False)

    @property
    def topology(self) -> costmodel.Topology | None:
        if not self.world_size or not self.nodes:
            return None
        try:
            return costmodel.Topology(self.world_size, self.nodes)
        except costmodel.ModelError:
            return None

    def pool(self, ops: tuple[str, ...], nbytes: int) -> Pool:
        """The pool the rows of ``ops`` (a collective's ops, which share its rows) of ``nbytes`` go into."""
        key = (ops, int(nbytes))
        p = self._pools.get(key)
        if p is None:
            p = self._pools[key] = Pool()
            for op in ops:
                self.samples.setdefault((op, int(nbytes)), []).append(p)
        return p

    def observe(self, o: costmodel.Observation) -> None:
        """A measurement for the cost model: the first :data:`MAX_OBSERVATIONS` of each (collective, size, scale)
        are kept (a sweep appended thousands of times adds no more to the fit, and its memory stays bounded); how
        many more were seen is in ``info["observations_not_kept"]``."""
        key = (o.collective, o.size, o.topology.ranks, o.topology.nodes)
        n = self._observed.get(key, 0)
        self._observed[key] = n + 1
        if n < MAX_OBSERVATIONS:
            self.observations.append(o)

    @property
    def observations_not_kept(self) -> int:
        return sum(max(0, n - MAX_OBSERVATIONS) for n in self._observed.values())

    def add(self, op: str, nbytes: int, samples: np.ndarray) -> None:
        """Each of ``samples`` as one call of ``op`` of ``nbytes``."""
        self.pool((op,), nbytes).add_array(samples)


_JSON_START = re.compile(r'[{\[]\s*(?:["{\[\]}\-0-9tfn]|$)')


def _json_prefix(head: str, whole: bool) -> tuple[bool, str | None]:
    """Whether ``head`` (the start of a file, all of it when ``whole``) is JSON, and the parser's complaint when it
    is not: a document with nothing but blanks after it, or one the head cuts short."""
    try:
        _, end = json.JSONDecoder().raw_decode(head)
    except json.JSONDecodeError as e:
        if not whole and e.pos >= len(head) - 64:
            return True, None  # the head ends inside the document
        return False, f"not JSON ({e.msg}: line {e.lineno} column {e.colno})"
    except (RecursionError, ValueError):
        return True, None  # nested deeper than the parser goes, an integer of thousands of digits: JSON, refused
        # by its reader
    rest = head[end:].strip()
    if not rest:
        return True, None
    return False, f"not one JSON document (more after line {head.count(chr(10), 0, end) + 1})"


def _looks(head: str) -> str:
    """What a file looked like, for the message refusing it: its first non-blank line, shortened."""
    for line in head.splitlines():
        if line.strip():
            shown = line.strip()
            return repr(shown[:77] + "..." if len(shown) > 80 else shown)
    return "an empty file" if not head else "only blank lines"


def _has_timings(path: str) -> bool:
    """Whether the text at ``path`` has an nccl-tests record's key, searched chunk by chunk (not held whole)."""
    from delaycomm.sources.files import iter_chunks

    chunks = iter_chunks(path, "file", SourceError)
    tail = b""
    try:
        for chunk in chunks:
            data = tail + chunk
            if b'"out_of_place"' in data or b'"in_place"' in data:
                return True
            tail = data[-16:]  # a key cut by the chunk's end
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return False


def kind_of(path: str) -> str:
    """``stats``, ``nccl-tests`` or ``kineto``: what the file at ``path`` holds, by its content (not its first
    character: a log may start with a shell prompt ``[root@host dir]#`` or Open MPI's ``[1,0]<stdout>:``).

    Raises:
        SourceError: it cannot be read (it is not a regular file, or is too large) or is none of them (the message
            says what it looked like).
    """
    from delaycomm.sources.files import iter_lines, read_head

    size = 1 << 16
    raw = read_head(path, "file", SourceError, size)  # a regular file only: a FIFO is refused, not waited on
    head = raw.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    why_not_json = None
    if _JSON_START.match(head):
        is_json, why_not_json = _json_prefix(head, len(raw) < size)
        if is_json:
            if '"traceEvents"' in head or '"schemaVersion"' in head or (head.startswith("[") and '"ph"' in head):
                return "kineto"
            if '"delaycomm-profile"' in head:
                raise SourceError(
                    f"delaycomm: profile: {path!r} is a delaycomm profile (format delaycomm-profile), not a source: "
                    "a profile is read by --show or DELAYCOMM_DELAY=profile:PATH, and built from stats files, "
                    "nccl-tests logs and traces"
                )
            if '"out_of_place"' in head or '"in_place"' in head or '"results"' in head:
                return "nccl-tests"
            if len(raw) == size and _has_timings(path):  # a large document: its records may come after the head
                return "nccl-tests"
            return "stats"  # the stats reader names what is wrong with it
    if any(nccl_tests.looks_like(line) for line in iter_lines(path, "file", SourceError)):
        return "nccl-tests"
    if why_not_json is not None and not any(c in head[:200] for c in "<]") and head[:1] == "{":
        return "stats"  # broken JSON that starts as an object: the stats reader names the line and column
    looked = f"it starts with {_looks(head)}" + (f", which is {why_not_json}" if why_not_json else "")
    raise SourceError(
        f"delaycomm: profile: {path!r} is none of the sources delaycomm reads: {looked}. Expected delaycomm stats "
        "(JSON with ops or groups), an nccl-tests log (its table header 'size count type ... time algbw busbw' "
        "somewhere in it), nccl-tests' -J JSON (a results list), or a PyTorch profiler trace (JSON with "
        "traceEvents, .json or .json.gz)"
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


def _row_spread(tm, opt: Options) -> Spread:
    """The spread of a row's mean: from nccl-tests' per-iteration columns when printed, else ``--tail``."""
    if tm.per_iter and "i_p99" in tm.per_iter:
        pi = tm.per_iter
        spread = Spread.from_tail(
            tm.time_us, pi["i_p99"], pi.get("i_min"), pi.get("i_max"), pi["i_cv"] / 100 if "i_cv" in pi else None
        )
        return Spread(
            spread.p99_over_p50,
            None if spread.lo is None else spread.lo * 1e3,
            None if spread.hi is None else spread.hi * 1e3,
        )
    return Spread(opt.tail)


def _table_rows(src: Source, t, opt: Options) -> tuple[dict[str, int], int]:
    """A table's rows into the source's pools (and the model's measurements when re-targeting)."""
    c = t.collective
    first, second = _placement(c, opt.placement)
    topo = None
    if t.world_size and t.nodes:
        try:
            topo = costmodel.Topology(t.world_size, t.nodes, opt.nics_per_node)
        except costmodel.ModelError:
            topo = None
    used: dict[str, int] = {}
    from_columns = 0
    for r in t.rows:
        tm = r.timings.get(first) or r.timings.get(second)
        if tm is None:
            continue
        place = first if first in r.timings else second
        used[place] = used.get(place, 0) + 1
        spread = _row_spread(tm, opt)
        from_columns += bool(tm.per_iter and "i_p99" in tm.per_iter)
        try:
            nbytes = c.per_rank_bytes(r.size, r.count, element_size(r.dtype), t.world_size)
        except ValueError as e:
            raise SourceError(f"delaycomm: profile: nccl-tests log {t.at(r)}: {e}") from None
        src.pool(c.ops, nbytes).add(tm.time_us * 1e3, spread)
        if topo is not None and r.size > 0:
            src.observe(costmodel.Observation(c.name, r.size, topo, tm.time_us * 1e-6, t.at(r)))
    return used, from_columns


def _describe(t, used: dict[str, int]) -> dict:
    d = {
        "line": t.line,
        "collective": t.collective.name,
        "ops": list(t.collective.ops),
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
    if t.runs > 1:
        d["interleaved_runs"] = t.runs
    if t.ranks_listed is not None:
        d["rank_lines_list_only"] = t.ranks_listed[:64]
    return d


_SAME = ("collective", "world_size", "world_size_from", "nodes", "elided", "validation", "iterations")


def _read_nccl_tests(path: str, opt: Options) -> Source:
    src = Source(path, "nccl-tests", None, None)
    src.backends.add("nccl")
    described: list[dict] = []
    same: dict[tuple, dict] = {}  # the description of a run, by what runs appended one after another share
    worlds, hosts = set(), set()
    spreads_from_columns = 0
    failed: list[str] = []  # the first 64 places a validation failed
    n_failed = 0
    try:
        for t in nccl_tests.iter_tables(path, opt.op, opt.source_ranks, opt.source_nodes):
            worlds.add(t.world_size)
            hosts.add(t.nodes)
            used, n = _table_rows(src, t, opt)
            spreads_from_columns += n
            bad = nccl_tests.failed_rows(t)
            n_failed += len(bad)
            failed.extend(bad[: max(0, 64 - len(failed))])
            d = _describe(t, used)
            key = tuple(repr(d.get(k)) for k in _SAME)
            last = same.get(key)
            if last is not None:  # a sweep appended run after run: one description, counted
                last["runs_appended"] = last.get("runs_appended", 1) + 1
                last["last_line"] = t.line
                last["rows"] += d["rows"]
                for k, v in used.items():
                    last["placement"][k] = last["placement"].get(k, 0) + v
            else:
                described.append(d)
                same[key] = d
            t.rows = []  # read: not held to the end
    except nccl_tests.NcclTestsError as e:
        raise SourceError(f"delaycomm: profile: {e}") from None
    src.world_size = worlds.pop() if len(worlds) == 1 else None
    src.nodes = hosts.pop() if len(hosts) == 1 else None
    if failed:
        shown = "; ".join(failed[:8]) + (f"; and {n_failed - 8} more" if n_failed > 8 else "")
        what = f"nccl-tests log {path!r}: its validation failed in {n_failed} place(s): {shown}"
        if opt.strict:
            raise SourceError(f"delaycomm: profile: --strict: {what} (the times of a run that computed wrong results)")
        src.warnings.append(f"warning: {what}; read anyway (--strict refuses such a log)")
    src.info = {"tables": described, "spread_from_per_iteration_columns": spreads_from_columns}
    if src.observations_not_kept:
        src.info["observations_not_kept"] = src.observations_not_kept
    if failed:
        src.info["validation_failed"] = {"places": n_failed, "first": failed}
    return src


def _read_kineto(path: str, opt: Options) -> Source:
    try:
        tr = kineto.read_trace(path, (opt.injected or {}).get(path))
    except kineto.KinetoError as e:
        raise SourceError(f"delaycomm: profile: {e}") from None
    gpn = opt.trace_gpus_per_node
    world = tr.world_size
    if opt.source_ranks is not None:
        if world is not None and world != opt.source_ranks:
            raise SourceError(
                f"delaycomm: profile: trace {path!r}: --source-ranks {opt.source_ranks} but its distributedInfo "
                f"says world_size {world}"
            )
        world = opt.source_ranks
    nodes = max(1, math.ceil(world / gpn)) if world else None
    nodes = opt.source_nodes or nodes
    src = Source(path, "kineto", world, nodes)
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
        src.pool((call.op,), call.nbytes).add(call.dur_ns)
        c = collective_of_op(call.op)
        n = call.group_size or world
        if c is not None and n and call.nbytes > 0:
            groups.setdefault((c.name, c.total_bytes(call.nbytes, n), n), []).append(call.dur_ns)
    for (name, size, n), durs in sorted(groups.items()):
        try:
            topo = costmodel.Topology(n, opt.source_nodes if n == world and opt.source_nodes else math.ceil(n / gpn),
                                      opt.nics_per_node)  # fmt: skip
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
