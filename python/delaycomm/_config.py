"""Options of the delaycomm backend: one table, three sources (keyword > environment > default), strict checks.

Every option is a keyword of :class:`DelayConfig` and an environment variable ``DELAYCOMM_<NAME>``. A bad value
raises :class:`ValueError` in one format: the value, the option, where the value came from, what is accepted
(``delaycomm: invalid value '2' for option 'ema_alpha' from the environment variable DELAYCOMM_EMA_ALPHA: expected
a number in (0, 1]``). This module is the one place where user values are checked; numbers are bounded so that
every accepted value fits the native type it becomes (docs/config.md names each bound and why).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import string
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from delaycomm import _ops
from delaycomm._tools import units

__all__ = [
    "DelayConfig",
    "EffectiveConfig",
    "configure",
    "resolve",
    "format_value",
    "stats_file",
    "parse_delay",
    "Delay",
    "GroupView",
    "group_seed",
    "OPTIONS",
    "DELAYABLE_OPS",
]

ENV_PREFIX = "DELAYCOMM_"

# Op names as the backend counts them, and torch.distributed's function names for them: the native op table.
DELAYABLE_OPS = _ops.DELAYABLE_OPS
_NCCL_ALGOS = {"tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"}
_NCCL_ALGO_OPS = {"allreduce", "broadcast", "reduce", "allgather", "reducescatter", "sendrecv"}


class _Invalid(Exception):
    """Raised by a parser: what is accepted and, optionally, what is wrong first; wrapped into ValueError."""

    def __init__(self, accepted: str | None, cause: str = "") -> None:
        self.why = "; ".join(p for p in (cause, f"expected {accepted}" if accepted else "") if p)
        super().__init__(self.why)


# ------------------------------------------------------------------------------------------------------------------
# Bounds (docs/config.md): each keeps an accepted value inside the native type it becomes, with room for the
# arithmetic done on it (a step times the ssp bound in int64 nanoseconds, a slowdown factor times a gap).

MAX_RANK = 2**31 - 1  # c10d ranks are C ints
MAX_SLOWDOWN = 1000.0  # extra sleep = gap * (K - 1) in int64 ns: fits for any gap below 106 days
MAX_SSP_BOUND = 10_000  # bound * step (<= 24 h) stays below 2^63 ns
MIN_STEP_MS, MAX_STEP_MS = 1e-3, 86_400_000.0  # 1 us (a step is counted in whole ns) to 24 h
MAX_NCCL_BUFFSIZE = 1 << 30  # NCCL keeps NCCL_BUFFSIZE in a C int


# ------------------------------------------------------------------------------------------------------------------
# Parsers: value (str from the environment, or the keyword's type) -> canonical value, or _Invalid.


def _parse_float(
    lo: float, hi: float, lo_open: bool, hi_open: bool, accepted: str | None = None
) -> Callable[[Any], float]:
    lb = "(" if lo_open else "["
    rb = ")" if hi_open else "]"
    accepted = accepted or f"a number in {lb}{lo:g}, {hi:g}{rb}"

    def parse(v: Any) -> float:
        if isinstance(v, bool):
            raise _Invalid(accepted)
        if isinstance(v, str) and not re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*", v, re.IGNORECASE):
            raise _Invalid(accepted)  # no 'nan', 'inf', '0x..', '1_000'
        try:
            x = float(v)
        except (TypeError, ValueError, OverflowError):
            raise _Invalid(accepted) from None
        if math.isnan(x) or x < lo or x > hi or (lo_open and x == lo) or (hi_open and x == hi):
            raise _Invalid(accepted)
        return x + 0.0  # -0.0 is 0.0: one canonical value (the ranks compare them)

    return parse


def _parse_int(lo: int, hi: int, accepted: str) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        if isinstance(v, bool):
            raise _Invalid(accepted)
        if isinstance(v, int):
            x = v
        elif isinstance(v, str) and re.fullmatch(r"\s*[+]?\d{1,30}\s*", v):
            x = int(v)
        else:
            raise _Invalid(accepted)
        if x < lo or x > hi:
            raise _Invalid(accepted)
        return x

    return parse


def _rank(v: Any, accepted: str) -> int:
    """One rank number: an int (or digits) in [0, MAX_RANK]."""
    if isinstance(v, str) and re.fullmatch(r"\s*\d{1,30}\s*", v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_RANK:
        raise _Invalid(accepted)
    return v


class Delay(str):
    """A canonical ``delay`` value: the spec's text, stripped (``'none'`` for none, off and 0), as shown and agreed,
    with ``spec``, the spec parsed once (``delaycomm._C.DelaySpec``: its distribution solved, a trace's or a
    profile's file read once and kept, its content digest). Everything after the option check reads ``spec``."""

    spec: Any
    metadata: Any  # a profile's metadata object (docs/profile.md, "Schema"); None for other specs

    def __new__(cls, text: str, spec: Any, metadata: Any = None) -> Delay:
        self = super().__new__(cls, text)
        self.spec = spec
        self.metadata = metadata
        return self

    def __reduce__(self):  # type: ignore[override]
        # A native handle does not pickle: the value is parsed again where it is unpickled (its file read there).
        return (parse_delay, (str(self),))


def _parse_delay(v: Any) -> Delay:
    from delaycomm import _spec

    accepted = "a delay spec such as 'exp:p99=400ms' or 'none' (see `python -m delaycomm config --help`)"
    if not isinstance(v, str):
        raise _Invalid(accepted)
    text = v.strip()
    if text.lower() in ("none", "off", "0"):
        text = "none"
    try:
        spec, metadata = _spec.parse_with_metadata(text)
    except ValueError as e:
        raise _Invalid(None, delay_spec_error(str(e))) from None
    return Delay(text, spec, metadata)


def parse_delay(v: Any) -> Delay:
    """A delay spec, parsed: ``none`` (for ``none``, ``off``, ``0``) or the spec, stripped, with its parsed ``spec``.

    Raises:
        ValueError: what is wrong, as the option's message says it after the option's name (what is accepted, or
            what the native parser found wrong); the caller names the argument and the value.
    """
    try:
        return _parse_delay(v)
    except _Invalid as e:
        raise ValueError(e.why) from None


def delay_spec_error(message: str) -> str:
    """What is wrong with a delay spec, from the native parser's message (its 'invalid delay spec ...' prefix off).

    The native message has one form, "delaycomm: invalid delay spec 'TEXT': WHY" (csrc/delay/DelaySpec.hpp); the
    caller names the option (or argument) and the value itself.
    """
    m = re.match(r"delaycomm: invalid delay spec '(?:[^'\\]|\\.)*': (.*)\Z", message, re.DOTALL)
    return m.group(1) if m else message.removeprefix("delaycomm: ")


def _parse_ranks(v: Any) -> tuple[int, ...] | None:
    accepted = f"'all' or a list of ranks in [0, {MAX_RANK}] such as '0' or '0,3'"
    if isinstance(v, str):
        s = v.strip().lower()
        if s == "all":
            return None
        items: list[Any] = [p.strip() for p in s.split(",")]
    elif isinstance(v, int) and not isinstance(v, bool):
        items = [v]
    elif isinstance(v, Iterable):
        items = list(v)
    else:
        raise _Invalid(accepted)
    if not items:
        raise _Invalid(accepted)
    return tuple(sorted({_rank(r, accepted) for r in items}))  # a repeated rank means the same: no conflict


def _parse_ops(v: Any) -> tuple[str, ...] | None:
    accepted = "'all' or a comma-separated list of: " + ", ".join(DELAYABLE_OPS)
    if isinstance(v, str):
        if v.strip().lower() == "all":
            return None
        names = [p.strip().lower() for p in v.split(",")]
    elif isinstance(v, Iterable):
        names = list(v)
        if any(not isinstance(n, str) for n in names):
            raise _Invalid(accepted)
        names = [n.strip().lower() for n in names]
    else:
        raise _Invalid(accepted)
    out = []
    for n in names:
        op = _ops.canonical(n)
        if op not in DELAYABLE_OPS:
            raise _Invalid(accepted)
        out.append(op)
    if not out:
        raise _Invalid(accepted)
    return tuple(sorted(set(out)))


def _parse_choice(*choices: str) -> Callable[[Any], str]:
    accepted = "one of " + ", ".join(repr(c) for c in choices)

    def parse(v: Any) -> str:
        if not isinstance(v, str) or v.strip().lower() not in choices:
            raise _Invalid(accepted)
        return v.strip().lower()

    return parse


def _parse_flag(v: Any) -> bool:
    """A switch: True/False, 1/0, or the strings 1, 0, true, false, yes, no, on, off (any case)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    text = v.strip().lower() if isinstance(v, str) else None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise _Invalid("0 or 1 (also true/false, yes/no, on/off)")


MAX_DELAY_BURST = 1e12  # mean burst length in calls; far beyond any job, and exact in a double


def _parse_delay_burst(v: Any) -> float | None:
    """delay_burst: 'none' (calls delayed independently) or the mean burst length in calls (docs/delay.md)."""
    accepted = (
        f"'none' (each call delayed independently) or the mean length of a burst of delayed calls, a number of "
        f"calls in [1, {MAX_DELAY_BURST:g}] such as 50"
    )
    if isinstance(v, str) and v.strip().lower() == "none":
        return None
    return _parse_float(1.0, MAX_DELAY_BURST, False, False, accepted)(v)


def _check_delay_burst(values: dict[str, Any], origins: dict[str, str], raw: Any) -> None:
    """A burst is at least the mean run of independent draws at delay_fraction (the native bound, one source)."""
    burst, fraction = values["delay_burst"], values["delay_fraction"]
    if burst is None or values["delay"] == "none" or not 0.0 < fraction < 1.0:
        return
    from delaycomm import _C

    shortest = _C.DelaySchedule.min_burst(fraction)
    if burst < shortest * (1.0 - 1e-12):
        raise _invalid(
            _BY_NAME["delay_burst"],
            raw,
            origins["delay_burst"],
            f"expected a mean burst length of at least 1 / (1 - delay_fraction) = {shortest:.6g} calls at "
            f"delay_fraction={fraction:g} (that length is independent draws; bursts are longer), or 'none'",
        )


def _parse_slowdown(v: Any) -> tuple[tuple[int, float], ...]:
    accepted = (
        f"'none' or RANK:FACTORx entries such as '0:4x' or '0:4x,2:1.5x' (each rank once, a factor in "
        f"[1, {MAX_SLOWDOWN:g}])"
    )
    factor_of = _parse_float(1.0, MAX_SLOWDOWN, False, False, accepted)
    if isinstance(v, Mapping):
        items = list(v.items())
    elif isinstance(v, str):
        s = v.strip().lower()
        if s == "none":
            return ()
        items = []
        for part in s.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*:\s*([^x\s]+)\s*x?\s*", part)
            if not m:
                raise _Invalid(accepted)
            items.append((m.group(1), m.group(2)))
    else:
        raise _Invalid(accepted)
    out: dict[int, float] = {}
    for rank, factor in items:
        r = _rank(rank, accepted)
        if r in out:
            raise _Invalid(accepted, f"rank {r} is given twice")
        out[r] = factor_of(factor)
    return tuple(sorted(out.items()))


class Staleness(str):
    """A canonical ``staleness`` value (``'bsp'``, ``'ssp:2'``, ``'asp'``: a str, as shown and agreed) with its
    parsed parts: ``mode`` (bsp, ssp or asp) and ``bound`` (S of ssp:S; 0 otherwise)."""

    mode: str
    bound: int

    def __new__(cls, mode: str, bound: int = 0) -> Staleness:
        self = super().__new__(cls, f"ssp:{bound}" if mode == "ssp" else mode)
        self.mode, self.bound = mode, bound
        return self

    def __getnewargs__(self) -> tuple[str, int]:  # type: ignore[override]
        return (self.mode, self.bound)


def _parse_staleness(v: Any) -> Staleness:
    accepted = f"'bsp', 'ssp:S' with an integer S in [0, {MAX_SSP_BOUND}], or 'asp'"
    if not isinstance(v, str):
        raise _Invalid(accepted)
    s = v.strip().lower()
    if s in ("bsp", "asp"):
        return Staleness(s)
    m = re.fullmatch(r"ssp\s*:\s*(\d{1,30})", s)
    if not m or int(m.group(1)) > MAX_SSP_BOUND:
        raise _Invalid(accepted)
    bound = int(m.group(1))
    return Staleness("bsp") if bound == 0 else Staleness("ssp", bound)


def _parse_step_ms(v: Any) -> float | None:
    accepted = (
        f"'auto' (calibrated at init) or a number of milliseconds in [{MIN_STEP_MS:g}, {MAX_STEP_MS:.0f}] "
        "(1 us to 24 h)"
    )
    if isinstance(v, str) and v.strip().lower() == "auto":
        return None
    return _parse_float(MIN_STEP_MS, MAX_STEP_MS, False, False, accepted)(v)


def _parse_nccl_algo(v: Any) -> str:
    accepted = (
        "'auto' (leave NCCL's tuner alone) or an NCCL_ALGO value such as 'allreduce:tree', 'ring', "
        "'allreduce:tree;broadcast:ring' (algorithms: " + ", ".join(sorted(_NCCL_ALGOS)) + ")"
    )
    if not isinstance(v, str) or not v.strip():
        raise _Invalid(accepted)
    s = v.strip()
    if s.lower() == "auto":
        return "auto"

    def algos_ok(text: str) -> bool:
        text = text[1:] if text.startswith("^") else text
        names = [a.strip().lower() for a in text.split(",")]
        return bool(names) and all(n in _NCCL_ALGOS for n in names)

    if ":" in s:
        for clause in s.split(";"):
            op, sep, algos = clause.partition(":")
            if not sep or op.strip().lower() not in _NCCL_ALGO_OPS or not algos_ok(algos.strip()):
                raise _Invalid(accepted)
    elif not algos_ok(s):
        raise _Invalid(accepted)
    return s


def _parse_bytes(v: Any) -> int:
    accepted = (
        "a number of bytes in [1, 1GiB], optionally with K/M/G (KiB/MiB/GiB) such as 2097152 or '2MiB' "
        "(NCCL keeps it in a C int)"
    )
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise _Invalid(accepted)
    try:
        return units.parse_size(str(v), max_bytes=MAX_NCCL_BUFFSIZE)
    except ValueError:
        raise _Invalid(accepted) from None


STATS_FIELDS = ("rank", "group", "restart")
_STATS_ACCEPTED = (
    "'none', a directory (one JSON file per rank and group in it), or a JSON file path whose "
    "placeholders {rank}, {group} and {restart} name the rank, the group and torchrun's restart (see "
    "docs/config.md, 'Stats files')"
)


def _path_or_none(v: Any, accepted: str) -> str | None:
    """A path option's value: a path (str or PathLike, stripped), or None for ``'none'``."""
    if isinstance(v, os.PathLike):
        v = os.fspath(v)
    if not isinstance(v, str):
        raise _Invalid(accepted)
    s = v.strip()
    return None if s.lower() == "none" else s


def _parse_trace(v: Any) -> str | None:
    """The DELAYCOMM_TRACE path template ({rank}, {restart}); its directory must exist (docs/telemetry.md)."""
    accepted = "'none' or a JSON file path, {rank} for the global rank (docs/telemetry.md, 'Timeline')"
    s = _path_or_none(v, accepted)
    if s is None:
        return None
    if "\0" in s or os.path.isdir(s) or s.endswith(os.sep):
        raise _Invalid(accepted, "a file path is expected")
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(s) if f is not None}
    except ValueError:
        raise _Invalid(accepted, "unbalanced braces (write {{ and }} for literal ones)") from None
    if fields - {"rank", "restart"}:
        raise _Invalid(accepted, f"unknown placeholder(s) {', '.join(sorted(fields - {'rank', 'restart'}))}")
    directory = os.path.dirname(os.path.abspath(s))
    if "{" not in directory and not os.path.isdir(directory):
        raise _Invalid(accepted, f"the directory {directory!r} does not exist")
    return s


