"""The text of nccl-tests' stdout: its column headers, rows, rank lines and footers, and what to skip around them
(:mod:`.nccl_tests` has the whole story)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from delaycomm.sources.nccl_tables import NcclTestsError, Row, Table, Timing
from delaycomm.sources.ops import OP_NAMES_HELP, collective

__all__ = ["looks_like", "parse", "iter_parse", "MAX_WHOLE", "MAX_TIME_US"]


# A launcher's prefix on a line: Open MPI's --tag-output "[1,0]<stdout>:", srun -l's "0: ", a markdown quote "> ",
# kubectl logs --timestamps' "2024-05-01T12:00:00.123456789Z ", pdsh's "node-01: " and a "[node-01] " tag (a host
# name: no blank inside, so a shell prompt "[root@host dir]# " is not one).
_PREFIX = re.compile(
    r"^(?:\[\d+,\d+\]<\w+>:|\s*\d+:\s|\s*>\s?|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"
    r"|[A-Za-z][\w.\-]{0,63}:\s|\[[\w.\-]{1,64}\]\s)"
)
_RANK = re.compile(r"\bRank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+\d+")
_STARTING = re.compile(r"Collective test (starting|concluded):\s*(\S+)")
_PERF_NAME = re.compile(r"(?<![\w-])([a-z_2]+)_perf(?![\w-])")
_BARE_NAME = re.compile(r"(?<![\w-])(all_reduce|all_gather|reduce_scatter|alltoall|sendrecv)(?![\w-])")
_PARAMS = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_ITERS = re.compile(r"(warmup iters|agg iters|iters):\s*(\d+)")
_VERSION = re.compile(r"\b(nccl-tests|rccl-tests|NCCL|RCCL)\s+version\s*:?\s*(\S+)")
_INT = re.compile(r"\d+")
_ROOT = re.compile(r"-?\d{1,10}")
_PER_ITER = ("i_min", "i_max", "i_p99", "i_cv")
_INF = float("inf")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
MAX_WHOLE = (1 << 63) - 1  # size and count: nccl-tests prints size_t
MAX_TIME_US = 86400e6  # a day: a time beyond it is not a collective's (and beyond the profile's histogram)

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


class _Parser:
    """The line loop of :func:`parse`: the state between a run's preamble, its table and its footer."""

    def __init__(self, path: str):
        self.path = path
        self.tables: list[Table] = []
        self.table: Table | None = None  # the table whose rows are being read
        self.closed: Table | None = None  # the last table, closed by its footer
        self.names: dict[str, tuple[str, int]] = {}  # collective names seen since the last table
        self.starting: tuple[str, int] | None = None
        # The rank lines of the runs since the last table: one run, or several whose output interleaves (two
        # mpiruns on one stdout); a rank goes to the first run that does not list it yet.
        self.runs: list[dict[int, tuple[str, int]]] = [{}]
        self.run_params = 0  # the runs whose "nThread ..." line was seen since the last table
        self.twice: tuple[int, int, tuple[str, int], tuple[str, int]] | None = None  # (line, rank, first, second)
        self.params: dict[str, int] = {}
        self.versions: dict[str, str] = {}
        self.placements: list[str] | None = None
        self.ranks_cut = False
        self.run_start = 0  # the line of the current run's first line
        self.other_starts: list[tuple[str, int]] = []  # "Collective test starting" of runs interleaved with it

    def fail(self, lineno: int, why: str) -> None:
        raise NcclTestsError(f"nccl-tests log {self.path}:{lineno}: {why}")

    @property
    def ranks(self) -> dict[int, tuple[str, int]]:
        return self.runs[-1]

    def new_run(self) -> None:
        self.runs, self.params, self.placements, self.ranks_cut = [{}], {}, None, False
        self.run_params, self.twice, self.other_starts = 0, None, []

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
        if self.table is None and self.closed is not None and self.closed.footers < self.closed.runs:
            if self.row_like(text) and not line.lstrip().startswith("#"):
                self.table = self.closed  # interleaved runs: another run's rows after one run's footer
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
        """A row, or a line a row's numbers were written into wrong (``8192.0``, ``-8192``: refused, not skipped)."""
        tokens = text.split()
        return len(tokens) >= 5 and bool(_NUMBER.fullmatch(tokens[0])) and bool(_NUMBER.fullmatch(tokens[1]))

    def preamble(self, lineno: int, line: str, text: str) -> None:
        """A line that is not a header or a row: the run's description, a footer, or text to skip."""
        m = _STARTING.search(text)
        if m:
            self.close()
            if m.group(1) == "starting":
                if self.starting is not None:  # a second run starts before the first printed a table: interleaved
                    self.other_starts.append((m.group(2), lineno))
                    return
                self.new_run()
                self.names = {}
                self.starting = (m.group(2), lineno)
            return
        if text.startswith("Out of bounds values"):
            t = self.table or self.closed
            if t is not None:
                verdict = text.split(":", 1)[-1].strip()
                t.validation = verdict if t.validation in (None, verdict) else f"{t.validation}; {verdict}"
                if "FAILED" in verdict.upper():
                    t.failed_lines.append(lineno)
            return
        if text.startswith("Avg bus bandwidth"):
            if self.table is not None:
                self.table.footers += 1
            self.close()
            return
        if text == "..." or text == "…":
            if self.table is not None:
                self.table.elided = True
            elif self.ranks:  # nccl-tests cuts a process's device lines at 2048 characters with "..."
                self.ranks_cut = True
            return
        m = _PARAMS.search(text)
        if m:
            self.close()
            if self.tables and self.tables[-1].line > self.run_start:  # a table since the last run: a new run
                self.new_run()
            elif self.run_params:  # a second run before any table: runs whose output interleaves
                self.runs.append({})
            self.run_params += 1
            self.run_start = lineno
            self.params = {"nthreads": int(m.group(1)), "ngpus": int(m.group(2))}
            self.params.update({k.replace(" ", "_"): int(v) for k, v in _ITERS.findall(text)})
            return
        m = _RANK.search(text)
        if m:
            rank, pid, host = int(m.group(1)), int(m.group(2)), m.group(3)
            if self.tables and self.tables[-1].line > self.run_start:
                self.new_run()  # a run's rank lines with no "nThread" line before them
                self.run_start = lineno
            for run in self.runs:
                seen = run.get(rank)
                if seen is None or seen == (host, pid):
                    run[rank] = (host, pid)
                    break
            else:
                first = self.runs[0][rank]
                self.twice = self.twice or (lineno, rank, first, (host, pid))
                self.runs.append({rank: (host, pid)})
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
        last = self.table or self.closed
        if (
            last is not None
            and last.header == header
            and last.headers < last.runs
            and (not last.rows or self.table is None)
        ):
            last.headers += 1  # another interleaved run's header: its rows go to the same table
            self.table = last
            return
        self.close()
        runs = [r for r in self.runs if r]
        ranks = runs[0] if runs else {}
        if len(runs) > 1:
            ranks = self.interleaved(runs)
        t = Table(self.path, lineno, header, ranks=dict(ranks), params=dict(self.params), ranks_cut=self.ranks_cut)
        t.runs = max(1, len(runs), self.run_params, 1 + len(self.other_starts))
        if t.runs > 1:
            self.same_test(lineno)
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

    def same_test(self, lineno: int) -> None:
        """Runs whose output interleaves into one table must be of one test: rows do not say whose they are."""
        named = [(n, at) for n, at in ([self.starting] if self.starting else []) + self.other_starts]
        named += [(n, at) for n, (_, at) in self.names.items()]
        tests = {(c.name if (c := collective(n)) else n) for n, _ in named}
        if len(tests) > 1:
            shown = ", ".join(f"{n} (line {at})" for n, at in named)
            self.fail(
                lineno,
                f"the output of {len(tests)} different tests interleaves here ({shown}): their rows cannot be told "
                "apart; split the log by run (each mpirun's output to its own file)",
            )

    def interleaved(self, runs: list[dict[int, tuple[str, int]]]) -> dict[int, tuple[str, int]]:
        """The rank lines of one of several runs whose output interleaves: the run that lists ranks 0..n-1, where
        the others list some of them (a run's lines may still come after another's table began)."""
        if all(len(r) == 1 for r in runs) and self.twice is not None:
            line, rank, seen, (host, pid) = self.twice
            self.fail(
                line,
                f"rank {rank} is listed twice ({seen[0]} pid {seen[1]}, {host} pid {pid}): these processes each "
                "ran nccl-tests alone (nccl-tests built without MPI?): no collective of many ranks",
            )
        full = max(runs, key=len)
        if sorted(full) == list(range(len(full))) and all(r.keys() <= full.keys() for r in runs):
            return full
        if any(sorted(r) != sorted(runs[0]) for r in runs):
            shown = "; ".join(str(sorted(r)) for r in runs)
            where = self.twice[0] if self.twice else self.run_start
            self.fail(
                where,
                f"the rank lines are those of {len(runs)} runs whose output interleaves, but they list different "
                f"ranks ({shown}): give --source-ranks N (and --source-nodes M) or split the log by run",
            )
        return runs[0]

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
        layout = t.layouts.get(len(tokens), False)
        if layout is False:
            layout = t.layouts[len(tokens)] = _layout(t, len(tokens))
        if layout is None:
            self.fail(
                lineno,
                f"a table row with {len(tokens)} fields does not match the column header on line {t.line} "
                f"({t.header_text})",
            )
        index, groups = layout
        redop = None
        if "redop" in index:
            redop = "" if index["redop"] < 0 else tokens[index["redop"]]
        root = None
        if "root" in index:
            v = tokens[index["root"]]
            if not _ROOT.fullmatch(v):
                self.fail(lineno, f"column 'root' is {v[:24]!r} (expected a whole number, -1 for none)")
            root = int(v)
        timings = {}
        for name, cols in groups:
            if cols["time"] >= len(tokens):
                continue
            tm = self.number(lineno, tokens, cols, name, "time", True)
            per_iter = None
            if len(cols) > 4:
                per_iter = {k: self.number(lineno, tokens, cols, name, k, False) for k in _PER_ITER if k in cols}
                per_iter = {k: v for k, v in per_iter.items() if v is not None} or None
            timings[name] = Timing(
                tm,  # type: ignore[arg-type]  # required: never None
                self.number(lineno, tokens, cols, name, "algbw", False),
                self.number(lineno, tokens, cols, name, "busbw", False),
                tokens[cols["wrong"]] if "wrong" in cols else None,
                per_iter,
            )
        size, count = self.integer(lineno, tokens, index, "size"), self.integer(lineno, tokens, index, "count")
        return Row(lineno, size, count, tokens[index["type"]], redop, root, timings)

    def integer(self, lineno: int, tokens: list[str], index: dict[str, int], name: str) -> int:
        v = tokens[index[name]]
        if not _INT.fullmatch(v) or len(v) > 19 or int(v) > MAX_WHOLE:
            shown = v if len(v) <= 24 else f"{v[:20]}... ({len(v)} characters)"
            self.fail(lineno, f"column {name!r} is {shown!r} (expected a whole number from 0 to 2^63-1)")
        return int(v)

    def number(
        self, lineno: int, tokens: list[str], cols: dict[str, int], group: str, column: str, required: bool
    ) -> float | None:
        v = tokens[cols[column]]
        try:
            x = float(v)
        except ValueError:
            if not required and v.upper() == "N/A":
                return None
            self.fail(
                lineno, f"column '{group} {column}' is {v[:24]!r} (expected a number{'' if required else ' or N/A'})"
            )
        if not 0.0 <= x < _INF:  # NaN, negative, infinite
            self.fail(lineno, f"column '{group} {column}' is {v[:24]!r} (expected a finite number >= 0)")
        if x > MAX_TIME_US and (column == "time" or column.startswith("i_")):
            self.fail(lineno, f"column '{group} {column}' is {v[:24]!r} (expected at most {MAX_TIME_US:.4g} us, a day)")
        return x

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


def iter_parse(lines: Iterable[str], path: str) -> Iterator[Table]:
    """The tables of a log's lines, one by one as each is complete (its rows read, and no later line can add to
    it), collectives as named (unresolved: see :func:`resolve`)."""
    p = _Parser(path)
    done = 0  # the tables handed on
    for lineno, raw in enumerate(lines, start=1):
        p.feed(lineno, raw)
        # every table before the one being read (or the last closed one, which interleaved rows may still reach)
        last = len(p.tables) - 1
        while done < last:
            t = p.tables[done]
            p.tables[done] = None  # type: ignore[call-overload]  # handed on: not held here
            done += 1
            if t.rows:
                yield t
    p.close()
    for t in p.tables[done:]:
        if t is not None and t.rows:
            yield t


def parse(text: str, path: str) -> list[Table]:
    """The tables of a log's text, collectives as named (unresolved: see :func:`resolve`)."""
    return list(iter_parse(text.splitlines(), path))
