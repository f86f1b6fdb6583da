"""Latency profiles: per op and size class, the latency a job's callers experienced (docs/profile.md).

``python -m delaycomm profile STATS... -o PROFILE.json`` merges the stats files of the ranks of one or more jobs
(``DELAYCOMM_STATS``) into a profile; ``DELAYCOMM_DELAY=profile:PROFILE.json`` replays it.

The API, for this command and for any other source of profiles (docs/profile.md, "Writing a profile"):

- :func:`build` makes a profile document (schema version 1) from stats files;
- :func:`check` is the one schema check (``delaycomm._schema``): a document in, the native profile out, or an error
  naming the field;
- :func:`write` checks a document before a byte is written, refuses to overwrite the files it was made from, and
  writes it atomically;
- :func:`load` reads a profile file once and returns the document and its parsed spec (``_C.DelaySpec``): what a
  replay draws from, and what ``--show`` and ``--png`` print.
"""

from __future__ import annotations

import datetime
import os
import stat
from collections import Counter
from collections.abc import Sequence
from typing import Any

from delaycomm import _schema
from delaycomm._readers import FileError, quote, read_json
from delaycomm._schema import FORMAT, HISTOGRAM_BASE, VERSION
from delaycomm._tools import table
from delaycomm._tools.output import check_writable, write_json
from delaycomm._tools.table import Column
from delaycomm._tools.units import format_size

__all__ = [
    "FORMAT",
    "VERSION",
    "ProfileError",
    "build",
    "check",
    "check_output",
    "load",
    "write",
    "format_profile",
    "plot",
    "profile_rows",
]

QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p999"))
# The quantiles the plot draws (its band, line and dashed tail).
_BAND = ((0.1, "p10"), (0.5, "p50"), (0.9, "p90"), (0.99, "p99"))
_STATS_EXPECTED = "the JSON of a DELAYCOMM_STATS file or of delaycomm.stats()"


class ProfileError(FileError):
    """A profile cannot be built or written (the message names the file and what is wrong)."""


def check(doc: Any, name: str = "the profile"):
    """The one schema check of a profile document (docs/profile.md, version 1).

    Args:
        doc: the document, as :func:`build` or another source makes it.
        name: how messages name it.

    Returns:
        Its native ``delaycomm._C.DelayProfile`` (quantiles, per-class calls, digest).

    Raises:
        delaycomm._readers.FileError: ``NAME field FIELD WHY; docs/profile.md has the schema``.
    """
    return _schema.check_profile(doc, name)


def load(path: str):
    """The profile file at ``path``, read once and checked, and its parsed spec.

    Returns:
        ``(document, spec)``: the JSON document and the ``delaycomm._C.DelaySpec`` of ``profile:PATH``
        (``spec.quantile(q, op=..., nbytes=...)`` is the replay's quantile function; ``spec.profile.class_info()``
        its classes and their calls).

    Raises:
        delaycomm._readers.FileError: the file cannot be read or is not a valid profile (the message names the
            file and the field).
    """
    from delaycomm import _C

    doc, native = _schema.read_profile(path)
    return doc, _C.DelaySpec.of_profile(f"profile:{path}", native)


def _groups(path: str) -> list[dict[str, Any]]:
    """The groups of one stats file (a stats file is one group, a ``delaycomm.stats()`` dump has ``groups``),
    each checked for what a profile is built from."""
    name = f"stats file {quote(path)}"
    data = read_json(path, name, _STATS_EXPECTED)
    if isinstance(data, dict) and isinstance(data.get("groups"), dict):
        found = [(f"groups.{_schema._key(str(k))}", g) for k, g in data["groups"].items()]
    elif isinstance(data, dict) and isinstance(data.get("ops"), dict):
        found = [("", data)]
    else:
        raise ProfileError(f"{name} is not delaycomm stats (expected {_STATS_EXPECTED})")
    return [_schema.check_stats_group(g, name, field) for field, g in found]