def _parse_stats(v: Any) -> str | None:
    """The stats path template; checked for its form here, for writability when a group is created."""
    s = _path_or_none(v, _STATS_ACCEPTED)
    if s is None:
        return None
    if "\0" in s:
        raise _Invalid(_STATS_ACCEPTED, f"the path has a NUL byte (at character {s.index(chr(0)) + 1})")
    try:
        parts = list(string.Formatter().parse(s))
    except ValueError:
        raise _Invalid(_STATS_ACCEPTED, "unbalanced braces (write {{ and }} for literal ones)") from None
    for _, field, spec, conv in parts:
        if field is not None and (field not in STATS_FIELDS or spec or conv):
            raise _Invalid(
                _STATS_ACCEPTED,
                f"unknown placeholder {{{field}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}",
            )
    # 'r{rank}/../stats.json' is 'stats.json' for every rank: a placeholder that '..' cancels names nothing.
    kept = {f for _, f, _, _ in string.Formatter().parse(os.path.normpath(s)) if f is not None}
    cancelled = sorted({f for _, f, _, _ in parts if f is not None} - kept)
    if cancelled:
        raise _Invalid(
            _STATS_ACCEPTED,
            f"'..' cancels the directory that holds {', '.join('{' + f + '}' for f in cancelled)} (the path is "
            f"{os.path.normpath(s)!r} whatever the value), so the files would collide",
        )
    # A directory, or the directory of a file, that has no placeholder must exist now; the rest (placeholders
    # filled, writable) is checked when a group is created (_stats.file.target).
    if os.path.isdir(s) or s.endswith(os.sep):
        if "{" not in s and not os.path.isdir(s):
            raise _Invalid(_STATS_ACCEPTED, f"the directory {s!r} does not exist")
        return s
    if "{" not in os.path.dirname(s):
        directory = os.path.dirname(os.path.abspath(s))
        if not os.path.isdir(directory):
            raise _Invalid(_STATS_ACCEPTED, f"the directory {directory!r} does not exist")
    return s


