"""A reader of nccl-tests' (and rccl-tests') stdout, as logs come: wrapped, interleaved, abridged.

The table is found by its column header (``size count type [redop] [root] time algbw busbw #wrong time ...``, in
any of nccl-tests' versions, with or without its ``#``) and read by column name, so that old and new headers,
``error``/``#wrong``/``#bitdiff``, per-iteration and timestamp columns and overflowing fields all read the same.
Around it the reader skips what launchers and NCCL add (``[1,0]<stdout>:`` and ``srun -l`` prefixes, ``NCCL INFO``
lines, MPI warnings, shell prompts and xtrace, ``...`` elisions). Each table's collective is the one the log names
(``Collective test starting: X_perf``, a ``X_perf`` command line), else the one its columns and numbers allow
(:func:`infer_collective`), else ``--op``; its world size comes from the rank lines, else from its numbers.

Strict where it matters: a line that looks like a row of the table but does not fit its header, a number that
does not parse, a time that disagrees with its own bandwidth, rank lines of processes that each ran alone, and a
collective the columns contradict are errors naming the file and the line.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator

from delaycomm.sources.files import iter_lines, read_bytes, read_head
from delaycomm.sources.nccl_json import looks_like_json
from delaycomm.sources.nccl_json_stream import read_json_tables
from delaycomm.sources.nccl_tables import NcclTestsError, Row, Table, Timing
from delaycomm.sources.nccl_text import iter_parse, looks_like, parse
from delaycomm.sources.ops import COLLECTIVES, OP_NAMES_HELP, Collective, collective, element_size

__all__ = [
    "NcclTestsError",
    "Timing",
    "Row",
    "Table",
    "looks_like",
    "looks_like_json",
    "read_tables",
    "iter_tables",
    "failed_rows",
    "parse",
    "infer_collective",
]


_REDUCTIONS = {"sum", "prod", "max", "min", "avg", "mulsum", "premulsum"}


def read_text(path: str) -> str:
    """The text of a log (``.gz`` read through gzip), undecodable bytes replaced."""
    return read_bytes(path, "nccl-tests log", NcclTestsError).decode("utf-8", errors="replace")


def _is_json(path: str) -> bool:
    head = read_head(path, "nccl-tests log", NcclTestsError, 4096).decode("utf-8", errors="replace")
    return head.lstrip("\ufeff \t\r\n").startswith("{")


def iter_tables(
    path: str, op: str | None = None, source_ranks: int | None = None, source_nodes: int | None = None
) -> Iterator[Table]:
    """The tables of the log at ``path`` (stdout, or the JSON of nccl-tests' ``-J``), one by one as they are read,
    each with its collective and world size resolved.

    Args:
        path: the log (plain or gzip).
        op: the collective of tables the log does not name and that cannot be told apart (``--op``).
        source_ranks: the world size of runs whose log does not say it (``--source-ranks``).
        source_nodes: the nodes of runs whose log does not say them (``--source-nodes``).

    Raises:
        NcclTestsError: the file cannot be read, holds no table, or a table cannot be read or resolved.
    """
    forced = collective(op) if op else None
    if op and forced is None:
        raise NcclTestsError(f"--op {op!r} names no collective; expected {OP_NAMES_HELP}")
    if _is_json(path):
        tables: Iterable[Table] = read_json_tables(path)  # a stream: records one at a time
    else:
        tables = iter_parse(iter_lines(path, "nccl-tests log", NcclTestsError), path)
    n = 0
    for t in tables:
        resolve(t, forced, source_ranks, source_nodes)
        n += 1
        yield t
    if not n:
        raise NcclTestsError(
            f"nccl-tests log {path!r} holds no table (expected a column header 'size count type ... time algbw "
            "busbw' and rows below it, or a JSON results list)"
        )


def read_tables(
    path: str, op: str | None = None, source_ranks: int | None = None, source_nodes: int | None = None
) -> list[Table]:
    """Every table of the log at ``path`` (:func:`iter_tables`), rows kept."""
    return list(iter_tables(path, op, source_ranks, source_nodes))


def failed_rows(t: Table) -> list[str]:
    """Where a table says its results were wrong: rows whose ``#wrong`` is not 0 (nor N/A), and the lines of
    ``Out of bounds values : N FAILED`` footers."""
    out = []
    for r in t.rows:
        for place, tm in r.timings.items():
            w = (tm.wrong or "").strip()
            if w and w.upper() != "N/A" and not _zero(w):
                out.append(f"{t.at(r)} ({place} #wrong {w})")
    out.extend(f"{t.path}:{line} (Out of bounds values: FAILED)" for line in t.failed_lines)
    return out


def _zero(w: str) -> bool:
    """A #wrong of 0; old nccl-tests print the max error there (2e-07, 1e+00), a float tolerance, not a count."""
    try:
        x = float(w)
    except ValueError:
        return False
    return x == 0 or (("e" in w.lower() or "." in w) and x < 1e-2)


def _elsize(t: Table) -> int | None:
    sizes = {element_size(r.dtype) for r in t.rows}
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


def _ratio_ranks(t: Table) -> int | None:
    """The world size from size / (count x element size), for a collective whose size is every rank's part."""
    ns = set()
    for r in t.rows:
        e = element_size(r.dtype)
        if e and r.count > 0:
            q = r.size / (r.count * e)
            ns.add(round(q) if abs(q - round(q)) < 1e-9 else q)
    return ns.pop() if len(ns) == 1 and isinstance(next(iter(ns)), int) else None


def _bw_ratio(t: Table, placement: str = "out-of-place") -> float | None:
    """busbw / algbw over the rows precise enough to tell (algbw >= 1 GB/s), their median."""
    rs = [
        tm.busbw / tm.algbw
        for r in t.rows
        if (tm := r.timings.get(placement)) and tm.algbw and tm.busbw and tm.algbw >= 1.0
    ]
    return statistics.median(rs) if rs else None


def infer_collective(t: Table, ranks: int | None) -> list[Collective]:
    """The collectives a table's columns and numbers allow (nccl-tests' column sets, its size and bandwidth
    formulas), in the table order of :data:`COLLECTIVES`."""
    out = []
    redops = {r.redop for r in t.rows}
    roots = {r.root for r in t.rows}
    q_ranks = _ratio_ranks(t)
    r = _bw_ratio(t)
    for c in COLLECTIVES.values():
        if "redop" in t.header:
            if redops <= {"none", ""} and (c.reduces or c.name == "sendrecv"):
                continue
            if redops and redops <= _REDUCTIONS and not (c.reduces or c.name == "sendrecv"):
                continue
        elif c.reduces:
            continue
        if "root" in t.header:
            if roots == {-1} and c.rooted:
                continue
            if roots and min(roots) >= 0 and not c.rooted:
                continue
        elif c.rooted:
            continue
        if q_ranks is not None and (q_ranks > 1) != c.size_is_total:
            continue
        if r is not None and c.name == "all_reduce" and ranks and abs(r - c.bus_factor(ranks)) > 0.02:
            continue
        if r is not None and c.name in ("broadcast", "reduce", "sendrecv") and abs(r - 1.0) > 0.02:
            continue
        out.append(c)
    return out


def resolve(
    t: Table, forced: Collective | None, source_ranks: int | None = None, source_nodes: int | None = None
) -> None:
    """Sets the table's collective and world size, or raises :class:`NcclTestsError` naming what is missing.

    Rank lines that list only some ranks (a log that kept the lines of ranks 7 and 15) do not say the world size:
    it comes from the numbers (busbw / algbw) or ``source_ranks``, and must hold every rank listed."""
    ranks = len(t.ranks) if t.ranks and not t.ranks_cut else None
    if ranks and sorted(t.ranks) != list(range(len(t.ranks))):
        t.ranks_listed, ranks = sorted(t.ranks), None
    if source_ranks is not None and ranks is not None and ranks != source_ranks:
        raise NcclTestsError(
            f"nccl-tests log {t.where}: --source-ranks {source_ranks} but its rank lines list {ranks} ranks"
        )
    ranks = ranks or source_ranks
    allowed = infer_collective(t, ranks)
    if t.named is not None:
        c = COLLECTIVES[t.named]
        if c not in allowed:
            raise NcclTestsError(
                f"nccl-tests log {t.where}: the table is named {c.name} by {t.named_by} but its columns and numbers "
                f"are those of {', '.join(a.name for a in allowed) or 'no collective delaycomm knows'}"
            )
        if forced is not None and forced is not c:
            raise NcclTestsError(
                f"nccl-tests log {t.where}: --op {forced.name} but the log names this table {c.name} ({t.named_by})"
            )
        t.collective, t.collective_by = c, t.named_by
    elif len(allowed) == 1 and forced in (None, allowed[0]):
        t.collective, t.collective_by = allowed[0], "its columns and numbers (the only collective they fit)"
    elif forced is not None and forced in allowed:
        t.collective, t.collective_by = forced, "--op"
    elif forced is not None:
        raise NcclTestsError(
            f"nccl-tests log {t.where}: --op {forced.name} does not fit this table (its columns and numbers fit "
            f"{', '.join(a.name for a in allowed) or 'no collective delaycomm knows'})"
        )
    else:
        raise NcclTestsError(
            f"nccl-tests log {t.where}: the log does not name this table's collective and its columns fit "
            f"{' or '.join(a.name for a in allowed) or 'none delaycomm knows'}: give --op NAME ({OP_NAMES_HELP})"
        )
    _resolve_world(t, ranks)
    if ranks is not None and not (t.ranks and not t.ranks_cut and t.ranks_listed is None):
        t.world_size_by = "--source-ranks"
    if t.ranks_listed and t.world_size is not None and t.ranks_listed[-1] >= t.world_size:
        raise NcclTestsError(
            f"nccl-tests log {t.where}: the rank lines list rank {t.ranks_listed[-1]} but the world size is "
            f"{t.world_size} ({t.world_size_by})"
        )
    if source_nodes is not None:
        if t.nodes is not None and t.nodes != source_nodes:
            raise NcclTestsError(
                f"nccl-tests log {t.where}: --source-nodes {source_nodes} but its rank lines name {t.nodes} hosts"
            )
        t.nodes_given = source_nodes
    _check_rows(t)


def _resolve_world(t: Table, ranks: int | None) -> None:
    c = t.collective
    assert c is not None
    q = _ratio_ranks(t) if c.size_is_total else None
    if ranks is not None:
        if q is not None and q != ranks:
            raise NcclTestsError(
                f"nccl-tests log {t.where}: {ranks} rank lines but the sizes are {q} x count x element size "
                f"({c.name} has size = ranks x count x element size)"
            )
        t.world_size, t.world_size_by = ranks, "the rank lines"
        return
    if q is not None:
        t.world_size, t.world_size_by = q, "size / (count x element size)"
        return
    r = _bw_ratio(t)
    n = None
    if r is not None and c.name == "all_reduce" and r < 1.999:
        n = 2.0 / (2.0 - r)
    elif r is not None and c.name in ("all_gather", "reduce_scatter", "alltoall") and r < 0.999:
        n = 1.0 / (1.0 - r)
    if n is not None and abs(n - round(n)) < 0.1 and round(n) >= 2:
        t.world_size, t.world_size_by = round(n), "busbw / algbw"


def _check_rows(t: Table) -> None:
    """Each row's time against its own algbw: the columns were read as printed (nccl-tests: algbw = size / time;
    its old all_gather: size x (ranks - 1) / ranks / time)."""
    n = t.world_size
    for r in t.rows:
        for name, tm in r.timings.items():
            if tm.time_us <= 0 and r.size > 0:
                raise NcclTestsError(f"nccl-tests log {t.at(r)}: {name} time is {tm.time_us} (expected > 0)")
            if tm.algbw is None or tm.time_us <= 0:
                continue
            expect = [r.size / tm.time_us * 1e-3]
            if n:
                expect.append(expect[0] * (n - 1) / n)
            if not any(abs(tm.algbw - e) <= max(0.011, 0.05 * e) for e in expect):
                raise NcclTestsError(
                    f"nccl-tests log {t.at(r)}: {name} algbw {tm.algbw} GB/s disagrees with size {r.size} B / "
                    f"time {tm.time_us} us = {expect[0]:.4g} GB/s (the columns were not read as nccl-tests prints them)"
                )
