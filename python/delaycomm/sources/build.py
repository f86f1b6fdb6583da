"""Profiles from production sources: nccl-tests logs and Kineto traces, as measured or re-targeted (docs/profile.md).

``python -m delaycomm profile SOURCES... -o P.json`` reads each file by its content (delaycomm stats, an nccl-tests
log, a Kineto trace; :mod:`.read`), turns its calls into samples per (op, size class), and writes the profile
document (schema v1). With ``--ranks N --nodes M`` it fits the cost model (:mod:`delaycomm.costmodel`) to the
sources and scales each class to that scale.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
from collections.abc import Callable, Sequence

import numpy as np

from delaycomm import _schema, costmodel
from delaycomm._tools.units import format_size
from delaycomm.sources import injected
from delaycomm.sources.histogram import Pools, class_entry, size_class_bytes
from delaycomm.sources.ops import OP_NAMES_HELP, collective, collective_of_op
from delaycomm.sources.read import (
    DEFAULT_TAIL,
    Options,
    Source,
    SourceError,
    kind_of,
    read_source,
    row_class_bytes,
)

__all__ = [
    "SourceError",
    "Options",
    "Source",
    "DEFAULT_TAIL",
    "kind_of",
    "read_source",
    "build_profile",
    "add_arguments",
    "options_from",
]


def _merge_samples(parts: list) -> Pools:
    """The parts of one (op, bytes) as one (pools are added up when the class is written, not copied here)."""
    return Pools(parts)


def _classes(samples: dict[tuple[str, int], Pools]) -> dict[str, list[dict]]:
    """Per op, its classes' entries, each with ``size_bytes``: the mean size of the rows or calls it holds, weighed
    as its histogram weighs them (a table row's 1000 points, a trace's call one; a re-targeted class is keyed by
    its class size, the size the model predicted it at)."""
    by: dict[str, dict[int, list]] = {}
    sizes: dict[tuple[str, int], list[float]] = {}  # (op, class) -> [sum of size x points, points]
    for (op, nbytes), x in samples.items():
        parts = x if isinstance(x, list) else [x]
        cls = size_class_bytes(row_class_bytes(nbytes))
        by.setdefault(op, {}).setdefault(cls, []).extend(parts)
        acc = sizes.setdefault((op, cls), [0.0, 0.0])
        points = sum(len(p) for p in parts)
        acc[0] += float(nbytes) * points
        acc[1] += points
    done: dict[tuple, dict] = {}  # the ops of one collective share their rows' pools: each class added up once

    def entry(op: str, cls: int, parts: list) -> dict:
        key = (cls, *(id(p) for p in parts))
        if key not in done:
            done[key] = class_entry(cls, parts)
        out = dict(done[key])
        total, points = sizes[(op, cls)]
        if cls > 0 and points > 0:
            out["size_bytes"] = _schema.class_size(cls, total, points)
        return out

    return {op: [entry(op, cls, parts) for cls, parts in sorted(classes.items())] for op, classes in sorted(by.items())}


def _distance(a: costmodel.Topology, b: costmodel.Topology) -> float:
    return abs(math.log(a.ranks / b.ranks)) + abs(math.log(a.nodes / b.nodes))


_SMALLEST_CLASS = 8  # bytes: the smallest class a re-targeted profile holds (one double)


def _rows_by_op(sources: list[Source], target: costmodel.Topology) -> dict[str, list[tuple[float, int, int, Source]]]:
    """Per op, every source row as (distance of its source from the target scale, source index, bytes, source)."""
    out: dict[str, list[tuple[float, int, int, Source]]] = {}
    for i, s in enumerate(sources):
        d = _distance(s.topology, target)
        for op, nbytes in s.samples:
            out.setdefault(op, []).append((d, i, nbytes, s))
    return out


def _retarget(sources: list[Source], opt: Options) -> tuple[dict, dict, costmodel.CostModel]:
    """Every class the model can predict at the target scale, from 8 B to the sources' largest per-rank size: the
    samples of the source row nearest the target scale (then nearest in size), times the model's time of the class
    at the target over its time of that row at the row's scale."""
    target = costmodel.Topology(opt.ranks, opt.nodes, opt.nics_per_node)
    if target.ranks == 1:
        raise SourceError(
            "delaycomm: profile: --ranks 1: a single rank communicates nothing, so there is no latency to re-target "
            "(a job of one rank needs no delay profile)"
        )
    for s in sources:
        if s.topology is None:
            raise SourceError(
                f"delaycomm: profile: --ranks: {s.path!r} does not say its scale (world size {s.world_size}, nodes "
                f"{s.nodes}): the model needs both (rank lines with host names in an nccl-tests log)"
            )
    obs = [o for s in sources for o in s.observations]
    try:
        model = costmodel.fit(obs, tuning=costmodel.nccl.Tuning(opt.nccl_algo, opt.nccl_proto))
    except costmodel.ModelError as e:
        raise SourceError(f"delaycomm: profile: --ranks: {e}") from None
    samples: dict[tuple[str, int], np.ndarray] = {}
    notes: dict[str, list[dict]] = {}
    refused: dict[str, dict] = {}
    for op, rows in sorted(_rows_by_op(sources, target).items()):
        c = collective_of_op(op)
        if c is None or c.name not in model.fits:
            raise SourceError(f"delaycomm: profile: --ranks: op {op} has no collective the model fits")
        near = min(r[0] for r in rows)
        rows = [r for r in rows if r[0] == near]
        largest = max(size_class_bytes(row_class_bytes(r[2])) for r in rows)
        cls = _SMALLEST_CLASS
        while cls <= largest:
            _, _, nbytes, s = min(rows, key=lambda r: (abs(math.log2(max(r[2], 1) / cls)), r[1]))
            try:
                samples[(op, cls)], note = _scaled(model, c, s, op, nbytes, cls, target, opt)
                notes.setdefault(op, []).append(note)
            except costmodel.ModelError as e:
                refused.setdefault(op, {"classes": [], "why": str(e)})["classes"].append(cls)
            cls <<= 1
    ran = {(o.collective, model.algorithm(o.collective, o.size, o.topology)) for o in obs}
    for op, op_notes in notes.items():
        name = collective_of_op(op).name
        for note in op_notes:
            note["observed_algorithm"] = (name, note["algorithm"]) in ran
    if not samples:
        why = "; ".join(f"{op}: {r['why']}" for op, r in refused.items())
        raise SourceError(f"delaycomm: profile: --ranks: the model can predict no class at the target: {why}")
    meta = {
        "ranks": target.ranks,
        "nodes": target.nodes,
        "gpus_per_node": target.gpus_per_node,
        "nics_per_node": opt.nics_per_node or target.gpus_per_node,
        "rule": "every class from 8 B to the sources' largest per-rank size: the samples of the row nearest this "
        "scale (|ln ranks ratio| + |ln nodes ratio|), then nearest in size, times the model's time of the class "
        "here over its time of that row at the row's scale; a class outside the sources' sizes is the model's "
        "extrapolation (extrapolated: true)",
        "sources": [{"path": s.path, "ranks": s.topology.ranks, "nodes": s.topology.nodes} for s in sources],
        "classes": notes,
        "refused": refused or None,
        "nccl_algo": opt.nccl_algo,
        "nccl_proto": opt.nccl_proto,
    }
    return samples, meta, model


