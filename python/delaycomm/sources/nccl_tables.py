"""The tables nccl-tests prints, as the readers hand them on (:mod:`.nccl_tests` reads text and JSON logs)."""

from __future__ import annotations

from dataclasses import dataclass, field

from delaycomm.sources.ops import Collective

__all__ = ["NcclTestsError", "Timing", "Row", "Table"]


class NcclTestsError(ValueError):
    """An nccl-tests log that cannot be read (the message names the file, the line and what is wrong)."""


@dataclass(slots=True)  # one per row: a 200,000-record -J table holds them all until resolved
class Timing:
    """One placement's columns of a row: its mean time (us), bandwidths (GB/s), wrong count, per-iteration stats."""

    time_us: float
    algbw: float | None
    busbw: float | None
    wrong: str | None
    per_iter: dict[str, float] | None = None


@dataclass(slots=True)  # one per row: a 200,000-record -J table holds them all until resolved
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
    ranks_cut: bool = False  # nccl-tests cut the device lines short ("..."): they do not list every rank
    params: dict[str, int] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    groups: list[tuple[str, dict[str, int]]] = field(default_factory=list)  # placement -> {column: field}
    elided: bool = False
    validation: str | None = None  # the footer's "Out of bounds values" verdict
    from_json: bool = False  # read from nccl-tests' -J JSON (Row.line is the index in its results)
    runs: int = 1  # the runs whose output interleaves into this table (two mpiruns on one stdout)
    headers: int = 1  # the column headers of those runs read into it
    footers: int = 0  # their "Avg bus bandwidth" footers
    failed_lines: list[int] = field(default_factory=list)  # the "Out of bounds values : N FAILED" lines
    ranks_listed: list[int] | None = None  # rank lines that did not list every rank: the ranks they listed
    row_count: int = 0  # the rows read (kept when the rows themselves are dropped after use)
    nodes_given: int | None = None  # --source-nodes
    layouts: dict = field(default_factory=dict, repr=False)  # the reader's layout per row width (nccl_text)
    # Resolved by resolve():
    collective: Collective | None = None
    collective_by: str | None = None
    world_size: int | None = None
    world_size_by: str | None = None

    @property
    def hosts(self) -> list[str]:
        return sorted({h for h, _ in self.ranks.values()})

    @property
    def nodes(self) -> int | None:
        """The nodes the run spanned, when its rank lines list every rank (else as --source-nodes gives them)."""
        if self.ranks and not self.ranks_cut and self.ranks_listed is None:
            return len(self.hosts)
        return self.nodes_given

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}" if not self.from_json else f"{self.path} (nccl-tests JSON)"

    def at(self, row: Row) -> str:
        """Where a row is, for messages: ``FILE:LINE`` of a log, ``FILE: results[i]`` of a JSON file."""
        return f"{self.path}: results[{row.line}]" if self.from_json else f"{self.path}:{row.line}"
