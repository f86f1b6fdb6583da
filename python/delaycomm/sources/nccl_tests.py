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

import re
import statistics
from dataclasses import dataclass, field

from delaycomm.sources.files import read_bytes
from delaycomm.sources.ops import COLLECTIVES, OP_NAMES_HELP, Collective, collective, element_size

__all__ = ["NcclTestsError", "Timing", "Row", "Table", "looks_like", "read_tables", "parse", "infer_collective"]


class NcclTestsError(ValueError):
    """An nccl-tests log that cannot be read (the message names the file, the line and what is wrong)."""


@dataclass
class Timing:
    """One placement's columns of a row: its mean time (us), bandwidths (GB/s), wrong count, per-iteration stats."""

    time_us: float
    algbw: float | None
    busbw: float | None
    wrong: str | None
    per_iter: dict[str, float] | None = None


@dataclass
class Row:
    line: int
    size: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    timings: dict[str, Timing]  # "out-of-place" / "in-place"


@dataclass
class Table:
    """One table of a log: its rows and what the log says about the run that printed it."""

    path: str
    line: int  # the column header's line
    header: list[str]
    header_text: str = ""  # the header as printed
    rows: list[Row] = field(default_factory=list)
    named: str | None = None  # the collective the log names
    named_by: str | None = None
    ranks: dict[int, tuple[str, int]] = field(default_factory=dict)  # rank -> (host, pid)
    params: dict[str, int] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    groups: list[tuple[str, dict[str, int]]] = field(default_factory=list)  # placement -> {column: field}
    elided: bool = False
    validation: str | None = None  # the footer's "Out of bounds values" verdict
    # Resolved by resolve():
    collective: Collective | None = None
    collective_by: str | None = None
    world_size: int | None = None
    world_size_by: str | None = None

    @property
    def hosts(self) -> list[str]:
        return sorted({h for h, _ in self.ranks.values()})

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


# A launcher's prefix on a line: Open MPI's --tag-output "[1,0]<stdout>:", srun -l's "0: ", a markdown quote "> ",
# kubectl logs --timestamps' "2024-05-01T12:00:00.123456789Z ".
_PREFIX = re.compile(
    r"^(?:\[\d+,\d+\]<\w+>:|\s*\d+:\s|\s*>\s?|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s)"
)
_RANK = re.compile(r"\bRank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+\d+")
_STARTING = re.compile(r"Collective test (starting|concluded):\s*(\S+)")
_PERF_NAME = re.compile(r"(?<![\w-])([a-z_2]+)_perf(?![\w-])")
_BARE_NAME = re.compile(r"(?<![\w-])(all_reduce|all_gather|reduce_scatter|alltoall|sendrecv)(?![\w-])")
_PARAMS = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_ITERS = re.compile(r"(warmup iters|agg iters|iters):\s*(\d+)")
_VERSION = re.compile(r"\b(nccl-tests|rccl-tests|NCCL|RCCL)\s+version\s*:?\s*(\S+)")
_INT = re.compile(r"\d+")
_REDUCTIONS = {"sum", "prod", "max", "min", "avg", "mulsum", "premulsum"}

# Header labels, as the versions of nccl-tests print them, to one name.
_LABELS = {
    "size": "size",
    "bytes": "size",
    "count": "count",
    "n": "count",
    "type": "type",
    "redop": "redop",
    "op": "redop",
    "root": "root",
    "time": "time",
    "cputime": "time",
    "algbw": "algbw",
    "busbw": "busbw",
    "#wrong": "wrong",
    "wrong": "wrong",
    "error": "wrong",
    "res": "wrong",
    "#bitdiff": "bitdiff",
    "i_min": "i_min",
    "i_max": "i_max",
    "i_p99": "i_p99",
    "i_cv%": "i_cv",
    "timestamp": "timestamp",
}
_LEADING = ("size", "count", "type", "redop", "root")


def _strip(line: str) -> str:
    """The line without launcher prefixes and trailing blanks (``#`` kept)."""
    line = line.rstrip()
    for _ in range(3):
        m = _PREFIX.match(line)
        if not m or not m.group(0):
            break
        line = line[m.end() :]
    return line


def _uncomment(line: str) -> str:
    return line.lstrip().lstrip("#").strip()


