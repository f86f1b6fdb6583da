"""The JSON that nccl-tests writes with ``-J FILE`` (its src/util.cu, JSON format version 3): the same table as its
stdout, as records (``results``: ``size``, ``count``, ``type``, ``redop``, ``root``, ``out_of_place`` and
``in_place`` with ``time``/``cpu_time``, ``alg_bw``, ``bus_bw``, ``nwrong``, and ``*_per_iter`` statistics), the
devices (``rank``, ``hostname``) and the command line (``args``, whose first word names the collective).

The records are found wherever the document nests them, so that later versions that move them still read."""

from __future__ import annotations

import os
import re

from delaycomm.sources.nccl_tables import NcclTestsError, Row, Table, Timing
from delaycomm.sources.ops import collective

__all__ = ["looks_like_json", "tables_from_json"]

_HEADER = ["size", "count", "type", "redop", "root"] + ["time", "algbw", "busbw", "wrong"] * 2
_PLACES = (("out_of_place", "out-of-place"), ("in_place", "in-place"))


def _walk(doc, key: str):
    """Every value of ``key`` in the document, outermost first."""
    todo = [doc]
    while todo:
        d = todo.pop(0)
        if isinstance(d, dict):
            if key in d:
                yield d[key]
            todo.extend(d.values())
        elif isinstance(d, list):
            todo.extend(x for x in d if isinstance(x, (dict, list)))


def _result_lists(doc) -> list[list[dict]]:
    return [
        v
        for v in _walk(doc, "results")
        if isinstance(v, list) and v and all(isinstance(r, dict) and "size" in r for r in v)
    ]


def looks_like_json(doc: object) -> bool:
    """Whether a JSON document is nccl-tests' ``-J`` output (a results list of sized records)."""
    return isinstance(doc, dict) and any(any(p in r for p, _ in _PLACES) for lst in _result_lists(doc) for r in lst)


def tables_from_json(doc: object, path: str) -> list[Table]:
    """The tables (one per results list) of an nccl-tests JSON document, unresolved (``resolve`` names them).

    Raises:
        NcclTestsError: a record that does not have nccl-tests' fields (naming the file and the record).
    """
    if not looks_like_json(doc):
        raise NcclTestsError(f"nccl-tests JSON {path!r} has no results list of nccl-tests records")
    ranks = {}
    for devices in _walk(doc, "devices"):
        for d in devices if isinstance(devices, list) else []:
            if isinstance(d, dict) and isinstance(d.get("rank"), int):
                ranks[d["rank"]] = (str(d.get("hostname", "?")), int(d.get("pid", 0) or 0))
    named = None
    args = doc.get("args") if isinstance(doc, dict) else None
    if isinstance(args, list) and args and isinstance(args[0], str):
        m = re.fullmatch(r"(\w+)_perf(?:_mpi)?", os.path.basename(args[0]))
        c = collective(m.group(1)) if m else None
        named = (c.name, f"the command in its args ({args[0]!r})") if c else None
    iters = next((v for v in _walk(doc, "iterations") if isinstance(v, int)), None)
    tables = []
    for lst in _result_lists(doc):
        t = Table(path, 0, list(_HEADER), header_text="nccl-tests JSON results", ranks=dict(ranks), from_json=True)
        t.params = {"iters": iters} if iters is not None else {}
        if isinstance(doc.get("nccl_version"), int):
            t.versions = {"NCCL": str(doc["nccl_version"])}
        if named:
            t.named, t.named_by = named
        t.rows = [_row(r, i, path) for i, r in enumerate(lst)]
        tables.append(t)
    return tables


def _row(r: dict, i: int, path: str) -> Row:
    def fail(why: str):
        raise NcclTestsError(f"nccl-tests JSON {path}: results[{i}]: {why}")

    def whole(key: str) -> int:
        v = r.get(key)
        v = int(v.strip()) if isinstance(v, str) and re.fullmatch(r"\s*-?\d+\s*", v) else v
        if not isinstance(v, int) or isinstance(v, bool):
            fail(f"field {key!r} is {v!r} (expected a whole number)")
        return v

    def number(d: dict, key: str, where: str, required: bool) -> float | None:
        v = d.get(key)
        if v is None and not required:
            return None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v or v < 0:
            fail(f"field {where}.{key} is {v!r} (expected a number >= 0)")
        return float(v)

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
            per_iter = {n: float(per[k]) for k, n in names.items() if isinstance(per.get(k), (int, float))} or None
        timings[place] = Timing(
            number(d, tkey, key, True),
            number(d, "alg_bw", key, False),
            number(d, "bus_bw", key, False),
            None if d.get("nwrong") is None else str(d.get("nwrong")),
            per_iter,
        )
    if not timings:
        fail("has neither out_of_place nor in_place timings")
    return Row(i, whole("size"), whole("count"), str(r.get("type", "?")), str(r.get("redop", "")).strip(),
               whole("root"), timings)  # fmt: skip
