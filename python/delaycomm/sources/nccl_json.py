"""The JSON that nccl-tests writes with ``-J FILE`` (its src/util.cu, JSON format version 3): the same table as its
stdout, as records (``results``: ``size``, ``count``, ``type``, ``redop``, ``root``, ``out_of_place`` and
``in_place`` with ``time``/``cpu_time``, ``alg_bw``, ``bus_bw``, ``nwrong``, and ``*_per_iter`` statistics), the
devices (``rank``, ``hostname``) and the command line (``args``, whose first word names the collective).

The records are found wherever the document nests them, so that later versions that move them still read."""

from __future__ import annotations

import os
import re
import sys
from collections import deque

from delaycomm.sources.nccl_tables import NcclTestsError, Row, Table, Timing
from delaycomm.sources.nccl_text import MAX_TIME_US, MAX_WHOLE
from delaycomm.sources.ops import collective

__all__ = ["looks_like_json", "tables_from_json"]

_HEADER = ["size", "count", "type", "redop", "root"] + ["time", "algbw", "busbw", "wrong"] * 2
_PLACES = (("out_of_place", "out-of-place"), ("in_place", "in-place"))


_KEYS = ("results", "devices", "iterations")


def _find(doc) -> dict[str, list]:
    """The values of :data:`_KEYS` wherever the document nests them, outermost first, in one breadth-first walk
    (a deque: linear in the document's size)."""
    found: dict[str, list] = {k: [] for k in _KEYS}
    todo = deque([doc])
    while todo:
        d = todo.popleft()
        if isinstance(d, dict):
            for k in _KEYS:
                if k in d:
                    found[k].append(d[k])
            todo.extend(v for v in d.values() if isinstance(v, (dict, list)))
        elif isinstance(d, list):
            todo.extend(x for x in d if isinstance(x, (dict, list)))
    return found


def _result_lists(found: dict[str, list]) -> list[list[dict]]:
    return [
        v for v in found["results"] if isinstance(v, list) and v and all(isinstance(r, dict) and "size" in r for r in v)
    ]


def _is_results(lists: list[list[dict]]) -> bool:
    return any(any(p in r for p, _ in _PLACES) for lst in lists for r in lst)


def looks_like_json(doc: object) -> bool:
    """Whether a JSON document is nccl-tests' ``-J`` output (a results list of sized records)."""
    return isinstance(doc, dict) and _is_results(_result_lists(_find(doc)))


def _devices(found: dict[str, list], path: str) -> dict[int, tuple[str, int]]:
    ranks: dict[int, tuple[str, int]] = {}
    for devices in found["devices"]:
        for i, d in enumerate(devices if isinstance(devices, list) else []):
            if not isinstance(d, dict) or "rank" not in d:
                continue
            rank, pid = d.get("rank"), d.get("pid", 0)
            if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < 1 << 24:
                raise NcclTestsError(
                    f"nccl-tests JSON {path}: devices[{i}].rank is {_shown(rank)} (expected a whole number 0..2^24)"
                )
            if pid is None:
                pid = 0
            if not isinstance(pid, int) or isinstance(pid, bool) or not 0 <= pid < 1 << 63:
                raise NcclTestsError(
                    f"nccl-tests JSON {path}: devices[{i}].pid is {_shown(pid)} (expected a process id, a whole number)"
                )
            ranks[rank] = (str(d.get("hostname", "?"))[:256], pid)
    return ranks