def _header_of(text: str) -> list[str] | None:
    """The normalised column labels when ``text`` (uncommented) is a table's column header, else None."""
    tokens = text.split()
    if len(tokens) < 6 or tokens[0].lower() not in ("size", "bytes"):
        return None
    labels = [_LABELS.get(t.lower()) for t in tokens]
    if None in labels or "time" not in labels or "algbw" not in labels or "busbw" not in labels:
        return None
    return labels  # type: ignore[return-value]


def looks_like(text: str) -> bool:
    """Whether ``text`` holds an nccl-tests table (a column header somewhere, with or without its ``#``)."""
    return any(_header_of(_uncomment(_strip(line))) for line in text.splitlines())


def read_text(path: str) -> str:
    """The text of a log (``.gz`` read through gzip), undecodable bytes replaced."""
    data = read_bytes(path, "nccl-tests log", NcclTestsError)
    return data.decode("utf-8", errors="replace")


def read_tables(path: str, op: str | None = None) -> list[Table]:
    """The tables of the log at ``path``, each with its collective and world size resolved.

    Args:
        path: the log (plain or gzip).
        op: the collective of tables the log does not name and that cannot be told apart (``--op``).

    Raises:
        NcclTestsError: the file cannot be read, holds no table, or a table cannot be read or resolved.
    """
    tables = parse(read_text(path), path)
    if not tables:
        raise NcclTestsError(
            f"nccl-tests log {path!r} holds no table (expected a column header 'size count type ... time algbw "
            "busbw' and rows below it)"
        )
    forced = collective(op) if op else None
    if op and forced is None:
        raise NcclTestsError(f"--op {op!r} names no collective; expected {OP_NAMES_HELP}")
    for t in tables:
        resolve(t, forced)
    return tables