def restart_count() -> int:
    """torchrun's restart count of this worker (0 outside torchrun)."""
    try:
        return max(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), 0)
    except ValueError:
        return 0


def stats_file(
    template: str, rank: int, group: str, world_size: int, default_group: bool, restart: int = 0, cycle: int = 0
) -> str:
    """The stats file of (rank, group) for a ``stats`` template (docs/config.md, "Stats files").

    A directory D stands for ``D/stats.json``. ``{rank}`` is the global rank, ``{group}`` the group's name and
    ``{restart}`` torchrun's restart count; where a template lacks one, it is added before the extension:
    ``.group{G}`` for groups other than the default one, ``.rank{R}`` in jobs of more than one rank,
    ``.restart{N}`` after a restart (N > 0). ``.cycle{C}`` marks the C-th repeated use of one file by one process
    (a second init/destroy cycle). So no two ranks, groups, restarts or cycles of a job write the same file.
    """
    if template.endswith(os.sep) or os.path.isdir(template):
        template = os.path.join(template, "stats.json")
    root, ext = os.path.splitext(template)
    if "{group}" not in template and not default_group:
        root += ".group{group}"
    if "{rank}" not in template and world_size > 1:
        root += ".rank{rank}"
    if "{restart}" not in template and restart > 0:
        root += ".restart{restart}"
    if cycle > 0:
        root += f".cycle{cycle}"
    return (root + ext).format(rank=rank, group=group, restart=restart)