def _scaled(
    model: costmodel.CostModel,
    c,
    s: Source,
    op: str,
    nbytes: int,
    cls: int,
    target: costmodel.Topology,
    opt: Options,
) -> tuple[np.ndarray, dict]:
    """The row's samples scaled to the class at the target, and the note that says how."""
    src_topo = costmodel.Topology(s.topology.ranks, s.topology.nodes, opt.nics_per_node)
    row = row_class_bytes(nbytes)
    t_src = model.seconds(c.name, c.total_bytes(max(row, 1), src_topo.ranks), src_topo)
    t_dst = model.seconds(c.name, c.total_bytes(cls, target.ranks), target)
    algo, proto = model.choice(c.name, c.total_bytes(cls, target.ranks), target)
    ratio = t_dst / t_src if t_src > 0 else 1.0
    lo = min(size_class_bytes(row_class_bytes(b)) for o, b in s.samples if o == op)
    note = {
        "bytes": cls,
        "from": s.path,
        "from_bytes": nbytes,
        "scale": ratio,
        "algorithm": algo,
        "protocol": proto,
        "predicted_us": t_dst * 1e6,
        "extrapolated": cls < lo,
    }
    return _merge_samples(s.samples[(op, nbytes)]) * ratio, note


_LATENCY = {
    "nccl-tests": "nccl-tests: the mean GPU time per call of back-to-back calls (its 'time' column), spread into a "
    "distribution (metadata.spread)",
    "kineto": "Kineto: NCCL kernels' GPU time on the stream, and gloo:* events' CPU time from the start of the work "
    "to its end",
    "stats": "caller-experienced, from the call until wait() returns or the future completes",
}