class _Parser:
    """The line loop of :func:`parse`: the state between a run's preamble, its table and its footer."""

    def __init__(self, path: str):
        self.path = path
        self.tables: list[Table] = []
        self.table: Table | None = None  # the table whose rows are being read
        self.closed: Table | None = None  # the last table, closed by its footer
        self.names: dict[str, tuple[str, int]] = {}  # collective names seen since the last table
        self.starting: tuple[str, int] | None = None
        self.ranks: dict[int, tuple[str, int]] = {}
        self.params: dict[str, int] = {}
        self.versions: dict[str, str] = {}
        self.placements: list[str] | None = None

    def fail(self, lineno: int, why: str) -> None:
        raise NcclTestsError(f"nccl-tests log {self.path}:{lineno}: {why}")

    def new_run(self) -> None:
        self.ranks, self.params, self.placements = {}, {}, None

    def feed(self, lineno: int, raw: str) -> None:
        line = _strip(raw)
        text = _uncomment(line)
        if not text or "NCCL INFO" in text or "NCCL WARN" in text:
            return
        header = _header_of(text)
        if header:
            self.open_table(lineno, header)
            self.table.header_text = " ".join(text.split())
            return
        if self.table is not None and self.row_like(text):
            if line.lstrip().startswith("#"):
                return  # a commented-out row is not data
            self.table.rows.append(self.parse_row(lineno, text, self.table))
            return
        if self.table is None and self.closed is not None and not line.lstrip().startswith("#"):
            if self.row_like(text) and len(text.split()) >= len(self.closed.header):
                self.fail(lineno, f"a table row after the table of line {self.closed.line} ended (no header above it)")
        self.preamble(lineno, line, text)

    def row_like(self, text: str) -> bool:
        tokens = text.split()
        return len(tokens) >= 5 and bool(_INT.fullmatch(tokens[0])) and bool(_INT.fullmatch(tokens[1]))

    def preamble(self, lineno: int, line: str, text: str) -> None:
        """A line that is not a header or a row: the run's description, a footer, or text to skip."""
        m = _STARTING.search(text)
        if m:
            self.close()
            if m.group(1) == "starting":
                self.new_run()
                self.names = {}
                self.starting = (m.group(2), lineno)
            return
        if text.startswith("Out of bounds values"):
            if self.table is not None:
                self.table.validation = text.split(":", 1)[-1].strip()
            return
        if text.startswith("Avg bus bandwidth"):
            self.close()
            return
        if text == "..." or text == "…":
            if self.table is not None:
                self.table.elided = True
            return
        m = _PARAMS.search(text)
        if m:
            self.close()
            if self.ranks:  # a second run without a "starting" line
                self.new_run()
            self.params = {"nthreads": int(m.group(1)), "ngpus": int(m.group(2))}
            self.params.update({k.replace(" ", "_"): int(v) for k, v in _ITERS.findall(text)})
            return
        m = _RANK.search(text)
        if m:
            rank, pid, host = int(m.group(1)), int(m.group(2)), m.group(3)
            seen = self.ranks.get(rank)
            if seen is not None and seen != (host, pid):
                self.fail(
                    lineno,
                    f"rank {rank} is listed twice ({seen[0]} pid {seen[1]}, {host} pid {pid}): these processes each "
                    "ran nccl-tests alone (nccl-tests built without MPI?): no collective of many ranks",
                )
            self.ranks[rank] = (host, pid)
            return
        for name, version in _VERSION.findall(text):
            self.versions[name] = version
        if "out-of-place" in text or "in-place" in text:
            self.placements = [w for w in text.split() if w in ("out-of-place", "in-place")] or None
            return
        if not line.lstrip().startswith("#"):
            self.command_names(lineno, text)

    def command_names(self, lineno: int, text: str) -> None:
        """Collective names on a text line (a command line ``./build/all_gather_perf``): evidence for the next table."""
        for pattern in (_PERF_NAME, _BARE_NAME):
            for name in pattern.findall(text):
                c = collective(name)
                if c is not None:
                    self.names.setdefault(c.name, (text.strip()[:80], lineno))

    def open_table(self, lineno: int, header: list[str]) -> None:
        self.close()
        t = Table(self.path, lineno, header, ranks=dict(self.ranks), params=dict(self.params))
        t.versions = dict(self.versions)
        if self.starting is not None:
            c = collective(self.starting[0])
            if c is None:
                self.fail(
                    self.starting[1],
                    f"'Collective test starting: {self.starting[0]}' names no collective "
                    f"delaycomm knows ({OP_NAMES_HELP})",
                )
            t.named, t.named_by = c.name, f"'Collective test starting: {self.starting[0]}' on line {self.starting[1]}"
        elif len(self.names) == 1:
            ((name, (where, at)),) = self.names.items()
            t.named, t.named_by = name, f"the command line on line {at} ({where!r})"
        t.groups = self.groups(lineno, header)
        self.table = t
        self.tables.append(t)
        self.starting = None
        self.names = {}

    def groups(self, lineno: int, header: list[str]) -> list[tuple[str, dict[str, int]]]:
        """The placement groups of a header: (name, {column: index}), out-of-place first."""
        starts = [i for i, h in enumerate(header) if h == "time"]
        if not starts or starts[0] < 3 or any(h not in _LEADING for h in header[: starts[0]]):
            self.fail(lineno, f"a column header with an unexpected layout: {' '.join(header)}")
        names = self.placements if self.placements and len(self.placements) == len(starts) else None
        names = names or ["out-of-place", "in-place"][: len(starts)]
        if len(starts) > 2:
            self.fail(lineno, f"a column header with {len(starts)} time columns (expected out-of-place and in-place)")
        out = []
        for k, s in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else len(header)
            cols = {h: i for i, h in enumerate(header[s:end], start=s) if h != "timestamp"}
            out.append((names[k], cols))
        return out

    def parse_row(self, lineno: int, text: str, t: Table) -> Row:
        tokens = text.split()
        layout = _layout(t, len(tokens))
        if layout is None:
            self.fail(
                lineno,
                f"a table row with {len(tokens)} fields does not match the column header on line {t.line} "
                f"({t.header_text})",
            )
        index, groups = layout

        def integer(name: str) -> int:
            v = tokens[index[name]]
            if not _INT.fullmatch(v):
                self.fail(lineno, f"column {name!r} is {v!r} (expected a whole number)")
            return int(v)

        def number(i: int, name: str, required: bool) -> float | None:
            v = tokens[i]
            if v.upper() == "N/A" and not required:
                return None
            try:
                x = float(v)
            except ValueError:
                self.fail(lineno, f"column {name!r} is {v!r} (expected a number{'' if required else ' or N/A'})")
            if x != x or x < 0 or x == float("inf"):
                self.fail(lineno, f"column {name!r} is {v!r} (expected a finite number >= 0)")
            return x

        redop = None
        if "redop" in index:
            redop = "" if index["redop"] < 0 else tokens[index["redop"]]
        root = None
        if "root" in index:
            v = tokens[index["root"]]
            if not re.fullmatch(r"-?\d+", v):
                self.fail(lineno, f"column 'root' is {v!r} (expected a whole number)")
            root = int(v)
        timings = {}
        for name, cols in groups:
            if cols["time"] >= len(tokens):
                continue
            tm = number(cols["time"], f"{name} time", True)
            per_iter = {
                k: number(cols[k], f"{name} {k}", False) for k in ("i_min", "i_max", "i_p99", "i_cv") if k in cols
            }
            timings[name] = Timing(
                tm,
                number(cols["algbw"], f"{name} algbw", False),
                number(cols["busbw"], f"{name} busbw", False),
                tokens[cols["wrong"]] if "wrong" in cols else None,
                {k: v for k, v in per_iter.items() if v is not None} or None,
            )
        return Row(lineno, integer("size"), integer("count"), tokens[index["type"]], redop, root, timings)

    def close(self) -> None:
        if self.table is not None:
            self.closed = self.table
        self.table = None