def build(paths: Sequence[str]) -> dict[str, Any]:
    """A profile from the stats files of the ranks of one or more jobs of the same world size.

    Every file's per-size histograms are added up per (op, size class): the profile is the distribution of the
    latency of every call of every rank.

    Raises:
        FileError: a file is unreadable or not stats (naming the file and the field), the jobs have different world
            sizes, or no call was timed.
    """
    if not paths:
        raise ProfileError("no stats files given")
    hists: dict[str, dict[int, dict[str, Any]]] = {}
    jobs: list[dict[str, Any]] = []
    current: dict[tuple[str, str], dict[str, Any]] = {}
    world_sizes: dict[int, str] = {}
    backends: set[str] = set()
    versions: list[dict[str, Any]] = []
    machines: dict[str, dict[str, Any]] = {}
    for path in paths:
        for g in _groups(path):
            world = g["world_size"]
            world_sizes.setdefault(world, path)
            # A job: the files of one directory and group, one per rank (a rank seen again starts another job).
            key = (os.path.dirname(os.path.abspath(path)), g["group"])
            job = current.get(key)
            if job is None or g["rank"] in job["ranks"]:
                job = {"directory": key[0], "group": g["group"], "world_size": world, "ranks": []}
                jobs.append(job)
                current[key] = job
            job["ranks"].append(g["rank"])
            backends.update(g["backends"])
            if g["versions"] and g["versions"] not in versions:
                versions.append(g["versions"])
            if g["host"]:
                machines.setdefault(g["host"], g["machine"] or {"hostname": g["host"]})
            for op, classes in g["ops"].items():
                for nbytes, h in classes:
                    _add(hists.setdefault(op, {}), nbytes, h, path, op)
    if len(world_sizes) > 1:
        shown = ", ".join(f"{w} in {p!r}" for w, p in world_sizes.items())
        raise ProfileError(
            f"the stats files come from jobs of different world sizes ({shown}); a profile is "
            "for one world size: build one per world size"
        )
    if not hists:
        raise ProfileError(
            "the stats files hold no timed calls (expected DELAYCOMM_STATS files of jobs that ran collectives)"
        )
    ops = {
        op: [
            dict(
                {
                    "bytes": size,
                    "count": h["count"],
                    "zeros": h["zeros"],
                    "min_ns": h["min_ns"],
                    "max_ns": h["max_ns"],
                    "sum_ns": h["sum_ns"],
                    "buckets": [[i, c] for i, c in sorted(h["buckets"].items())],
                },
                **_size_of(size, h),
            )
            for size, h in sorted(classes.items())
        ]
        for op, classes in sorted(hists.items())
    }
    return {
        "format": FORMAT,
        "version": VERSION,
        "histogram": {"base": HISTOGRAM_BASE, "unit": "ns"},
        "metadata": {
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "world_size": next(iter(world_sizes)),
            "backends": sorted(backends),
            "latency": "caller-experienced, from the call until wait() returns or the future completes",
            "jobs": [dict(j, ranks=sorted(j["ranks"], key=lambda r: (r is None, r or 0))) for j in jobs],
            "sources": [os.path.abspath(p) for p in paths],
            "versions": versions,
            "machines": list(machines.values()),
        },
        "ops": ops,
    }


def _add(classes: dict[int, dict[str, Any]], nbytes: int, h: dict[str, Any], path: str, op: str) -> None:
    """Adds one stats file's histogram of (op, size class) to the profile's (both checked by _schema)."""
    if not h["count"]:
        return
    acc = classes.setdefault(
        nbytes,
        {"count": 0, "zeros": 0, "min_ns": h["min_ns"], "max_ns": h["max_ns"], "sum_ns": 0.0, "buckets": Counter(),
         "size_calls": 0, "size_sum": 0.0, "sized": True},
    )  # fmt: skip
    sizes = h.get("sizes")
    if sizes is None or not sizes[0]:  # an older stats file: the class's calls' sizes are not known
        acc["sized"] = False
    else:
        acc["size_calls"] += sizes[0]
        acc["size_sum"] += sizes[1]
    acc["count"] += h["count"]
    if acc["count"] > _schema.MAX_COUNT:
        raise ProfileError(
            f"the stats files hold more than 2^53 calls of op {op!r} of {nbytes} bytes (at {path!r}): a profile "
            "counts its calls exactly in JSON numbers; build it from fewer files"
        )
    acc["zeros"] += h["zeros"]
    acc["sum_ns"] += h["sum_ns"]
    acc["min_ns"] = min(acc["min_ns"], h["min_ns"])
    acc["max_ns"] = max(acc["max_ns"], h["max_ns"])
    for i, c in h["buckets"]:
        acc["buckets"][int(i)] += int(c)


def _size_of(class_bytes: int, h: dict[str, Any]) -> dict[str, int]:
    """``{"size_bytes": ...}`` of a class built from stats files when every file recorded its calls' sizes."""
    if class_bytes <= 0 or not h["sized"] or not h["size_calls"]:
        return {}
    return {"size_bytes": _schema.class_size(class_bytes, h["size_sum"], h["size_calls"])}


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path: str, inputs: Sequence[str] = (), what: str = "-o") -> None:
    """Checks that ``path`` can take a file written by this command, before anything is built.

    Args:
        path: the file to write.
        inputs: the files it is made from, which it must not overwrite.
        what: how messages name it (the option, ``-o`` or ``--png``).

    Raises:
        ProfileError: the directory does not exist, the path is a directory or not a regular file, it is one of
            ``inputs``, or no file can be created beside it.
    """
    name = f"{what} {quote(path)}"
    if not path or "\0" in path:
        raise ProfileError(f"{name} is not a file path (expected a file to write)")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ProfileError(f"{name}: the directory {quote(directory)} does not exist (expected a file to write)")
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ProfileError(f"{name} is a directory (expected a file to write)")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ProfileError(f"{name} is not a regular file (expected a file to write)")
    for source in inputs:
        if _same_file(path, source):
            raise ProfileError(
                f"{name} is the input file {quote(source)}: writing it would replace what it is made from (expected "
                "another file)"
            )
    try:
        check_writable(path)
    except OSError as e:
        raise ProfileError(f"{name} cannot be written: {e.strerror}") from None


