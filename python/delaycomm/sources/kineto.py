"""A reader of PyTorch profiler (Kineto) traces: the communication calls of one rank, with their sizes.

A trace is the JSON ``torch.profiler`` and HTA write (``.json`` or ``.json.gz``, one file per rank): an object with
``traceEvents`` (or, in old traces, the bare event list), and ``distributedInfo`` (``rank``, ``world_size``,
``backend``). Two kinds of events are calls:

- **NCCL kernels** (``ncclKernel_*``, ``ncclDevKernel_*``, on the GPU): their duration is the kernel's time on the
  stream. The call's collective and size come from the kernel's args (``Collective name``, ``In msg nelems``,
  ``dtype``, ``Group size``: torch >= 2.1 copies them there), else from the CPU op that launched it: the
  ``record_param_comms`` op with the kernel's ``External id``, or, in older traces, the ``nccl:*`` annotation
  around the launch (the ``cuda_runtime`` event of the kernel's ``correlation``), whose ``Input Dims`` and
  ``Input type`` give the size.
- **Gloo calls** (``gloo:*`` CPU events): their duration is the event's (ProcessGroupGloo records it from the
  start of the work on its worker thread to its end), their size the ``Input Dims`` and ``Input type``.

A call whose size cannot be found is kept, counted, and reported (``Call.nbytes`` None); a call whose op cannot be
told (a ``SendRecv`` kernel with no CPU op: a send, a recv or an all_to_all) is counted apart.
"""

from __future__ import annotations

import bisect
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field

from delaycomm.sources.files import read_bytes
from delaycomm.sources.ops import element_size, op_of_trace_name

__all__ = ["KinetoError", "Call", "Trace", "looks_like", "read_trace"]


class KinetoError(ValueError):
    """A trace that cannot be read (the message names the file and what is wrong)."""


@dataclass
class Call:
    op: str  # the delaycomm op
    nbytes: int | None  # the bytes the rank passes in; None: not found
    dur_ns: float
    group_size: int | None  # the call's process group size, when the trace says
    source: str  # "kernel args", "record_param_comms", "annotation", "gloo event", "kernel name"
    why_unsized: str | None = None


@dataclass
class Trace:
    path: str
    rank: int | None
    world_size: int | None
    backend: str | None
    calls: list[Call] = field(default_factory=list)
    unattributed: dict[str, int] = field(default_factory=dict)  # kernel name -> count, op unknown
    nccl_version: str | None = None


def looks_like(doc: object) -> bool:
    """Whether a JSON document is a Kineto trace (``traceEvents``, or a list of events with ``ph``)."""
    if isinstance(doc, dict):
        return isinstance(doc.get("traceEvents"), list)
    return isinstance(doc, list) and bool(doc) and isinstance(doc[0], dict) and "ph" in doc[0]


def load_json(path: str) -> object:
    """The JSON document at ``path`` (gzip when it starts with gzip's magic)."""
    data = read_bytes(path, "trace", KinetoError)
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise KinetoError(f"trace {path!r} is not JSON ({e})") from None
    except RecursionError:
        raise KinetoError(f"trace {path!r} nests its values too deep (not a profiler trace)") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise KinetoError(f"trace {path!r} is not JSON that delaycomm reads ({e})") from None


MAX_DUR_US = 86400e6  # a day: a longer event is not a call (and beyond the profile's histogram)
MAX_WORLD = 1 << 24


def _where(path: str, i: int, e: dict) -> str:
    return f"trace {path}: traceEvents[{i}] ({str(e.get('name'))[:60]!r})"


def _check_event(path: str, i: int, e: dict) -> None:
    """A call's event with a duration that is a time, or a KinetoError naming the event and the field."""
    for key in ("ts", "dur"):
        v = e.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v or abs(v) == math.inf:
            raise KinetoError(f"{_where(path, i, e)}: {key} is {_shown(v)} (expected a finite number of us)")
    if not 0 <= e["dur"] <= MAX_DUR_US:
        raise KinetoError(f"{_where(path, i, e)}: dur is {_shown(e['dur'])} (expected 0 to {MAX_DUR_US:.4g} us, a day)")


