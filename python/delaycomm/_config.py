"""Options of the delaycomm backend: one table, three sources (keyword > environment > default), strict checks.

Every option is a keyword of :class:`DelayConfig` and an environment variable ``DELAYCOMM_<NAME>``. A bad value
raises :class:`ValueError` naming the option, its variable, the value and what is accepted.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["DelayConfig", "EffectiveConfig", "configure", "resolve", "format_value", "OPTIONS", "DELAYABLE_OPS"]

ENV_PREFIX = "DELAYCOMM_"

# Op names as the backend counts them (csrc/stats/OpStats.cpp) plus the names of torch.distributed's functions.
DELAYABLE_OPS = (
    "broadcast", "allreduce", "allreduce_coalesced", "reduce", "allgather", "_allgather_base",
    "allgather_coalesced", "allgather_into_tensor_coalesced", "gather", "scatter", "reduce_scatter",
    "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "alltoall_base", "alltoall", "send", "recv",
    "recv_anysource", "barrier",
)
_OP_ALIASES = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "all_gather_into_tensor": "_allgather_base",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "all_to_all": "alltoall",
    "all_to_all_single": "alltoall_base",
    "isend": "send",
    "irecv": "recv",
}
_NCCL_ALGOS = {"tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"}
_NCCL_ALGO_OPS = {"allreduce", "broadcast", "reduce", "allgather", "reducescatter", "sendrecv"}


class _Invalid(Exception):
    """Raised by a parser with the text 'expected ...' (what is accepted); wrapped into ValueError."""


# ------------------------------------------------------------------------------------------------------------------
# Parsers: value (str from the environment, or the keyword's type) -> canonical value, or _Invalid("expected ...").


def _parse_float(lo: float, hi: float, lo_open: bool, hi_open: bool) -> Callable[[Any], float]:
    lb = "(" if lo_open else "["
    rb = ")" if hi_open else "]"
    accepted = f"a number in {lb}{lo:g}, {hi:g}{rb}"

    def parse(v: Any) -> float:
        if isinstance(v, bool):
            raise _Invalid(accepted)
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise _Invalid(accepted) from None
        if math.isnan(x) or x < lo or x > hi or (lo_open and x == lo) or (hi_open and x == hi):
            raise _Invalid(accepted)
        return x

    return parse


def _parse_int(lo: int, hi: int | None, accepted: str) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        if isinstance(v, bool):
            raise _Invalid(accepted)
        if isinstance(v, int):
            x = v
        elif isinstance(v, str) and re.fullmatch(r"\s*[+]?\d+\s*", v):
            x = int(v)
        else:
            raise _Invalid(accepted)
        if x < lo or (hi is not None and x > hi):
            raise _Invalid(accepted)
        return x

    return parse


def _parse_delay(v: Any) -> str:
    if not isinstance(v, str):
        raise _Invalid("a delay spec string such as 'exp:p99=400ms' (see `python -m delaycomm config --help`)")
    text = v.strip()
    if text.lower() in ("", "none", "off", "0"):
        return "none"
    from delaycomm import _C

    try:
        _C.parse_delay_spec(text)
    except ValueError as e:
        raise _Invalid(str(e)) from None
    return text


def _parse_ranks(v: Any) -> tuple[int, ...] | None:
    accepted = "'all' or a list of ranks such as '0' or '0,3'"
    if isinstance(v, str):
        s = v.strip().lower()
        if s == "all":
            return None
        parts = [p.strip() for p in s.split(",")]
        if not parts or any(not re.fullmatch(r"\d+", p) for p in parts):
            raise _Invalid(accepted)
        ranks = [int(p) for p in parts]
    elif isinstance(v, int) and not isinstance(v, bool):
        ranks = [v]
    elif isinstance(v, Iterable):
        ranks = list(v)
        if not ranks or any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in ranks):
            raise _Invalid(accepted)
    else:
        raise _Invalid(accepted)
    if any(r < 0 for r in ranks):
        raise _Invalid(accepted)
    return tuple(sorted(set(ranks)))


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
        n = _OP_ALIASES.get(n, n)
        if n not in DELAYABLE_OPS:
            raise _Invalid(accepted)
        out.append(n)
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


def _parse_slowdown(v: Any) -> tuple[tuple[int, float], ...]:
    accepted = "'none' or RANK:FACTORx entries such as '0:4x' or '0:4x,2:1.5x' (factor >= 1)"
    if isinstance(v, Mapping):
        items = list(v.items())
    elif isinstance(v, str):
        s = v.strip().lower()
        if s in ("", "none"):
            return ()
        items = []
        for part in s.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*:\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*x?\s*", part)
            if not m:
                raise _Invalid(accepted)
            items.append((int(m.group(1)), float(m.group(2))))
    else:
        raise _Invalid(accepted)
    out = {}
    for rank, factor in items:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise _Invalid(accepted)
        try:
            factor = float(factor)
        except (TypeError, ValueError):
            raise _Invalid(accepted) from None
        if not math.isfinite(factor) or factor < 1.0:
            raise _Invalid(accepted)
        out[rank] = factor
    return tuple(sorted(out.items()))


def _parse_staleness(v: Any) -> str:
    accepted = "'bsp', 'ssp:S' with an integer S >= 0, or 'asp'"
    if not isinstance(v, str):
        raise _Invalid(accepted)
    s = v.strip().lower()
    if s in ("bsp", "asp"):
        return s
    m = re.fullmatch(r"ssp:(\d+)", s)
    if not m:
        raise _Invalid(accepted)
    bound = int(m.group(1))
    return "bsp" if bound == 0 else f"ssp:{bound}"


def _parse_step_ms(v: Any) -> float | None:
    accepted = "'auto' (calibrated at init) or a number of milliseconds > 0"
    if isinstance(v, str) and v.strip().lower() == "auto":
        return None
    try:
        return _parse_float(0.0, math.inf, True, True)(v)
    except _Invalid:
        raise _Invalid(accepted) from None


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


_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}


def _parse_bytes(v: Any) -> int:
    accepted = "a positive number of bytes, optionally with K/M/G (KiB/MiB/GiB) such as 2097152 or '2MiB'"
    if isinstance(v, bool):
        raise _Invalid(accepted)
    if isinstance(v, int):
        n = v
    elif isinstance(v, str):
        m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", v)
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise _Invalid(accepted)
        n = int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    else:
        raise _Invalid(accepted)
    if n <= 0 or n > (1 << 40):
        raise _Invalid(accepted)
    return n


def _parse_path(v: Any) -> str | None:
    accepted = "'none' or a path to a JSON file in an existing directory"
    if isinstance(v, os.PathLike):
        v = os.fspath(v)
    if not isinstance(v, str):
        raise _Invalid(accepted)
    s = v.strip()
    if s.lower() in ("", "none"):
        return None
    parent = os.path.dirname(os.path.abspath(s)) or "."
    if not os.path.isdir(parent) or os.path.isdir(s):
        raise _Invalid(accepted)
    return s


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: its name, parser, default (a raw value, parsed like any other) and description."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("delay", _parse_delay, "none",
           "delay distribution: exp:p99=400ms, exp:mean=400ms, lognormal:p50=60ms,p99=400ms, "
           "pareto:p50=..,p99=.., const:50ms, trace:FILE, none"),
    Option("delay_fraction", _parse_float(0.0, 1.0, False, False), None,
           "fraction of calls that are delayed, in [0, 1] (0.3 when a delay is set)"),
    Option("delay_ranks", _parse_ranks, "all", "ranks that are delayed: all, or a list such as 0 or 0,3"),
    Option("delay_ops", _parse_ops, "all", "collectives that are delayed: all, or a list such as allreduce,broadcast"),
    Option("delay_where", _parse_choice("network", "host"), "network",
           "network: the op's completion is delayed (the caller goes on); host: the calling thread blocks"),
    Option("slowdown", _parse_slowdown, "none", "per-rank compute slowdown such as 0:4x (rank 0 runs 4x slower)"),
    Option("seed", _parse_int(0, 2**63 - 1, "an integer in [0, 2^63)"), 0,
           "seed of the delay schedule (a pure function of seed, rank and op sequence)"),
    Option("staleness", _parse_staleness, "bsp", "consistency: bsp, ssp:S, asp"),
    Option("stale_policy", _parse_choice("ema", "apply", "drop"), "ema", "what a late contribution does: ema, apply, drop"),
    Option("ema_alpha", _parse_float(0.0, 1.0, True, False), 0.1, "blend weight of stale contributions, in (0, 1]"),
    Option("step_ms", _parse_step_ms, "auto", "nominal step time that turns a delay into steps of staleness"),
    Option("max_pending", _parse_int(1, 1 << 20, "an integer in [1, 1048576]"), 64,
           "under asp: most deferred contributions per key before an error"),
    Option("nccl_algo", _parse_nccl_algo, "allreduce:tree", "NCCL_ALGO to set before NCCL starts; auto leaves it alone"),
    Option("nccl_buffsize", _parse_bytes, 2097152, "NCCL_BUFFSIZE in bytes to set before NCCL starts"),
    Option("stats", _parse_path, "none", "path: write the group's stats as JSON when it is destroyed"),
)
_BY_NAME = {o.name: o for o in OPTIONS}


def _invalid(opt: Option, value: Any, source: str, why: str) -> ValueError:
    return ValueError(
        f"delaycomm: invalid value {value!r} for option '{opt.name}' (environment variable {opt.env}) "
        f"from {source}: expected {why}"
    )


def _parse_option(opt: Option, value: Any, source: str) -> Any:
    try:
        return opt.parse(value)
    except _Invalid as e:
        raise _invalid(opt, value, source, str(e)) from None


class DelayConfig:
    """Options of a delaycomm process group, given as keywords.

    Pass it as ``pg_options=`` to ``init_process_group``/``new_group``, or set it process-wide with
    :func:`configure`. Options left out fall back to the environment (``DELAYCOMM_<NAME>``), then to their
    defaults. Each keyword is checked at once.

    Args:
        **options: any of the option names in ``delaycomm.OPTIONS`` (``python -m delaycomm config`` lists them).

    Raises:
        ValueError: an unknown option, or a value the option does not accept.
    """

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(_BY_NAME))
        if unknown:
            raise ValueError(
                f"delaycomm: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(_BY_NAME)}"
            )
        self._given = {}
        for name, value in options.items():
            if value is None:
                continue
            _parse_option(_BY_NAME[name], value, "a keyword")
            self._given[name] = value

    @property
    def given(self) -> dict[str, Any]:
        """The keywords that were set (raw values)."""
        return dict(self._given)

    def merged(self, other: DelayConfig | None) -> DelayConfig:
        """A config with ``other``'s keywords on top of this one's."""
        out = DelayConfig()
        out._given = {**self._given, **(other._given if other else {})}
        return out

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._given.items())
        return f"DelayConfig({inner})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DelayConfig) and other._given == self._given


@dataclasses.dataclass(frozen=True)
class EffectiveConfig:
    """The resolved options of one process group, with where each value came from."""

    values: dict[str, Any]
    sources: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

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
    cfg = DelayConfig(**options)
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
        ValueError: a bad value, naming the option, its variable, the value and what is accepted; also an
            unknown ``DELAYCOMM_*`` variable (a typo would otherwise be ignored silently).
    """
    env = os.environ if env is None else env
    if config is not None and not isinstance(config, DelayConfig):
        raise ValueError(
            f"delaycomm: pg_options must be a delaycomm.DelayConfig, got {type(config).__name__}"
        )
    with _process_lock:
        merged = _process_config.merged(config)
    known_env = {o.env for o in OPTIONS} | {ENV_PREFIX + "LOG_LEVEL"}
    typos = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known_env)
    if typos:
        raise ValueError(
            f"delaycomm: unknown environment variable(s) {', '.join(typos)}; accepted: "
            + ", ".join(sorted(known_env))
        )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for opt in OPTIONS:
        if opt.name in merged.given:
            source = "keyword"
            values[opt.name] = _parse_option(opt, merged.given[opt.name], "a keyword")
        elif opt.env in env:
            source = f"environment ({opt.env})"
            values[opt.name] = _parse_option(opt, env[opt.env], f"the environment ({opt.env})")
        else:
            source = "default"
            values[opt.name] = opt.parse(opt.default) if opt.default is not None else None
        sources[opt.name] = source
    if values["delay_fraction"] is None:
        values["delay_fraction"] = 0.3 if values["delay"] != "none" else 0.0
        sources["delay_fraction"] = "default"
    return EffectiveConfig(values=values, sources=sources)


def format_value(name: str, value: Any) -> str:
    """An option's resolved value as its canonical spec string (what the environment variable would say)."""
    if value is None:
        return {"delay_ranks": "all", "delay_ops": "all", "step_ms": "auto", "stats": "none"}.get(name, "none")
    if name == "slowdown":
        return ",".join(f"{r}:{f:g}x" for r, f in value) or "none"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)