def write(profile: dict[str, Any], path: str, inputs: Sequence[str] = ()):
    """Writes a profile document to ``path``: checked first, then atomically (nothing is left on a failure).

    Args:
        profile: the document (schema version 1: :func:`build`'s, or another source's).
        path: the file to write.
        inputs: the files the document was made from; ``path`` may be none of them.

    Returns:
        The native profile (``delaycomm._C.DelayProfile``) of what was written.

    Raises:
        FileError: ``path`` cannot take it (:func:`check_output`), or the document is not a valid profile (the
            message names the field).
    """
    check_output(path, inputs)
    native = check(profile, f"the profile to be written to {quote(path)}")
    try:
        write_json(path, profile)
    except (OSError, TypeError, ValueError) as e:
        raise ProfileError(f"-o {quote(path)} cannot be written: {getattr(e, 'strerror', None) or e}") from None
    return native


def profile_rows(spec) -> list[dict[str, Any]]:
    """One row per (op, size class) of a profile's spec (:func:`load`): op, bytes, calls, rare (fewer than
    ``DelayProfile.min_class_calls`` calls: replayed from the op's other classes), ``at`` (the size drawn at: the
    class's ``size_bytes`` where it has one, else its smallest size) and the replay's quantiles there and max in
    microseconds."""
    rows = []
    for c in spec.profile.class_info():
        at = c["bytes"] if c.get("size_bytes") is None else c["size_bytes"]
        row: dict[str, Any] = {"op": c["op"], "bytes": c["bytes"], "at": at, "calls": c["count"], "rare": c["rare"]}
        for q, name in QUANTILES:
            row[name] = spec.quantile(q, op=c["op"], nbytes=at) * 1e6
        row["max"] = c["max_ns"] * 1e-3
        rows.append(row)
    return rows


_COLUMNS = (
    Column("op", align="<", width=20),
    Column("size", "B", lambda r: r["bytes"], width=12),
    Column("calls", width=9),
    *(Column(name, "us", fmt="{:.1f}", width=10) for _, name in QUANTILES),
    Column("max", "us", fmt="{:.1f}", width=10),
    Column("note", value=lambda r: "rare: drawn from the op's other classes" if r["rare"] else "", align="<"),
)


def _meta(value: Any, limit: int = 60) -> str:
    """A metadata value for the header: metadata is free-form, so anything is shown, shortened."""
    text = value if isinstance(value, str) else "?" if value is None else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_profile(path: str, loaded: tuple[dict[str, Any], Any] | None = None) -> str:
    """The profile at ``path`` (or ``loaded``, :func:`load`'s result for it) as a table, one row per op and size
    class, under a header of its metadata."""
    doc, spec = loaded or load(path)
    meta = doc["metadata"]
    jobs = [j for j in meta.get("jobs", []) if isinstance(j, dict)] if isinstance(meta.get("jobs"), list) else []
    ranks = sum(len(j["ranks"]) for j in jobs if isinstance(j.get("ranks"), list))
    backends = meta.get("backends")
    shown = ",".join(b for b in backends if isinstance(b, str)) if isinstance(backends, list) else ""
    header = [
        f"delaycomm profile {path} (format version {doc['version']}, content {spec.digest})",
        f"world size {_meta(meta.get('world_size'))}, backends {_meta(shown) or '?'}, {len(jobs)} job(s), "
        f"{ranks} rank file(s), created {_meta(meta.get('created'))}",
    ]
    return table.format_table(_COLUMNS, profile_rows(spec), header=header)


