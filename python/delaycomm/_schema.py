"""The schemas of the files a latency profile is made of: the profile itself (docs/profile.md, version 1), and the
stats files ``python -m delaycomm profile`` builds it from. The one check of each, with messages that name the
file and the field (``profile file 'p.json' field ops.allreduce[1].count is 99 but zeros and buckets hold 100
(expected their sum); docs/profile.md has the schema``).

:func:`check_profile` turns an accepted profile into the native ``_C.DelayProfile`` the replay draws from; no
other code reads a profile's numbers.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import numpy as np

from delaycomm import _ops
from delaycomm._readers import FileError, quote, read_json

__all__ = [
    "VERSION",
    "FORMAT",
    "HISTOGRAM_BASE",
    "MAX_COUNT",
    "check_profile",
    "read_profile",
    "check_stats_group",
    "draw_class_bytes",
    "class_size_range",
    "class_size",
]

FORMAT = "delaycomm-profile"
VERSION = 1
HISTOGRAM_BASE = 1.02  # csrc/stats/Histogram.hpp, LogHistogram::kBase
BUCKETS = 1700  # LogHistogram::kBuckets: bucket indices are in [0, 1699]
MAX_COUNT = 2**53  # counts stay exact in JSON numbers (doubles)
MAX_BYTES = 2**62  # the largest size class's smallest size


class _Invalid(Exception):
    def __init__(self, field: str, why: str) -> None:
        super().__init__(field, why)
        self.field, self.why = field, why


def _type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shown(v: int | float) -> str:
    """A number as the native reader printed it (std::to_string of a double: '1.100000'), shortened."""
    try:
        text = f"{float(v):f}"
    except OverflowError:
        text = str(v)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"


_PLAIN = re.compile(r"[A-Za-z0-9_.\-]+")


def _key(name: str) -> str:
    """An object key inside a field name: as it is when plain, else quoted (a NUL, a quote, bytes not shown)."""
    return name if _PLAIN.fullmatch(name) else quote(name)


def _need(obj: dict, path: str, key: str, kind: type, expected: str) -> Any:
    field = f"{path}.{key}" if path else key
    if key not in obj:
        raise _Invalid(field, f"is missing (expected {expected})")
    v = obj[key]
    ok = _number(v) if kind is float else isinstance(v, kind)
    if not ok:
        raise _Invalid(field, f"is {_type(v)} (expected {expected})")
    return v


def _whole(v: Any, field: str, lo: float, hi: float, expected: str) -> int:
    if not _number(v) or (isinstance(v, float) and not v.is_integer()) or not lo <= v <= hi:
        raise _Invalid(field, f"is {_shown(v) if _number(v) else _type(v)} (expected {expected})")
    return int(v)


def draw_class_bytes(nbytes: int) -> int:
    """The size class (its smallest size) a call of ``nbytes`` draws from, as the sampler reads sizes
    (csrc/delay/Profile.cpp, drawClassOf): its class, except that a size within 0.1% under a power of two is that
    power's class (nccl-tests and frameworks round a count down to whole elements per rank)."""
    if nbytes <= 0:
        return 0
    up = 1 << int(nbytes - 1).bit_length()
    if up != nbytes and (up - nbytes) * 1000 <= up:
        nbytes = up
    return 1 << (int(nbytes).bit_length() - 1)