def _layout(t: Table, nfields: int) -> tuple[dict[str, int], list[tuple[str, dict[str, int]]]] | None:
    """Which field holds which column, for a row of ``nfields`` fields under ``t``'s header: the header's layout,
    with or without its timestamp (two fields), without an empty op name (nccl-tests prints ``""`` as blanks), or
    without the out-of-place group (a run that times in-place only); None when none fits."""
    labels = [h for h in t.header if h != "timestamp"]
    index = {h: i for i, h in enumerate(labels) if h in _LEADING}
    stamp = 2 if "timestamp" in t.header else 0
    groups = t.groups
    for n in (len(labels) + stamp, len(labels)):
        if nfields == n:
            return index, groups
        if "redop" in index and nfields == n - 1:
            r = index["redop"]
            moved = {h: (i - 1 if i > r else i) for h, i in index.items() if h != "redop"}
            moved["redop"] = -1
            return moved, [(g, {h: i - 1 for h, i in cols.items()}) for g, cols in groups]
        if len(groups) == 2 and nfields == n - len(groups[0][1]):
            k = len(groups[0][1])
            return index, [(groups[1][0], {h: i - k for h, i in groups[1][1].items()})]
    return None


def parse(text: str, path: str) -> list[Table]:
    """The tables of a log's text, collectives as named (unresolved: see :func:`resolve`)."""
    p = _Parser(path)
    for lineno, raw in enumerate(text.splitlines(), start=1):
        p.feed(lineno, raw)
    p.close()
    return [t for t in p.tables if t.rows]


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


def resolve(t: Table, forced: Collective | None) -> None:
    """Sets the table's collective and world size, or raises :class:`NcclTestsError` naming what is missing."""
    ranks = len(t.ranks) if t.ranks else None
    if t.ranks and sorted(t.ranks) != list(range(len(t.ranks))):
        raise NcclTestsError(
            f"nccl-tests log {t.where}: the rank lines list ranks {sorted(t.ranks)} (expected 0..{len(t.ranks) - 1})"
        )
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
                raise NcclTestsError(f"nccl-tests log {t.path}:{r.line}: {name} time is {tm.time_us} (expected > 0)")
            if tm.algbw is None or tm.time_us <= 0:
                continue
            expect = [r.size / tm.time_us * 1e-3]
            if n:
                expect.append(expect[0] * (n - 1) / n)
            if not any(abs(tm.algbw - e) <= max(0.011, 0.05 * e) for e in expect):
                raise NcclTestsError(
                    f"nccl-tests log {t.path}:{r.line}: {name} algbw {tm.algbw} GB/s disagrees with size {r.size} B / "
                    f"time {tm.time_us} us = {expect[0]:.4g} GB/s (the columns were not read as nccl-tests prints them)"
                )