def _shown(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 40 else f"{r[:36]}..."


def _info_int(path: str, info: dict, key: str, low: int, high: int) -> int | None:
    v = info.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        raise KinetoError(
            f"trace {path}: distributedInfo.{key} is {_shown(v)} (expected a whole number from {low} to {high})"
        )
    return v


def _args(e: dict) -> dict:
    a = e.get("args")
    return a if isinstance(a, dict) else {}


def _get(a: dict, *names: str):
    for n in names:
        if n in a:
            return a[n]
    return None


class _BadValue(ValueError):
    """A field of an event that no profiler writes (its message says which and what is accepted)."""


def _tensor_bytes(dims, types) -> int | None:
    """Bytes of the tensors an op's ``Input Dims`` / ``Input type`` describe (TensorLists nest one level); None when
    a type is not a tensor's or unknown.

    Raises:
        _BadValue: a dimension that is negative or not a whole number, or a tensor beyond 2^63 bytes."""
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types) or not dims:
        return None
    total = 0
    for d, t in zip(dims, types):
        if not isinstance(t, str) or not isinstance(d, list):
            return None
        e = element_size(t)
        if e is None:
            return None
        for x in d:
            if not isinstance(x, int) or isinstance(x, bool) or x < 0:
                raise _BadValue(f"args.Input Dims is {_shown(dims)} (expected sizes that are whole numbers >= 0)")
        total += e * math.prod(d)
        if total > (1 << 63) - 1:
            raise _BadValue(f"args.Input Dims is {_shown(dims)}: more than 2^63 bytes (expected a tensor's sizes)")
    return total


def _nelems_bytes(a: dict) -> int | None:
    n = _get(a, "In msg nelems", "in_msg_nelems")
    dt = _get(a, "dtype", "Dtype")
    if isinstance(n, bool) or (isinstance(n, (int, float)) and not (isinstance(n, int) and 0 <= n < 1 << 60)):
        raise _BadValue(f"args.In msg nelems is {_shown(n)} (expected a whole number of elements >= 0)")
    if not isinstance(n, int) or not isinstance(dt, str):
        return None
    e = element_size(dt)
    return None if e is None else n * e


_CPU_CATS = ("cpu_op", "user_annotation", "operator")
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "runtime")


class _Threads:
    """The CPU events of each (pid, tid), sorted by start, to find those around a timestamp."""

    def __init__(self, events: list[dict]):
        self.by: dict[tuple, list[dict]] = defaultdict(list)
        for e in events:
            self.by[(_key(e.get("pid")), _key(e.get("tid")))].append(e)
        self.starts: dict[tuple, list[float]] = {}
        for k, es in self.by.items():
            es.sort(key=lambda e: e["ts"])
            self.starts[k] = [e["ts"] for e in es]

    def around(self, pid, tid, ts: float) -> list[dict]:
        """The events of that thread whose span holds ``ts``, innermost first."""
        key = (pid, tid)
        es = self.by.get(key, [])
        i = bisect.bisect_right(self.starts.get(key, []), ts)
        out = [e for e in es[max(0, i - 2000) : i] if e["ts"] <= ts <= e["ts"] + e.get("dur", 0)]
        return sorted(out, key=lambda e: e["ts"], reverse=True)


def read_trace(path: str, injected: dict | None = None) -> Trace:
    """The calls of the trace at ``path``; ``injected``: microseconds to take from gloo events by ``(pid, tid, ts)``
    (``--without-injected``, sources/injected.py).

    Raises:
        KinetoError: the file is unreadable, not JSON, or not a Kineto trace.
    """
    doc = load_json(path)
    if not looks_like(doc):
        raise KinetoError(f"trace {path!r} is not a PyTorch profiler trace (expected a JSON object with traceEvents)")
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    info = info if isinstance(info, dict) else {}
    world = _info_int(path, info, "world_size", 1, MAX_WORLD)
    trace = Trace(
        path,
        _info_int(path, info, "rank", 0, (world or MAX_WORLD) - 1),
        world,
        info.get("backend")[:40] if isinstance(info.get("backend"), str) else None,
        nccl_version=info.get("nccl_version")[:40] if isinstance(info.get("nccl_version"), str) else None,
    )
    try:
        _calls(path, events, trace, injected)
    except _BadValue as e:
        raise KinetoError(str(e)) from None
    return trace