def class_size_range(class_bytes: int) -> tuple[int, int]:
    """The whole sizes ``[lo, hi]`` the sampler reads as the class of ``class_bytes`` (0 or a power of two)."""
    if class_bytes <= 0:
        return 0, 0
    lo = class_bytes if class_bytes < 1000 else -(-999 * class_bytes // 1000)  # ceil(0.999 * 2^(k-1))
    top = 2 * class_bytes
    hi = (top if top < 1000 else -(-999 * top // 1000)) - 1
    return lo, hi


def class_size(class_bytes: int, total: float, calls: int | float) -> int:
    """The ``size_bytes`` of a class whose calls' sizes sum to ``total``: their mean, a whole number of bytes the
    replay reads as this class (a mean within 0.1% under the next power of two is kept just below that: the replay
    reads such sizes as the next class, docs/profile.md)."""
    lo, hi = class_size_range(class_bytes)
    return min(max(round(total / calls), lo), hi)


def _size_bytes(e: dict, f: str, nbytes: int) -> int:
    """The optional size its latencies were measured at (-1: not given): a whole size the sampler reads as this
    class (0 for the class of 0 bytes)."""
    if "size_bytes" not in e:
        return -1
    lo, hi = class_size_range(nbytes)
    expected = (
        "0 (the class of 0 bytes)"
        if nbytes == 0
        else f"a whole number of bytes from {lo} to {hi}: a size the replay reads as the class of {nbytes} bytes"
    )
    size = _whole(e["size_bytes"], f"{f}.size_bytes", lo, hi, expected)
    if draw_class_bytes(size) != nbytes:  # the range is the class's (kept in step with draw_class_bytes)
        raise _Invalid(f"{f}.size_bytes", f"is {size} (expected {expected})")
    return size


def _nanoseconds(obj: dict, path: str, key: str) -> float:
    v = _need(obj, path, key, float, "a number of nanoseconds >= 0")
    if not v >= 0:
        raise _Invalid(f"{path}.{key}", f"is {_shown(v)} (expected a number of nanoseconds >= 0)")
    return float(v)


def _buckets(pairs: list) -> tuple[np.ndarray, np.ndarray] | None:
    """The fast path for well-formed buckets (a profile has up to 1700 per class, millions in all): every check at
    C speed, or None when any fails, and the slow path then finds and names the first bad one."""
    if set(map(type, pairs)) - {list} or set(map(len, pairs)) - {2}:
        return None
    flat = list(itertools.chain.from_iterable(pairs))
    if set(map(type, flat)) - {int}:  # not bool (a subclass of int), not float: the slow path says what it is
        return None
    try:
        a = np.array(flat, dtype=np.int64)
    except OverflowError:
        return None
    idx, counts = a[0::2], a[1::2]
    if len(pairs) and (
        idx[0] < 0 or idx[-1] >= BUCKETS or (np.diff(idx) <= 0).any() or counts.min() < 1 or counts.max() > MAX_COUNT
    ):
        return None
    return idx.astype(np.int32), counts.astype(np.uint64)


def _class(e: Any, f: str, seen: set[int]) -> tuple:
    """One size class: (bytes, count, zeros, min_ns, max_ns, bucket indices, bucket counts, size_bytes or -1);
    ``seen``: the size classes of the op so far."""
    if not isinstance(e, dict):
        raise _Invalid(f, f"is {_type(e)} (expected an object)")
    nbytes = _whole(
        _need(e, f, "bytes", float, "0 or a power of two"), f"{f}.bytes", 0, MAX_BYTES, "0 or a power of two"
    )
    if nbytes & (nbytes - 1):
        raise _Invalid(f"{f}.bytes", f"is {nbytes} (expected 0 or a power of two: a size class)")
    if nbytes.bit_length() in seen:  # the size class (csrc/stats/Histogram.hpp, sizeClassOf)
        raise _Invalid(f"{f}.bytes", "names a size class given already for this op")
    seen.add(nbytes.bit_length())
    count = _whole(
        _need(e, f, "count", float, "a whole number >= 1"), f"{f}.count", 1, MAX_COUNT, "a whole number >= 1"
    )
    zeros = _whole(e["zeros"], f"{f}.zeros", 0, MAX_COUNT, "a whole number >= 0") if "zeros" in e else 0
    lo, hi = _nanoseconds(e, f, "min_ns"), _nanoseconds(e, f, "max_ns")
    if not math.isfinite(hi):
        raise _Invalid(f"{f}.max_ns", f"is {_shown(hi)} (expected a number of nanoseconds >= 0)")
    if lo > hi:
        raise _Invalid(f"{f}.min_ns", "is larger than max_ns")
    pairs = _need(e, f, "buckets", list, "an array of [index, count] pairs")
    fast = _buckets(pairs)
    if fast is not None:
        idx, counts = fast
        total = zeros + int(counts.sum(dtype=np.uint64)) if len(pairs) else zeros
    else:
        idx_list, count_list, total, prev = [], [], zeros, -1
        for k, pair in enumerate(pairs):
            b = f"{f}.buckets[{k}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise _Invalid(b, "is not an [index, count] pair")
            i = _whole(pair[0], f"{b}[0]", 0, BUCKETS - 1, "a bucket index from 0 to 1699")
            if i <= prev:
                raise _Invalid(f"{b}[0]", "is not larger than the index before it (expected increasing bucket indices)")
            prev = i
            c = _whole(pair[1], f"{b}[1]", 1, MAX_COUNT, "a whole count >= 1")
            total += c
            idx_list.append(i)
            count_list.append(c)
        idx, counts = np.array(idx_list, dtype=np.int32), np.array(count_list, dtype=np.uint64)
    if total != count:
        raise _Invalid(f"{f}.count", f"is {count} but zeros and buckets hold {total} (expected their sum)")
    return nbytes, count, zeros, lo, hi, idx, counts, _size_bytes(e, f, nbytes)


def _profile_classes(doc: Any) -> list[tuple]:
    if not isinstance(doc, dict):
        raise _Invalid("(top level)", f"is {_type(doc)} (expected an object)")
    fmt = _need(doc, "", "format", str, '"delaycomm-profile"')
    if fmt != FORMAT:
        raise _Invalid("format", f'is {quote(fmt)} (expected "delaycomm-profile")')
    version = _whole(_need(doc, "", "version", float, "1"), "version", 0, 1e9, "a whole number")
    if version != VERSION:
        raise _Invalid("version", f"is {version} (this delaycomm reads version {VERSION})")
    hist = _need(doc, "", "histogram", dict, "an object with base and unit")
    base = _need(hist, "histogram", "base", float, "1.02")
    if base != HISTOGRAM_BASE:
        raise _Invalid("histogram.base", f"is {_shown(base)} (expected 1.02)")
    unit = _need(hist, "histogram", "unit", str, '"ns"')
    if unit != "ns":
        raise _Invalid("histogram.unit", f'is {quote(unit)} (expected "ns")')
    _need(doc, "", "metadata", dict, "an object")
    ops = _need(doc, "", "ops", dict, "an object of op name: [size class, ...]")
    by_kind = []
    for name, entries in ops.items():
        if name not in _ops.BY_NAME:
            raise _Invalid(
                f"ops.{_key(name)}", "is not an op delaycomm knows (expected a name such as allreduce, broadcast)"
            )
        if not isinstance(entries, list) or not entries:
            empty = " that is empty" if isinstance(entries, list) else ""
            raise _Invalid(f"ops.{name}", f"is {_type(entries)}{empty} (expected an array of size classes)")
        by_kind.append((_ops.BY_NAME[name].kind, name, entries))
    if not by_kind:
        raise _Invalid("ops", "is empty (expected at least one op)")
    out = []
    for kind, name, entries in sorted(by_kind, key=lambda t: int(t[0])):  # errors in op-table order, as ever
        seen: set[int] = set()
        for k, e in enumerate(entries):
            out.append((kind, *_class(e, f"ops.{name}[{k}]", seen)))
    return out


def check_profile(doc: Any, name: str):
    """The one check of a profile document (docs/profile.md, version 1), and its numbers for the replay.

    Args:
        doc: the document (as ``json`` reads it, or as :func:`delaycomm.profile.build` or a profile source makes
            it).
        name: how messages name it (``"profile file 'p.json'"``).

    Returns:
        The native ``delaycomm._C.DelayProfile`` of its numbers (quantiles, per-class calls, digest).

    Raises:
        FileError: ``NAME field FIELD WHY; docs/profile.md has the schema``.
    """
    from delaycomm import _C

    try:
        classes = _profile_classes(doc)
    except _Invalid as e:
        raise FileError(f"{name} field {e.field} {e.why}; docs/profile.md has the schema") from None
    return _C.DelayProfile(classes)


PROFILE_EXPECTED = "a profile written by python -m delaycomm profile; docs/profile.md"


def read_profile(path: str) -> tuple[dict[str, Any], Any]:
    """The profile file at ``path``, read once and checked: ``(document, native DelayProfile)``.

    Raises:
        FileError: ``profile file 'PATH' ...``: unreadable, not JSON, or not a profile (naming the field).
    """
    name = f"profile file {quote(path)}"
    doc = read_json(path, name, PROFILE_EXPECTED)
    return doc, check_profile(doc, name)


# ---------------------------------------------------------------------------------------------------------------
# Stats files (the input of `python -m delaycomm profile`): only the fields a profile is built from are checked.


def _stats_histogram(h: Any, f: str) -> dict[str, Any]:
    if not isinstance(h, dict):
        raise _Invalid(f, f"is {_type(h)} (expected an object)")
    if h.get("base") != HISTOGRAM_BASE or h.get("unit") != "ns":
        raise _Invalid(
            f, f"has base {h.get('base')!r:.40} and unit {h.get('unit')!r:.40} (expected {HISTOGRAM_BASE} and 'ns')"
        )
    count = _whole(
        _need(h, f, "count", float, "a whole number >= 0"), f"{f}.count", 0, MAX_COUNT, "a whole number >= 0"
    )
    zeros = _whole(
        _need(h, f, "zeros", float, "a whole number >= 0"), f"{f}.zeros", 0, MAX_COUNT, "a whole number >= 0"
    )
    out = {"count": count, "zeros": zeros, "sum_ns": _nanoseconds(h, f, "sum_ns")}
    if not math.isfinite(out["sum_ns"]):
        raise _Invalid(f"{f}.sum_ns", "is not finite (expected a number of nanoseconds >= 0)")
    out["min_ns"], out["max_ns"] = _nanoseconds(h, f, "min_ns"), _nanoseconds(h, f, "max_ns")
    if count and not (out["min_ns"] <= out["max_ns"] and math.isfinite(out["max_ns"])):
        raise _Invalid(f"{f}.min_ns", "is larger than max_ns, or max_ns is not finite")
    pairs = _need(h, f, "buckets", list, "an array of [index, count] pairs")
    total = zeros
    for k, pair in enumerate(pairs):
        b = f"{f}.buckets[{k}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise _Invalid(b, "is not an [index, count] pair")
        _whole(pair[0], f"{b}[0]", 0, BUCKETS - 1, "a bucket index from 0 to 1699")
        total += _whole(pair[1], f"{b}[1]", 1, MAX_COUNT, "a whole count >= 1")
    if total != count:
        raise _Invalid(f"{f}.count", f"is {count} but zeros and buckets hold {total} (expected their sum)")
    out["buckets"] = pairs
    return out


def _stats_match(m: Any, f: str) -> dict[str, int]:
    """delay_mode=match's counters of a size class (docs/delay.md, "Match mode"); absent (older files, add mode):
    zeros."""
    if m is None:
        return {"nothing_added": 0, "uncalibrated": 0}
    if not isinstance(m, dict):
        raise _Invalid(f, f"is {_type(m)} (expected an object)")
    return {
        k: _whole(m.get(k, 0), f"{f}.{k}", 0, MAX_COUNT, "a whole number >= 0")
        for k in ("nothing_added", "uncalibrated")
    }


def _stats_sizes(m: Any, f: str, nbytes: int) -> tuple[int, float] | None:
    """The calls a size class of ``nbytes`` issued and the sum of their bytes (``sizes``; absent in older files:
    None); their mean must lie in the class (a double's rounding aside)."""
    if m is None:
        return None
    if not isinstance(m, dict):
        raise _Invalid(f, f"is {_type(m)} (expected an object)")
    calls = _whole(_need(m, f, "calls", float, "a whole number >= 0"), f"{f}.calls", 0, MAX_COUNT,
                   "a whole number >= 0")  # fmt: skip
    total = _need(m, f, "sum_bytes", float, "a number of bytes >= 0")
    if not (math.isfinite(total) and total >= 0):
        raise _Invalid(f"{f}.sum_bytes", f"is {_shown(total)} (expected a number of bytes >= 0)")
    lo, hi = (0, 0) if nbytes == 0 else (nbytes, 2 * nbytes)
    if calls and not lo * calls * (1 - 1e-9) <= total <= hi * calls * (1 + 1e-9):
        raise _Invalid(
            f"{f}.sum_bytes",
            f"is {_shown(total)} for {calls} call(s) (expected their sizes' sum: {calls} call(s) of the class of "
            f"{nbytes} bytes sum to {lo * calls} up to {hi * calls})",
        )
    return calls, float(total)


def _stats_ops(g: dict, f: str) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    ops = _need(g, f, "ops", dict, "an object of op name: its counters")
    out = {}
    for op, d in ops.items():
        of = f"{f}.ops.{_key(op)}"
        if op not in _ops.BY_NAME:
            raise _Invalid(of, "is not an op delaycomm counts (expected the stats of a delaycomm group)")
        if not isinstance(d, dict):
            raise _Invalid(of, f"is {_type(d)} (expected an object)")
        if "by_size" not in d:
            if d.get("calls"):
                raise _Invalid(of, "has no by_size histograms (written by an older delaycomm; record the job again)")
            continue
        classes = []
        for k, entry in enumerate(_need(d, of, "by_size", list, "an array of size classes")):
            ef = f"{of}.by_size[{k}]"
            if not isinstance(entry, dict):
                raise _Invalid(ef, f"is {_type(entry)} (expected an object)")
            nbytes = _whole(_need(entry, ef, "bytes", float, "0 or a power of two"), f"{ef}.bytes", 0, MAX_BYTES,
                            "0 or a power of two")  # fmt: skip
            if nbytes & (nbytes - 1):
                raise _Invalid(f"{ef}.bytes", f"is {nbytes} (expected 0 or a power of two: a size class)")
            h = _stats_histogram(_need(entry, ef, "histogram", dict, "an object"), f"{ef}.histogram")
            h["match"] = _stats_match(entry.get("match"), f"{ef}.match")
            h["sizes"] = _stats_sizes(entry.get("sizes"), f"{ef}.sizes", nbytes)
            classes.append((nbytes, h))
        out[op] = classes
    return out


def check_stats_group(g: Any, name: str, field: str) -> dict[str, Any]:
    """One group of a stats file, checked for what a profile is built from.

    Args:
        g: the group's dict (a stats file, or one group of a ``delaycomm.stats()`` dump).
        name: how messages name the file (``"stats file 'a.json'"``).
        field: where the group is in the file (``""``, or ``"groups.0"``).

    Returns:
        ``{"world_size", "group", "rank", "backends", "versions", "host", "machine", "ops"}``, where ``ops`` maps
        each op to its ``(bytes, histogram)`` size classes.

    Raises:
        FileError: ``NAME field FIELD WHY``.
    """
    try:
        if not isinstance(g, dict):
            raise _Invalid(field or "(top level)", f"is {_type(g)} (expected an object)")
        p = f"{field}" if field else ""
        world = _whole(_need(g, p, "world_size", float, "a whole number >= 1"), f"{p}.world_size".lstrip("."), 1,
                       2**31, "a whole number >= 1")  # fmt: skip
        rank = g.get("rank")
        if rank is not None:
            rank = _whole(rank, f"{p}.rank".lstrip("."), 0, 2**31, "a whole number >= 0")
        group = g.get("group", "")
        if not isinstance(group, (str, int)) or isinstance(group, bool):
            raise _Invalid(f"{p}.group".lstrip("."), f"is {_type(group)} (expected a string)")
        backends = g.get("backends", [])
        if not isinstance(backends, list) or not all(isinstance(b, str) for b in backends):
            raise _Invalid(f"{p}.backends".lstrip("."), "is not an array of strings (expected backend names)")
        host = g.get("host")
        if host is not None and not isinstance(host, str):
            raise _Invalid(f"{p}.host".lstrip("."), f"is {_type(host)} (expected a string)")
        machine = g.get("machine")
        if machine is not None and not isinstance(machine, dict):
            raise _Invalid(f"{p}.machine".lstrip("."), f"is {_type(machine)} (expected an object)")
        ops = _stats_ops(g, p)
    except _Invalid as e:
        raise FileError(f"{name} field {e.field.lstrip('.')} {e.why}") from None
    return {
        "world_size": world,
        "group": str(group),
        "rank": rank,
        "backends": backends,
        "versions": g.get("versions"),
        "host": host,
        "machine": machine,
        "ops": ops,
    }