def build_profile(
    paths: Sequence[str], opt: Options, stats_build: Callable[[Sequence[str]], dict]
) -> tuple[dict, list[str]]:
    """The profile document of the files at ``paths`` and the lines to report (calls without a size, scales).

    Args:
        paths: stats files, nccl-tests logs and Kineto traces, in any mix.
        opt: the command's flags.
        stats_build: the builder of profiles from stats files (``delaycomm.profile.build``).

    Raises:
        SourceError: a file cannot be read or made into a profile (the message names it).
    """
    kinds = {p: kind_of(p) for p in paths}
    stats = [p for p in paths if kinds[p] == "stats"]
    others = [p for p in paths if kinds[p] != "stats"]
    if not others:
        if opt.ranks is not None or opt.op is not None or opt.source_ranks is not None or opt.source_nodes is not None:
            raise SourceError(
                "delaycomm: profile: --ranks/--nodes, --op and --source-ranks/--source-nodes apply to nccl-tests logs "
                "and Kineto traces; the files given are delaycomm stats"
            )
        return stats_build(stats), []
    if opt.ranks is not None and stats:
        raise SourceError(
            f"delaycomm: profile: --ranks re-targets nccl-tests logs and traces; {stats[0]!r} is delaycomm stats "
            "(latency measured by delaycomm is not re-targeted: build it into a profile of its own)"
        )
    report: list[str] = []
    sources = [_read(p, opt, kinds[p]) for p in others]  # every source read (and its bad values refused) first
    traces = [p for p in others if kinds[p] == "kineto"]
    for p in traces:  # calls the trace lost, and the injected delay (sources/injected.py)
        report.extend(injected.audit(p))
    if opt.without_injected and traces:
        taken, lines = injected.corrections(traces)
        report.extend(lines)
        opt = dataclasses.replace(opt, injected=taken)
        sources = [_read(p, opt, kinds[p]) if p in traces else s for p, s in zip(others, sources)]
    retarget_meta = model = None
    if opt.ranks is not None:
        samples, retarget_meta, model = _retarget(sources, opt)
        world = opt.ranks
    else:
        worlds = {s.world_size for s in sources}
        if len(worlds) > 1:
            shown = ", ".join(f"{s.world_size} in {s.path!r}" for s in sources)
            raise SourceError(
                f"delaycomm: profile: the sources come from different world sizes ({shown}); a profile is for one "
                "world size: build one per world size, or give --ranks N --nodes M to re-target them all to one"
            )
        world = worlds.pop()
        merged: dict[tuple[str, int], list[np.ndarray]] = {}
        for s in sources:
            for key, parts in s.samples.items():
                merged.setdefault(key, []).extend(parts)
        samples = {k: _merge_samples(v) for k, v in merged.items()}
    ops = _classes(samples)
    unsized = _unsized(sources, report, ops)
    if not ops:
        raise SourceError(
            f"delaycomm: profile: the sources hold no call of known size ({', '.join(others)}): nothing to replay"
            + "".join(f"; {line}" for line in report if "missing from the trace" in line)
        )
    for s in sources:
        report.extend(s.warnings)
    doc = {
        "format": _schema.FORMAT,
        "version": _schema.VERSION,
        "histogram": {"base": _schema.HISTOGRAM_BASE, "unit": "ns"},
        "metadata": {
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "world_size": world,
            "nodes": opt.nodes if opt.ranks is not None else _common(s.nodes for s in sources),
            "backends": sorted({b for s in sources for b in s.backends}),
            "latency": "; ".join(_LATENCY[k] for k in sorted({s.kind for s in sources})),
            "sources": [
                dict(
                    {"path": os.path.abspath(s.path), "kind": s.kind, "world_size": s.world_size, "nodes": s.nodes},
                    **s.info,
                )
                for s in sources
            ],
            "spread": {
                "distribution": "lognormal",
                "p99_over_p50": opt.tail,
                "sigma": math.log(opt.tail) / 2.3263478740408408,
                "mean": "equals the table's time (the mean of nccl-tests' timed iterations)",
                "weight": "each table row is 1000 points of its distribution (a row weighs as 1000 calls)",
                "set_by": "--tail P99/P50 (1: every draw the table's time); nccl-tests' per-iteration columns "
                "(i_p99, i_min, i_max), when printed, set the row's spread instead",
            }
            if any(s.kind == "nccl-tests" for s in sources)
            else None,
            "placement": opt.placement,
            "unsized": unsized,
        },
        "ops": ops,
    }
    if retarget_meta is not None:
        doc["metadata"]["retargeted"] = retarget_meta
        doc["metadata"]["costmodel"] = model.as_dict()
        report.append(
            f"re-targeted to {opt.ranks} ranks on {opt.nodes} node(s) with the cost model fitted to "
            f"{sum(len(s.observations) for s in sources)} measurement(s) (docs/costmodel.md)"
        )
        report.extend(_unobserved(retarget_meta["classes"]))
    if stats:
        doc = _merge_stats(doc, stats_build(stats), stats)
    return doc, report