def _unit(values_us: list[float]) -> tuple[str, float]:
    """The plot's latency unit for these values (us, ms or s: the one whose median value is at least 1) and the
    factor from microseconds to it."""
    mid = sorted(values_us)[len(values_us) // 2] if values_us else 0.0
    return ("s", 1e-6) if mid >= 1e6 else ("ms", 1e-3) if mid >= 1e3 else ("us", 1.0)


def plot(path: str, png: str, loaded: tuple[dict[str, Any], Any] | None = None) -> None:
    """Plots the profile to ``png`` (needs matplotlib): one panel per op, latency against size class, the replay's
    p50 as a line in a band from p10 to p90 (shaded) with p99 dashed above it, each class's number of calls beside
    its point, rare classes (replayed from the op's other classes) hollow and grey."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from delaycomm._tools.optional import missing_message

        raise ProfileError(f"--png: {missing_message('matplotlib')}; the profile was written") from None
    doc, spec = loaded or load(path)
    rows = profile_rows(spec)
    calls: dict[str, int] = {}
    for r in rows:
        calls[r["op"]] = calls.get(r["op"], 0) + r["calls"]
    ops = sorted(calls, key=lambda op: -calls[op])  # the busiest op first
    cols = min(3, len(ops))
    nrows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(ops) :]:
        ax.set_visible(False)
    for ax, op in zip(axes.flat, ops):
        mine = [r for r in rows if r["op"] == op]
        sizes = [max(r["bytes"], 1) for r in mine]
        q = {name: [spec.quantile(x, op=op, nbytes=r["at"]) * 1e6 for r in mine] for x, name in _BAND}
        unit, k = _unit(q["p50"])
        scaled = {name: [v * k for v in vs] for name, vs in q.items()}
        if len(sizes) > 1:
            ax.fill_between(sizes, scaled["p10"], scaled["p90"], alpha=0.25, color="C0", label="p10-p90")
        else:  # one class: its band as an error bar
            lo, hi = scaled["p50"][0] - scaled["p10"][0], scaled["p90"][0] - scaled["p50"][0]
            ax.errorbar(sizes, scaled["p50"], yerr=[[lo], [hi]], color="C0", alpha=0.5, capsize=6, label="p10-p90")
        ax.plot(sizes, scaled["p50"], color="C0", label="p50")
        ax.plot(sizes, scaled["p99"], color="C3", linestyle="--", label="p99")
        full = [i for i, r in enumerate(mine) if not r["rare"]]
        rare = [i for i, r in enumerate(mine) if r["rare"]]
        ax.plot([sizes[i] for i in full], [scaled["p50"][i] for i in full], "o", color="C0")
        if rare:
            ax.plot([sizes[i] for i in rare], [scaled["p50"][i] for i in rare], "o", mfc="none", color="grey",
                    label="rare class (< min calls)")  # fmt: skip
        for x, y, r in zip(sizes, scaled["p50"], mine):
            ax.annotate(f"n={r['calls']}", (x, y), textcoords="offset points", xytext=(4, -11), fontsize=7)
        if len(sizes) > 1:
            ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [format_size(r["bytes"]) for r in mine], rotation=45, fontsize=7)
        ax.set_xlabel("size class")
        ax.set_ylabel(f"latency ({unit})")
        ax.set_title(f"{op} ({calls[op]} calls)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{os.path.basename(path)}: world size {_meta(doc['metadata'].get('world_size'))}")
    fig.tight_layout()
    try:
        fig.savefig(png, dpi=100)
    except OSError as e:
        raise ProfileError(f"--png {quote(png)} cannot be written: {e.strerror}") from None
    finally:
        plt.close(fig)


def _run(args) -> int:
    import sys

    def usage(message: str) -> int:
        print(f"error: profile: {message}", file=sys.stderr)
        return 2

    if not (args.stats or args.show):
        return usage("give stats files and -o PROFILE.json, or --show PROFILE.json")
    if args.stats and not args.output:
        return usage("-o PROFILE.json is required with stats files")
    target = args.show or args.output
    if args.png and not target:
        return usage("--png needs a profile (-o or --show)")
    inputs = list(args.stats)
    if args.stats:
        check_output(args.output, inputs)  # before the stats are read: a bad -o costs nothing
    if args.png:
        check_output(args.png, [*inputs, target], "--png")
    if args.stats:
        from delaycomm.sources import build as sources  # nccl-tests logs, Kineto traces (docs/profile.md)

        doc, notes = sources.build_profile(inputs, sources.options_from(args), build)
        write(doc, args.output, inputs)
        for note in notes:  # a warning (a log whose validation failed) as one, the rest as notes
            print(note if note.startswith("warning: ") else f"# {note}", file=sys.stderr)
        print(f"# wrote {args.output}", file=sys.stderr, flush=True)
    loaded = load(target) if (args.png or args.show) else None
    if args.png:
        plot(target, args.png, loaded)
        print(f"# wrote {args.png}", file=sys.stderr, flush=True)
    if args.show:
        print(format_profile(args.show, loaded))
    return 0


def main(args) -> int:
    """``python -m delaycomm profile`` (arguments parsed by delaycomm.__main__): exit status 2 with ``error:`` and
    the file's name for a file that cannot be read, is not stats, is not a valid profile, or cannot be written."""
    import sys

    try:
        return _run(args)
    except ValueError as e:  # FileError (each names the file), and the sources' errors naming the file and line
        message = str(e)
        if not message.startswith("delaycomm: "):
            message = f"delaycomm: profile: {message}"
        print(f"error: {message}", file=sys.stderr)
        return 2