@dataclasses.dataclass(frozen=True)
class GroupView:
    """What a group's native options depend on besides the option values (docs/config.md, "Ranks").

    Attributes:
        rank: this rank in the group.
        members: the group's global ranks (None: the default group, whose ranks are global).
        every_rank: the group is every rank of the job, in order (it keeps ``seed`` as given).
    """

    rank: int
    members: tuple[int, ...] | None = None
    every_rank: bool = True

    @property
    def global_rank(self) -> int:
        return self.members[self.rank] if self.members is not None else self.rank

    def group_ranks(self, ranks: tuple[int, ...] | None) -> list[int]:
        """The group ranks of the members that global ``ranks`` name, for a native rank list (empty: all)."""
        if ranks is None or self.members is None:
            return list(ranks) if ranks is not None else []
        named = [i for i, r in enumerate(self.members) if r in ranks]
        return [] if len(named) == len(self.members) else named

    def names_a_member(self, ranks: tuple[int, ...] | None) -> bool:
        return ranks is None or self.members is None or any(r in ranks for r in self.members)


def group_seed(seed: int, members: Iterable[int]) -> int:
    """The seed of a group that is not every rank of the job: ``seed`` mixed with the group's global ranks
    (SHA-256, 63 bits), the same on every member (docs/config.md, "Ranks")."""
    digest = hashlib.sha256(json.dumps([seed, sorted(members)]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclasses.dataclass(frozen=True)
class Native:
    """Where an option goes in the native delay options (``DelayOptions``, csrc/delay/DelayOptions.hpp): the field,
    and its value there, from the resolved config (:class:`EffectiveConfig`: ``cfg["name"]`` is a value) and the
    group (:class:`GroupView`)."""

    field: str
    value: Callable[[EffectiveConfig, GroupView], Any]


def _enum(kind: str, name: str) -> Callable[[EffectiveConfig, GroupView], Any]:
    """An option whose value is a member of the native enum ``kind`` (DelayWhere, DelayMode), by name."""

    def value(values: EffectiveConfig, group: GroupView) -> Any:
        from delaycomm import _C

        return getattr(_C, kind).__members__[values[name].upper()]

    return value


def _native_mode(cfg: EffectiveConfig, group: GroupView) -> Any:
    # delay_mode=auto resolved to match (a profile): match where it can time this machine's own latency, on CPU ops;
    # cuda ops get the whole target added, warned once per op (docs/delay.md, "Match mode"). An explicit match
    # keeps its error on cuda ops.
    from delaycomm import _C

    if cfg["delay_mode"] == "match" and "delay_mode" in cfg.auto:
        return _C.DelayMode.MATCH_CPU
    return _enum("DelayMode", "delay_mode")(cfg, group)


def _native_fraction(values: EffectiveConfig, group: GroupView) -> float:
    # No delay, or no member of this group named by delay_ranks: nothing is delayed in this group.
    if values["delay"] == "none" or not group.names_a_member(values["delay_ranks"]):
        return 0.0
    return values["delay_fraction"]


def _native_seed(values: EffectiveConfig, group: GroupView) -> int:
    # Two disjoint subgroups with one seed must not delay in lockstep (docs/config.md, "Ranks").
    if group.every_rank or group.members is None:
        return values["seed"]
    return group_seed(values["seed"], group.members)


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: its name, parser, default (a raw value, parsed like any other), description, whether every rank
    of a group must give it the same value (checked when the group is created; docs/config.md), and, for the delay
    options, where its value goes in the native options (:class:`Native`)."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    must_match: bool = True
    native: Native | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option(
        "delay",
        _parse_delay,
        "none",
        "delay distribution: exp:p99=400ms, exp:mean=400ms, lognormal:p50=60ms,p99=400ms, "
        "pareto:p50=..,p99=.., const:50ms, trace:FILE, profile:FILE (docs/profile.md), none",
        native=Native("spec", lambda v, g: v["delay"].spec),
    ),
    Option(
        "delay_fraction",
        _parse_float(0.0, 1.0, False, False),
        None,
        "fraction of calls that are delayed, in [0, 1] (0.3 when a delay is set; 1 for profile:FILE)",
        native=Native("fraction", _native_fraction),
    ),
    Option(
        "delay_ranks",
        _parse_ranks,
        "all",
        "ranks that are delayed: all, or a list such as 0 or 0,3",
        native=Native("ranks", lambda v, g: g.group_ranks(v["delay_ranks"])),
    ),
    Option(
        "delay_ops",
        _parse_ops,
        "all",
        "collectives that are delayed: all, or a list such as allreduce,broadcast",
        native=Native("ops", lambda v, g: [_ops.BY_NAME[n].kind for n in v["delay_ops"] or ()]),
    ),
    Option(
        "delay_where",
        _parse_choice("network", "host"),
        "network",
        "network: the op's completion is delayed (the caller goes on); host: the calling thread blocks",
        native=Native("where", _enum("DelayWhere", "delay_where")),
    ),
    Option(
        "delay_mode",
        _parse_choice("add", "match", "auto"),
        "auto",
        "add: the delay is added to the op's own latency; match: only what the call needs on top of this "
        "machine's own latency is added, so that the call's latency follows the distribution (docs/delay.md); "
        "auto: match for profile:FILE (on CPU ops; cuda ops, which match cannot time, add, with a warning), add "
        "otherwise",
        native=Native("mode", _native_mode),
    ),
    Option(
        "delay_carrier",
        _parse_choice("all", "one", "auto"),
        "auto",
        "all: every targeted rank draws its own delay of a call; one: one targeted rank per call, drawn from the "
        "schedule, carries it (the call follows one draw); auto: one for profile:FILE, all otherwise",
        native=Native("one_carrier", lambda v, g: v["delay_carrier"] == "one"),
    ),
    Option(
        "delay_place",
        _parse_choice("step", "call"),
        "step",
        "under delay_mode=match: step: a call issued while an earlier call's target is still running draws at that "
        "call's draw, so that it experiences its own target and not the largest of its step's (docs/delay.md, "
        '"Replay into another job"); call: every call its own draw',
        native=Native("place_step", lambda v, g: v["delay_place"] == "step"),
    ),
    Option(
        "delay_burst",
        _parse_delay_burst,
        "none",
        "none (each call delayed independently), or the mean length in calls of a burst of delayed calls of a rank "
        "(at least 1 / (1 - delay_fraction))",
        native=Native("burst", lambda v, g: v["delay_burst"] or 0.0),
    ),
    Option(
        "slowdown",
        _parse_slowdown,
        "none",
        f"per-rank compute slowdown such as 0:4x (rank 0 runs 4x slower), factor in [1, {MAX_SLOWDOWN:g}]",
        native=Native("slowdown", lambda v, g: dict(v["slowdown"]).get(g.global_rank, 1.0)),
    ),
    Option(
        "seed",
        _parse_int(0, 2**63 - 1, "an integer in [0, 2^63)"),
        0,
        "seed of the delay schedule (a pure function of seed, rank and op sequence)",
        native=Native("seed", _native_seed),
    ),
    Option("staleness", _parse_staleness, "bsp", f"consistency: bsp, ssp:S (S <= {MAX_SSP_BOUND}), asp"),
    Option(
        "stale_policy", _parse_choice("ema", "apply", "drop"), "ema", "what a late contribution does: ema, apply, drop"
    ),
    Option("ema_alpha", _parse_float(0.0, 1.0, True, False), 0.1, "blend weight of stale contributions, in (0, 1]"),
    Option("step_ms", _parse_step_ms, "auto", "nominal step time that turns a delay into steps of staleness"),
    Option(
        "max_pending",
        _parse_int(1, 1 << 20, "an integer in [1, 1048576]"),
        64,
        "under asp: most deferred contributions per key before an error",
    ),
    Option(
        "update_stats",
        _parse_flag,
        "0",
        "1: measure, per rank and stale step, the contribution sent against the BSP one (stats()['staleness']"
        "['update']; an extra pass per stale step, docs/telemetry.md)",
    ),
    Option(
        "stale_check",
        _parse_flag,
        "0",
        "1: check per parameter, at every flush and at the step after it, that what the optimizer consumed plus "
        'what is pending equals what bsp would have delivered (docs/staleness.md, "The check")',
    ),
    Option(
        "nccl_algo", _parse_nccl_algo, "allreduce:tree", "NCCL_ALGO to set before NCCL starts; auto leaves it alone"
    ),
    Option("nccl_buffsize", _parse_bytes, 2097152, "NCCL_BUFFSIZE in bytes to set before NCCL starts"),
    Option(
        "stats",
        _parse_stats,
        "none",
        "where each rank writes its groups' stats as JSON when they are destroyed: a file ({rank}, {group}) or "
        "a directory",
        must_match=False,
    ),
    # --- DELAYCOMM_TRACE: the job's timeline (docs/telemetry.md, "Timeline"; delaycomm/timeline.py) ---
    Option(
        "trace",
        _parse_trace,
        "none",
        "where each rank writes its timeline of calls, delays and stale decisions (Chrome trace JSON, {rank}); "
        "python -m delaycomm timeline merges the ranks'",
        must_match=False,
    ),
    Option(
        "trace_events",
        _parse_int(1, 1 << 26, "an integer in [1, 67108864]"),
        100000,
        "records the timeline keeps per rank: the newest (a ring buffer; about 100 bytes each in memory)",
        must_match=False,
    ),
)
_BY_NAME = {o.name: o for o in OPTIONS}


def shorten(text: str, limit: int = 200) -> str:
    """``text``, or its start and end with the middle left out when it is longer than ``limit``: a 1 MB value
    stays out of messages that every rank prints, and what follows it (what is accepted) stays in."""
    if len(text) <= limit:
        return text
    head, tail = limit * 3 // 4, limit // 4
    return f"{text[:head]}...[{len(text) - head - tail} of {len(text)} characters left out]...{text[-tail:]}"


def _invalid(opt: Option, value: Any, origin: str, why: str) -> ValueError:
    """The one format of a bad value: the value, the option, where the value came from, what is wrong/accepted."""
    return ValueError(
        f"delaycomm: invalid value {shorten(repr(value))} for option '{opt.name}' from {origin}: {shorten(why, 1000)}"
    )


def invalid_value(name: str, value: Any, origin: str, why: str) -> ValueError:
    """The ValueError for a bad value of option ``name`` found after resolution (e.g. once the group is known)."""
    return _invalid(_BY_NAME[name], value, origin, why)


def env_origin(opt: Option) -> str:
    return f"the environment variable {opt.env}"


def _keyword_origin(opt: Option, call: str) -> str:
    return f"the keyword {opt.name}= of {call}"


def _parse_option(opt: Option, value: Any, origin: str) -> Any:
    if isinstance(value, (str, os.PathLike)) and not os.fspath(value).strip():
        # An empty value is a mistake for every option (leaving it unset is how to ask for the default).
        raise _invalid(opt, value, origin, "the value is empty (leave the option unset for its default)")
    try:
        return opt.parse(value)
    except _Invalid as e:
        raise _invalid(opt, value, origin, e.why) from None


class DelayConfig:
    """Options of a delaycomm process group, given as keywords.

    Pass it as ``pg_options=`` to ``init_process_group``/``new_group``, or set it process-wide with
    :func:`configure`. Options left out fall back to the environment (``DELAYCOMM_<NAME>``), then to their
    defaults. Each keyword is checked, and parsed, at once: a ``delay`` that names a trace or a profile file reads
    it here, once, and every group created with this config replays what was read then.

    Args:
        **options: any of the option names in ``delaycomm.OPTIONS`` (``python -m delaycomm config`` lists them).

    Raises:
        ValueError: an unknown option, or a value the option does not accept.
    """

    def __init__(self, **options: Any) -> None:
        self._given: dict[str, Any] = {}
        self._origins: dict[str, str] = {}  # name -> where the value came from, for messages
        # name -> the parsed value: a keyword is parsed once, here (a delay spec's file read once), and resolve()
        # uses it (the values are immutable).
        self._parsed: dict[str, Any] = {}
        self._set(options, "DelayConfig")

    def _set(self, options: Mapping[str, Any], call: str) -> None:
        unknown = sorted(set(options) - set(_BY_NAME))
        if unknown:
            raise ValueError(
                f"delaycomm: unknown option(s) {', '.join(unknown)} given to {call}; accepted: {', '.join(_BY_NAME)}"
            )
        for name, value in options.items():
            if value is None:
                continue
            origin = _keyword_origin(_BY_NAME[name], call)
            self._parsed[name] = _parse_option(_BY_NAME[name], value, origin)
            self._given[name] = value
            self._origins[name] = origin

    @property
    def given(self) -> dict[str, Any]:
        """The keywords that were set (raw values)."""
        return dict(self._given)

    def merged(self, other: DelayConfig | None) -> DelayConfig:
        """A config with ``other``'s keywords on top of this one's."""
        out = DelayConfig()
        out._given = {**self._given, **(other._given if other else {})}
        out._origins = {**self._origins, **(other._origins if other else {})}
        out._parsed = {**self._parsed, **(other._parsed if other else {})}
        return out

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._given.items())
        return f"DelayConfig({inner})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DelayConfig) and other._given == self._given