def _unobserved(classes: dict[str, list[dict]]) -> list[str]:
    """A line per op whose classes the model prices with an algorithm no source row ran: NCCL's own constants
    there, not a measurement."""
    out = []
    for op, notes in sorted(classes.items()):
        algos = sorted({n["algorithm"] for n in notes if not n["observed_algorithm"]})
        if algos:
            sizes = [n["bytes"] for n in notes if not n["observed_algorithm"]]
            out.append(
                f"warning: {op}: {len(sizes)} class(es) ({format_size(min(sizes))} to {format_size(max(sizes))}) "
                "priced with "
                f"{', '.join(algos)}, which NCCL would choose at the target but no source table ran: their times "
                "rest on NCCL's tuning constants, not a measurement (metadata.retargeted.classes[].observed_algorithm"
                "; --nccl-algo gives the cluster's NCCL_ALGO; docs/costmodel.md)"
            )
    return out


READER_BUG = "a bug in delaycomm's reader"


def _read(path: str, opt: Options, kind: str) -> Source:
    """:func:`read_source`, with any error a reader did not foresee still an error naming the file (exit 2, no
    traceback); tests/sources/test_fuzz.py asserts that no input reaches it."""
    try:
        return read_source(path, opt, kind)
    except (ArithmeticError, RecursionError, LookupError, TypeError, AttributeError, UnicodeError) as e:
        raise SourceError(
            f"delaycomm: profile: {path!r} ({kind}) could not be read: {type(e).__name__}: {str(e)[:200]} "
            f"({READER_BUG}: please report it with the file)"
        ) from None


def _common(values) -> int | None:
    vs = set(values)
    return vs.pop() if len(vs) == 1 else None


_SIZE_HINT = {
    "kineto": "record the trace with torch.profiler.profile(record_shapes=True) to size them",
}