def _shown(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 40 else f"{r[:36]}..."


def tables_from_json(doc: object, path: str) -> list[Table]:
    """The tables (one per results list) of an nccl-tests JSON document, unresolved (``resolve`` names them).

    Raises:
        NcclTestsError: a record that does not have nccl-tests' fields (naming the file and the record).
    """
    found = _find(doc) if isinstance(doc, dict) else {k: [] for k in _KEYS}
    lists = _result_lists(found)
    if not isinstance(doc, dict) or not _is_results(lists):
        raise NcclTestsError(f"nccl-tests JSON {path!r} has no results list of nccl-tests records")
    ranks = _devices(found, path)  # its errors before the records'
    return _tables(doc, found, ranks, [[_row(r, i, path) for i, r in enumerate(lst)] for lst in lists], path)


def _tables(
    top: dict, found: dict[str, list], ranks: dict[int, tuple[str, int]], rows: list[list[Row]], path: str
) -> list[Table]:
    """One table per results list (``rows``, in order), with what the rest of the document says (``top``: its
    top-level ``args`` and ``nccl_version``; ``found``: the values of :data:`_KEYS`, outermost first; ``ranks``:
    its devices)."""
    named = None
    args = top.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str):
        m = re.fullmatch(r"(\w+)_perf(?:_mpi)?", os.path.basename(args[0]))
        c = collective(m.group(1)) if m else None
        named = (c.name, f"the command in its args ({args[0][:80]!r})") if c else None
    iters = next((v for v in found["iterations"] if isinstance(v, int) and not isinstance(v, bool)), None)
    tables = []
    for lst_rows in rows:
        t = Table(path, 0, list(_HEADER), header_text="nccl-tests JSON results", ranks=dict(ranks), from_json=True)
        t.params = {"iters": iters} if iters is not None else {}
        if isinstance(top.get("nccl_version"), int):
            t.versions = {"NCCL": str(top["nccl_version"])}
        if named:
            t.named, t.named_by = named
        t.rows = lst_rows
        tables.append(t)
    return tables


def _row(r: dict, i: int, path: str) -> Row:
    def fail(why: str):
        raise NcclTestsError(f"nccl-tests JSON {path}: results[{i}]: {why}")

    def whole(key: str, low: int = 0) -> int:
        v = r.get(key)
        v = int(v.strip()) if isinstance(v, str) and re.fullmatch(r"\s*-?\d{1,19}\s*", v) else v
        if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= MAX_WHOLE:
            fail(f"field {key!r} is {_shown(v)} (expected a whole number from {low} to 2^63-1)")
        return v

    def number(d: dict, key: str, where: str, required: bool, most: float = float("inf")) -> float | None:
        v = d.get(key)
        if v is None and not required:
            return None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        x = float(v) if ok and abs(v) < 1e308 else float("inf")
        if not ok or x != x or x < 0 or x == float("inf") or x > most:
            bound = f"at most {most:.4g}" if most != float("inf") else "finite"
            fail(f"field {where}.{key} is {_shown(v)} (expected a number >= 0, {bound})")
        return x

    timings = {}
    for key, place in _PLACES:
        d = r.get(key)
        if not isinstance(d, dict):
            continue
        tkey = "time" if "time" in d else "cpu_time"
        per = r.get(f"{key}_per_iter")
        per_iter = None
        if isinstance(per, dict):
            names = {"min_us": "i_min", "max_us": "i_max", "p99_us": "i_p99", "cv_pct": "i_cv"}
            per_iter = {n: number(per, k, f"{key}_per_iter", True, MAX_TIME_US if n != "i_cv" else float("inf"))
                        for k, n in names.items() if isinstance(per.get(k), (int, float))} or None  # fmt: skip
        timings[place] = Timing(
            number(d, tkey, key, True, MAX_TIME_US),
            number(d, "alg_bw", key, False),
            number(d, "bus_bw", key, False),
            None if d.get("nwrong") is None else str(d.get("nwrong"))[:40],
            per_iter,
        )
    if not timings:
        fail("has neither out_of_place nor in_place timings")
    # the type and redop strings interned: a table of 200,000 records holds one of each, not one per record
    return Row(i, whole("size"), whole("count"), sys.intern(str(r.get("type", "?"))[:40]),
               sys.intern(str(r.get("redop", "")).strip()[:40]), whole("root", -1), timings)  # fmt: skip