def _calls(path: str, events: list, trace: Trace, injected: dict | None = None) -> None:
    """The trace's calls into ``trace`` (module docstring)."""
    kernels, gloo, by_external, launches = [], [], {}, {}
    cpu_by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X" or not isinstance(e.get("name"), str):
            continue
        name, cat = e["name"], str(e.get("cat", "")).lower()
        if cat == "kernel":
            if name.startswith(("ncclKernel", "ncclDevKernel")):
                _check_event(path, i, e)
                kernels.append((i, e))
        elif cat in _CPU_CATS:
            if not _timed(e):
                continue
            cpu_by_thread[(_key(e.get("pid")), _key(e.get("tid")))].append(e)
            if name.startswith("gloo:"):
                _check_event(path, i, e)
                gloo.append((i, e))
            elif name == "record_param_comms":
                ext = _get(_args(e), "External id", "external id")
                if ext is not None:
                    by_external[_key(ext)] = e
        elif cat in _LAUNCH_CATS:
            c = _get(_args(e), "correlation")
            if c is not None and _timed(e):
                launches[_key(c)] = e
    # Older traces: the CPU events of the threads that launched kernels which do not carry their size.
    wanted = {
        (_key(launch.get("pid")), _key(launch.get("tid")))
        for _, k in kernels
        if not isinstance(_get(_args(k), "Collective name"), str)
        and (launch := launches.get(_key(_get(_args(k), "correlation")))) is not None
    }
    threads = _Threads([e for key in wanted for e in cpu_by_thread[key]])
    for i, e in kernels:
        try:
            call = _kernel_call(e, by_external, launches, threads)
        except _BadValue as bad:
            raise _BadValue(f"{_where(path, i, e)} or the CPU op that launched it: {bad}") from None
        if call is None:
            key = str(e["name"]).split("(")[0][:120]
            trace.unattributed[key] = trace.unattributed.get(key, 0) + 1
        else:
            trace.calls.append(call)
    for i, e in gloo:
        op = op_of_trace_name(e["name"])
        if op is None:
            key = e["name"][:120]
            trace.unattributed[key] = trace.unattributed.get(key, 0) + 1
            continue
        a = _args(e)
        try:
            nbytes = 0 if op == "barrier" else _tensor_bytes(a.get("Input Dims"), a.get("Input type"))
        except _BadValue as bad:
            raise _BadValue(f"{_where(path, i, e)}: {bad}") from None
        why = None if nbytes is not None else f"the {e['name'][:60]} event has no tensor Input Dims/Input type"
        taken = (injected or {}).get((e.get("pid"), e.get("tid"), e["ts"]), 0.0)
        trace.calls.append(Call(op, nbytes, (float(e["dur"]) - taken) * 1e3, None, "gloo event", why))


def _key(v: object) -> object:
    """A value as a dict key: a pid, tid, External id or correlation a trace wrote as a list is its text."""
    try:
        hash(v)
    except TypeError:
        return repr(v)
    return v


def _timed(e: dict) -> bool:
    ts, dur = e.get("ts"), e.get("dur")
    return (
        isinstance(ts, (int, float))
        and isinstance(dur, (int, float))
        and math.isfinite(ts)
        and math.isfinite(dur)
        and 0 <= dur <= MAX_DUR_US
    )


def _kernel_call(k: dict, by_external: dict, launches: dict, threads: _Threads) -> Call | None:
    """The call an NCCL kernel is, its op and size from the first place that has them (module docstring)."""
    a = _args(k)
    dur = float(k["dur"]) * 1e3
    kernel_op = op_of_trace_name(str(k.get("name", "")))
    group = _get(a, "Group size")
    group = group if isinstance(group, int) and not isinstance(group, bool) and 0 < group <= MAX_WORLD else None
    name = _get(a, "Collective name")
    if isinstance(name, str) and op_of_trace_name(name):
        nbytes = _nelems_bytes(a)
        return Call(
            op_of_trace_name(name),
            nbytes,
            dur,
            group,
            "kernel args",
            None
            if nbytes is not None
            else f"the kernel's In msg nelems/dtype are missing or unknown ({_get(a, 'dtype')!r})",
        )
    # The CPU op that launched it: record_param_comms by External id, else the ops around the launch.
    candidates = []
    ext = _key(_get(a, "External id", "external id"))
    if ext in by_external:
        candidates.append(by_external[ext])
    launch = launches.get(_key(_get(a, "correlation")))
    if launch is not None:
        candidates.extend(threads.around(_key(launch.get("pid")), _key(launch.get("tid")), launch["ts"]))
    for c in candidates:
        ca = _args(c)
        cname = str(c.get("name", ""))
        if cname == "record_param_comms" and isinstance(_get(ca, "Collective name"), str):
            op = op_of_trace_name(_get(ca, "Collective name"))
            if op:
                g = _get(ca, "Group size")
                nbytes = _nelems_bytes(ca)
                return Call(
                    op,
                    nbytes,
                    dur,
                    g if isinstance(g, int) and not isinstance(g, bool) and 0 < g <= MAX_WORLD else group,
                    "record_param_comms",
                    None if nbytes is not None else "record_param_comms has no In msg nelems/dtype",
                )
        if cname.startswith("nccl:") and op_of_trace_name(cname):
            nbytes = _tensor_bytes(ca.get("Input Dims"), ca.get("Input type"))
            return Call(
                op_of_trace_name(cname),
                nbytes,
                dur,
                group,
                "annotation",
                None if nbytes is not None else f"the {cname} annotation has no tensor Input Dims/Input type",
            )
    if kernel_op is None:
        return None
    return Call(kernel_op, None, dur, group, "kernel name", "neither the kernel nor a CPU op around its launch says")