def _unsized(sources: list[Source], report: list[str], ops: dict[str, list[dict]]) -> dict | None:
    """The calls of unknown size, per op: counted, their reasons, and their pooled distribution; an op with no
    sized call at all is written as that distribution (one class, bytes 0: every size), and the report says so."""
    out: dict[str, dict] = {}
    pools: dict[str, list] = {}
    for s in sources:
        for op, durs in s.unsized.items():
            e = out.setdefault(op, {"calls": 0, "reasons": {}, "sources": []})
            e["calls"] += len(durs)
            pools.setdefault(op, []).append(np.asarray(durs, dtype=np.float64))
            if s.path not in e["sources"]:
                e["sources"].append(s.path)
            for why, n in s.unsized_why.get(op, {}).items():
                e["reasons"][why] = e["reasons"].get(why, 0) + n
        for kernel, n in s.info.get("unattributed_kernels", {}).items():
            report.append(
                f"{s.path}: {n} {kernel} kernel(s) of no op delaycomm can name (no CPU op says which): left out"
            )
    hint = "; ".join(sorted({h for s in sources if s.unsized for k, h in _SIZE_HINT.items() if s.kind == k}))
    for op, e in sorted(out.items()):
        entry = class_entry(0, pools[op])
        e["histogram"] = {k: v for k, v in entry.items() if k != "bytes"}
        reasons = "; ".join(f"{n} {w}" for w, n in e["reasons"].items())
        if op not in ops:
            ops[op] = [entry]
            e["written_as"] = "the op's pooled distribution: one class of bytes 0, drawn for every size"
            done = "written as the op's pooled distribution (one class for every size)"
        else:
            done = "kept in metadata.unsized (the op's pooled distribution, not replayed per size)"
        report.append(f"{e['calls']} {op} call(s) of unknown size: {done}: {reasons}" + (f" ({hint})" if hint else ""))
    if out:
        for op in list(ops):
            ops[op] = sorted(ops[op], key=lambda c: c["bytes"])
    return out or None


def _merge_stats(doc: dict, stats_doc: dict, stats: list[str]) -> dict:
    """The sources' profile with the stats files' classes added (same world size only)."""
    w = stats_doc["metadata"].get("world_size")
    if w != doc["metadata"]["world_size"]:
        raise SourceError(
            f"delaycomm: profile: the stats files are of world size {w} and the other sources of "
            f"{doc['metadata']['world_size']}; a profile is for one world size"
        )
    for op, classes in stats_doc["ops"].items():
        mine = {c["bytes"]: c for c in doc["ops"].setdefault(op, [])}
        for c in classes:
            m = mine.get(c["bytes"])
            if m is None:
                mine[c["bytes"]] = dict(c)
                continue
            buckets: dict[int, int] = {}
            for i, n in m["buckets"] + c["buckets"]:
                buckets[i] = buckets.get(i, 0) + n
            size = {}  # the sizes' count-weighted mean, when both say theirs
            if c["bytes"] > 0 and "size_bytes" in m and "size_bytes" in c:
                total = m["size_bytes"] * m["count"] + c["size_bytes"] * c["count"]
                size["size_bytes"] = _schema.class_size(c["bytes"], total, m["count"] + c["count"])
            m.pop("size_bytes", None)
            m.update(
                size,
                count=m["count"] + c["count"],
                zeros=m.get("zeros", 0) + c.get("zeros", 0),
                min_ns=min(m["min_ns"], c["min_ns"]),
                max_ns=max(m["max_ns"], c["max_ns"]),
                sum_ns=m.get("sum_ns", 0.0) + c.get("sum_ns", 0.0),
                buckets=[[i, n] for i, n in sorted(buckets.items())],
            )
        doc["ops"][op] = [mine[b] for b in sorted(mine)]
    doc["metadata"]["sources"].extend({"path": os.path.abspath(p), "kind": "stats"} for p in stats)
    doc["metadata"]["latency"] += "; " + _LATENCY["stats"]
    return doc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``profile`` command's flags for nccl-tests logs and traces (docs/profile.md)."""
    from delaycomm._tools import args as argtypes

    g = parser.add_argument_group("nccl-tests logs and PyTorch profiler traces (docs/profile.md)")
    g.add_argument("--op", metavar="NAME", help=f"the collective of tables a log does not name: {OP_NAMES_HELP}")
    g.add_argument(
        "--tail",
        type=argtypes.number(1.0, 1e3),
        default=DEFAULT_TAIL,
        metavar="P99/P50",
        help=f"the spread of an nccl-tests mean: a lognormal of that p99/p50 whose mean is the table's time "
        f"(default {DEFAULT_TAIL}; 1: no spread)",
    )
    g.add_argument(
        "--placement",
        choices=("auto", "out-of-place", "in-place"),
        default="auto",
        help="which nccl-tests time columns to read (default auto: in-place for all_reduce, broadcast and reduce, "
        "out-of-place for the others, as torch calls them)",
    )
    g.add_argument(
        "--ranks", type=argtypes.integer(1, 1 << 20), metavar="N", help="re-target to N ranks (needs --nodes)"
    )
    g.add_argument(
        "--nodes", type=argtypes.integer(1, 1 << 20), metavar="M", help="re-target to M nodes (with --ranks)"
    )
    g.add_argument(
        "--nics-per-node",
        type=argtypes.integer(1, 1024),
        metavar="K",
        help="NICs per node of the target and the sources (default: one per GPU)",
    )
    for flag, env, example in (
        ("--nccl-algo", "NCCL_ALGO", "Ring or ^NVLSTree"),
        ("--nccl-proto", "NCCL_PROTO", "Simple"),
    ):
        g.add_argument(
            flag,
            metavar="LIST",
            help=f"the cluster's {env} in NCCL's syntax (e.g. {example}; default: unset, NCCL's choice): the model "
            "chooses only among what it enables, for the sources and the target alike (docs/costmodel.md)",
        )
    g.add_argument(
        "--source-ranks",
        type=argtypes.integer(1, 1 << 20),
        metavar="N",
        help="the world size of the runs the logs and traces come from, where they do not say it (a log whose rank "
        "lines list only some ranks); refused where a source says otherwise",
    )
    g.add_argument(
        "--source-nodes",
        type=argtypes.integer(1, 1 << 20),
        metavar="M",
        help="the nodes of the runs the logs and traces come from, where they do not say it",
    )
    g.add_argument(
        "--strict",
        action="store_true",
        help="refuse an nccl-tests log whose validation failed (#wrong not 0, 'Out of bounds values : N FAILED'); "
        "by default it is read with a warning naming the rows",
    )
    g.add_argument(
        "--without-injected",
        action="store_true",
        help="take the delay delaycomm injected (its delaycomm:delay spans) out of the calls of its own traces; "
        "give every rank's trace (docs/telemetry.md)",
    )
    g.add_argument(
        "--trace-gpus-per-node",
        type=argtypes.integer(1, 1024),
        default=8,
        metavar="G",
        help="GPUs per node of the jobs that wrote the traces (for the model; default 8)",
    )