@dataclasses.dataclass(frozen=True)
class EffectiveConfig:
    """The resolved options of one process group, with where each value came from.

    ``sources`` says it briefly ("keyword", "environment (DELAYCOMM_SEED)", "default"); ``origins`` in the words of
    error messages ("the environment variable DELAYCOMM_SEED").
    """

    values: dict[str, Any]
    sources: dict[str, str]
    origins: dict[str, str] = dataclasses.field(default_factory=dict)
    # The options whose value was ``auto``, resolved here (delay_mode, delay_carrier): ``values`` holds what they
    # resolved to. delay_mode=auto resolved to match is not quite an explicit match (cuda ops: _native_mode).
    auto: frozenset[str] = frozenset()

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly values."""
        out = {}
        for k, v in self.values.items():
            out[k] = list(v) if isinstance(v, tuple) else v
        return out


_process_config = DelayConfig()
_process_lock = threading.Lock()


def configure(**options: Any) -> None:
    """Set options process-wide (below ``pg_options=``, above the environment). ``configure()`` clears them.

    Args:
        **options: as :class:`DelayConfig`.

    Raises:
        ValueError: as :class:`DelayConfig`.
    """
    global _process_config
    cfg = DelayConfig()
    cfg._set(options, "delaycomm.configure()")
    with _process_lock:
        _process_config = cfg if options else DelayConfig()


def resolve(config: DelayConfig | None = None, env: Mapping[str, str] | None = None) -> EffectiveConfig:
    """Resolve every option: ``config`` keywords > :func:`configure` > environment > default.

    Args:
        config: per-group keywords (``pg_options``), or None.
        env: the environment to read (default ``os.environ``).

    Returns:
        The effective config.

    Raises:
        ValueError: a bad value, naming the value, the option, where the value came from and what is accepted;
            also an unknown ``DELAYCOMM_*`` variable (a typo would otherwise be ignored silently).
    """
    env = os.environ if env is None else env
    if config is not None and not isinstance(config, DelayConfig):
        raise ValueError(f"delaycomm: pg_options must be a delaycomm.DelayConfig, got {type(config).__name__}")
    with _process_lock:
        merged = _process_config.merged(config)
    known_env = {o.env for o in OPTIONS} | {ENV_PREFIX + "LOG_LEVEL"}
    typos = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known_env)
    if typos:
        raise ValueError(
            f"delaycomm: unknown environment variable(s) {', '.join(typos)}; accepted: " + ", ".join(sorted(known_env))
        )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    origins: dict[str, str] = {}
    for opt in OPTIONS:
        if opt.name in merged.given:
            sources[opt.name] = "keyword"
            origins[opt.name] = merged._origins[opt.name]
            values[opt.name] = merged._parsed[opt.name]  # parsed when the keyword was given
        elif opt.env in env:
            sources[opt.name] = f"environment ({opt.env})"
            origins[opt.name] = env_origin(opt)
            values[opt.name] = _parse_option(opt, env[opt.env], origins[opt.name])
        else:
            sources[opt.name] = "default"
            origins[opt.name] = "the default"
            values[opt.name] = opt.parse(opt.default) if opt.default is not None else None
    if values["delay_fraction"] is None:
        # A profile is the distribution of every call (docs/profile.md): by default every call draws from it.
        delay = values["delay"]
        values["delay_fraction"] = 0.0 if delay == "none" else 1.0 if delay.spec.family == "profile" else 0.3
    # A profile holds the latency callers experienced per (op, size class): one draw per call, matched on top of
    # this machine's own latency, replays it (docs/profile.md, "Replay"). Options given explicitly stay as given.
    profile = values["delay"] != "none" and values["delay"].spec.family == "profile"
    auto = frozenset(name for name in ("delay_mode", "delay_carrier") if values[name] == "auto")
    if values["delay_mode"] == "auto":
        values["delay_mode"] = "match" if profile else "add"
    if values["delay_carrier"] == "auto":
        values["delay_carrier"] = "one" if profile else "all"
    for name in auto:
        sources[name] += " (auto)"
    burst = _BY_NAME["delay_burst"]
    _check_delay_burst(values, origins, merged.given.get(burst.name, env.get(burst.env)))
    return EffectiveConfig(values=values, sources=sources, origins=origins, auto=auto)


def format_value(name: str, value: Any) -> str:
    """An option's resolved value as its canonical spec string (what the environment variable would say)."""
    if value is None:
        return {"delay_ranks": "all", "delay_ops": "all", "step_ms": "auto", "stats": "none"}.get(name, "none")
    if name == "delay_burst":
        return repr(value).removesuffix(".0")
    if name == "slowdown":
        return ",".join(f"{r}:{repr(f).removesuffix('.0')}x" for r, f in value) or "none"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)