def options_from(args: argparse.Namespace) -> Options:
    """The :class:`Options` of parsed ``profile`` arguments.

    Raises:
        SourceError: --ranks without --nodes (or the reverse), a scale the model refuses, or an unknown --op.
    """
    ranks, nodes = getattr(args, "ranks", None), getattr(args, "nodes", None)
    if (ranks is None) != (nodes is None):
        raise SourceError("delaycomm: profile: --ranks N and --nodes M go together (the scale to re-target to)")
    if ranks is not None:
        try:
            costmodel.Topology(ranks, nodes, getattr(args, "nics_per_node", None))
        except costmodel.ModelError as e:
            raise SourceError(f"delaycomm: profile: --ranks {ranks} --nodes {nodes}: {e}") from None
    algo, proto = getattr(args, "nccl_algo", None), getattr(args, "nccl_proto", None)
    if (algo is not None or proto is not None) and ranks is None:
        raise SourceError(
            "delaycomm: profile: --nccl-algo/--nccl-proto choose the model's algorithms: they need --ranks N --nodes M"
        )
    try:
        costmodel.nccl.Tuning(algo, proto)
    except ValueError as e:
        flag = "--nccl-algo" if "NCCL_ALGO" in str(e) else "--nccl-proto"
        raise SourceError(f"delaycomm: profile: {flag}: {e}") from None
    op = getattr(args, "op", None)
    if op is not None and collective(op) is None:
        raise SourceError(f"delaycomm: profile: --op {op!r} names no collective; expected {OP_NAMES_HELP}")
    return Options(
        op=op,
        tail=getattr(args, "tail", DEFAULT_TAIL),
        placement=getattr(args, "placement", "auto"),
        ranks=ranks,
        nodes=nodes,
        nics_per_node=getattr(args, "nics_per_node", None),
        nccl_algo=algo,
        nccl_proto=proto,
        trace_gpus_per_node=getattr(args, "trace_gpus_per_node", 8),
        source_ranks=getattr(args, "source_ranks", None),
        source_nodes=getattr(args, "source_nodes", None),
        strict=bool(getattr(args, "strict", False)),
        without_injected=getattr(args, "without_injected", False),
    )
