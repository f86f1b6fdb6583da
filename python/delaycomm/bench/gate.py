"""The CI performance gates: did delaycomm get slower *relative to the raw backend*, beyond noise?

Both rules live here (docs/benchmark.md explains them for users): the per-call gate CI runs
(``python -m delaycomm.bench percall --compare``, :func:`compare_percall`) and the ratio gate of the collective sweep
(``python -m delaycomm.bench --compare``, :func:`compare`). They share what makes a gate trustworthy on a shared
machine:

- **Ratios, never absolute times.** Each figure is delaycomm's against the raw backend, both measured in the same
  processes in the same run, so a slower (or faster, or busier) machine moves both sides alike and the verdict does
  not change. The baseline contributes only its ratio.
- **A majority, not one sample** (:func:`majority_over`): an item fails when the median of its per-repeat (per-run)
  figures is above the limit *and* a strict majority of them are; one unlucky repeat cannot fail the gate.
- **It reproduces.** Failing items are measured again in fresh processes (``--confirm``, once by default) and fail
  only if they fail every time: a real regression reproduces, a burst of load rarely does.
- Exit 1 names every failing item with its figures; a baseline that cannot be compared (another device, setup, or
  nothing in common) is a :class:`GateError` (exit 2).

**The per-call gate** (one process, world size 1; :mod:`delaycomm.bench.percall`). Per run and (size, path):
regression = (this run's delaycomm/raw CPU-time ratio - the baseline's ratio) x this run's raw CPU cost per call, the
growth of delaycomm's cost in microseconds per call at this machine's speed. An item fails when the median over runs
and a majority of runs exceed ``max_added_us``.

**The ratio gate** (the sweep, 2+ ranks):

1. In each repeat of a run, ratio = p50(delaycomm) / p50(raw), both measured interleaved in the same processes.
2. For each (collective, size) the baseline contributes its median ratio, taken as at least 1 (delaycomm wraps
   the raw backend, so a baseline ratio below 1 is noise, and would make the limit stricter than meant).
   limit = max(1, baseline ratio) x max_slowdown.
3. A size fails when the median of this run's per-repeat ratios is above the limit in a majority of repeats, and
   again in each confirmation run (only when the bench spawned its own ranks: not under torchrun).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from delaycomm.bench import percall_results
from delaycomm.bench.results import RowStats, raw_label, row_stats
from delaycomm.bench.units import format_size

__all__ = [
    "GateError",
    "count_over",
    "majority_over",
    "DEFAULT_MAX_ADDED_US",
    "PercallVerdict",
    "compare_percall",
    "format_percall",
    "SizeVerdict",
    "GateResult",
    "compare",
]

#: The per-call gate's default allowance, in microseconds per call (docs/benchmark.md says why 2.5).
DEFAULT_MAX_ADDED_US = 2.5


def count_over(values: Sequence[float], limit: float) -> int:
    """How many of ``values`` are above ``limit``."""
    return sum(1 for v in values if v > limit)


def majority_over(values: Sequence[float], limit: float) -> bool:
    """The gate's rule for one item: the median of ``values`` is above ``limit``, and so is a strict majority of them.

    ``values`` holds one figure per repeat (or per run) of the item, so one unlucky repeat cannot fail it.
    """
    return statistics.median(values) > limit and count_over(values, limit) * 2 > len(values)


class GateError(ValueError):
    """The baseline cannot be compared with this run (different setup, nothing in common)."""


# ---- the per-call gate ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PercallVerdict:
    """One (size, path) of the per-call gate."""

    size_bytes: int
    path: str
    baseline_ratio: float
    baseline_added_us: float
    regression_us: float  # median over runs
    run_regression_us: tuple[float, ...]
    limit_us: float

    @property
    def runs_over(self) -> int:
        return count_over(self.run_regression_us, self.limit_us)

    @property
    def failed(self) -> bool:
        """The majority rule (:func:`majority_over`) over this item's per-run regressions."""
        return majority_over(self.run_regression_us, self.limit_us)


def compare_percall(current: dict[str, Any], baseline: dict[str, Any], max_added_us: float) -> list[PercallVerdict]:
    """Judge the per-call record ``current`` against ``baseline``: did delaycomm's per-call cost grow by more than
    ``max_added_us``? (The rule: this module's docstring.)

    Raises:
        GateError: a different device or pinning, or no (size, path) in common.
    """
    for what in ("device", "pin_cpu"):
        a, b = current["settings"].get(what), baseline["settings"].get(what)
        if a != b:
            raise GateError(
                f"the baseline was measured with {what} {b!r}, this run with {a!r}: measure a baseline "
                "with the same settings (--update-baseline)"
            )
    base = {(r["size_bytes"], r["path"]): r for r in percall_results.rows(baseline)}
    verdicts = []
    for r in percall_results.rows(current):
        b = base.get((r["size_bytes"], r["path"]))
        if b is None:
            continue
        per_run = tuple((ratio - b["ratio_cpu"]) * raw for ratio, raw in zip(r["run_ratio_cpu"], r["run_raw_cpu_us"]))
        verdicts.append(
            PercallVerdict(
                size_bytes=r["size_bytes"],
                path=r["path"],
                baseline_ratio=b["ratio_cpu"],
                baseline_added_us=b["added_cpu_us"],
                regression_us=statistics.median(per_run),
                run_regression_us=per_run,
                limit_us=max_added_us,
            )
        )
    if not verdicts:
        raise GateError("this run and the baseline have no (size, path) in common: run the baseline's sizes and paths")
    return verdicts


def format_percall(verdicts: Sequence[PercallVerdict], max_added_us: float) -> str:
    """The per-call gate's report: one line per item, then ``gate: PASS`` or ``gate: FAIL`` naming each failure."""
    lines = [
        f"# gate: regression = (ratio - baseline ratio) x raw CPU us per call, per run; fails when the median "
        f"over runs and a majority of runs exceed {max_added_us:g} us/call",
        f"# {'size':>8} {'path':<12} {'base ratio':>10} {'regression':>13} {'runs over':>9}  runs (us)  verdict",
    ]
    for v in verdicts:
        lines.append(
            f"  {format_size(v.size_bytes):>8} {v.path:<12} {v.baseline_ratio:>10.3f} "
            f"{v.regression_us:>+10.2f} us "
            f"{v.runs_over:>5}/{len(v.run_regression_us):<3}  "
            f"{', '.join(f'{x:+.2f}' for x in v.run_regression_us)}  {'FAIL' if v.failed else 'ok'}"
        )
    failed = [v for v in verdicts if v.failed]
    lines.append(
        f"gate: {'FAIL' if failed else 'PASS'}: "
        + (
            f"delaycomm costs more than {max_added_us:g} us/call over its baseline at "
            + ", ".join(f"{format_size(v.size_bytes)} {v.path} ({v.regression_us:+.2f} us)" for v in failed)
            if failed
            else f"no regression beyond {max_added_us:g} us/call at {len(verdicts)} items"
        )
    )
    return "\n".join(lines)


# ---- the ratio gate ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SizeVerdict:
    collective: str
    size_bytes: int
    backend: str
    baseline_ratio: float
    limit: float
    ratio: float
    repeat_ratios: tuple[float, ...]
    confirmation: SizeVerdict | None = None  # the same size measured again, when this one failed

    @property
    def repeats_over(self) -> int:
        return count_over(self.repeat_ratios, self.limit)

    @property
    def failed_once(self) -> bool:
        """This measurement alone fails the rule (median above the limit, in a majority of repeats)."""
        return majority_over(self.repeat_ratios, self.limit)

    @property
    def failed(self) -> bool:
        """Failed here and in every confirmation run so far."""
        return self.failed_once and (self.confirmation is None or self.confirmation.failed)

    def confirmed_by(self, again: SizeVerdict) -> SizeVerdict:
        """This verdict with ``again`` appended to its chain of confirmation runs."""
        tail = again if self.confirmation is None else self.confirmation.confirmed_by(again)
        return dataclasses.replace(self, confirmation=tail)

    def describe(self) -> str:
        text = (
            f"{self.collective} {format_size(self.size_bytes)} {self.backend}: ratio {self.ratio:.3f} > limit "
            f"{self.limit:.3f} (baseline {self.baseline_ratio:.3f}; {self.repeats_over}/"
            f"{len(self.repeat_ratios)} repeats over: {', '.join(f'{r:.3f}' for r in self.repeat_ratios)})"
        )
        c, k = self.confirmation, 1
        while c is not None:
            text += (
                f"; confirmation run {k}: ratio {c.ratio:.3f}, {c.repeats_over}/{len(c.repeat_ratios)} repeats "
                "over" + ("" if c.failed_once else " (did not reproduce)")
            )
            c, k = c.confirmation, k + 1
        return text


@dataclasses.dataclass(frozen=True)
class GateResult:
    max_slowdown: float
    raw: str
    verdicts: tuple[SizeVerdict, ...]
    missing: tuple[str, ...]  # baseline rows this run did not measure

    @property
    def failed(self) -> tuple[SizeVerdict, ...]:
        return tuple(v for v in self.verdicts if v.failed)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def to_confirm(self) -> tuple[SizeVerdict, ...]:
        """Sizes failing so far (in the run and in every confirmation run): what a confirmation run measures."""
        return self.failed

    def confirmed_by(self, again: GateResult) -> GateResult:
        """This result with each size that is failing so far judged again by ``again`` (a run of those sizes)."""
        by_key = {(v.collective, v.size_bytes, v.backend): v for v in again.verdicts}
        verdicts = []
        for v in self.verdicts:
            other = by_key.get((v.collective, v.size_bytes, v.backend)) if v.failed else None
            verdicts.append(v.confirmed_by(other) if other is not None else v)
        return dataclasses.replace(self, verdicts=tuple(verdicts))

    def format(self) -> str:
        lines = [
            f"# gate: ratio = p50(delaycomm) / p50({self.raw}) per repeat, both measured interleaved in one run; "
            f"limit = max(1, baseline ratio) x {self.max_slowdown:g}; a size fails when its median ratio is above "
            "the limit in a majority of repeats",
            f"# {'collective':<15}{'size':>10} {'backend':<26}{'baseline':>9}{'limit':>9}{'ratio':>9}"
            f"{'over':>7}  verdict",
        ]
        for v in self.verdicts:
            verdict = "FAIL" if v.failed else "ok (not confirmed)" if v.failed_once else "ok"
            lines.append(
                f"  {v.collective:<15}{format_size(v.size_bytes):>10} {v.backend:<26}{v.baseline_ratio:>9.3f}"
                f"{v.limit:>9.3f}{v.ratio:>9.3f}{v.repeats_over:>4}/{len(v.repeat_ratios):<2}  {verdict}"
            )
        if self.missing:
            lines.append(f"# not measured in this run (ignored): {', '.join(self.missing)}")
        unconfirmed = [v for v in self.verdicts if v.failed_once and not v.failed]
        if unconfirmed:
            lines.append(
                "# failed once, then passed in the confirmation run (noise): "
                + "; ".join(v.describe() for v in unconfirmed)
            )
        if self.ok:
            lines.append(f"gate: PASS: no slowdown beyond x{self.max_slowdown:g} at {len(self.verdicts)} sizes")
        else:
            failed = self.failed
            lines.append(
                f"gate: FAIL: delaycomm got slower relative to {self.raw} at {len(failed)} of "
                f"{len(self.verdicts)} sizes (max slowdown x{self.max_slowdown:g}):"
            )
            lines += [f"  {v.describe()}" for v in failed]
        return "\n".join(lines)


def _setup(record: dict[str, Any]) -> dict[str, Any]:
    s = record["settings"]
    raw = raw_label(record)
    raw_name = next((b["name"] for b in s["backends"] if b["label"] == raw), None)
    return {
        "world_size": record["world_size"],
        "device": s.get("device"),
        "dtype": s.get("dtype"),
        "redop": s.get("redop"),
        "raw backend": raw_name,
    }


def compare(current: dict[str, Any], baseline: dict[str, Any], max_slowdown: float) -> GateResult:
    """Judge ``current`` against ``baseline`` by the rule in this module's docstring.

    Raises:
        GateError: a run without a raw backend, a different setup (world size, device, dtype, redop, raw backend),
            or no (collective, size, backend) in common.
    """
    if max_slowdown < 1.0:
        raise GateError(f"--max-slowdown must be >= 1, got {max_slowdown:g}")
    for name, rec in (("this run", current), ("the baseline", baseline)):
        if raw_label(rec) is None:
            raise GateError(f"{name} has no raw backend (gloo or nccl) to take ratios against")
    mine, theirs = _setup(current), _setup(baseline)
    diff = [f"{k}: baseline {theirs[k]!r}, this run {mine[k]!r}" for k in mine if mine[k] != theirs[k]]
    if diff:
        raise GateError(
            "the baseline was measured with a different setup ("
            + "; ".join(diff)
            + "): measure a new baseline with the same settings"
        )
    cur = {(r.collective, r.size_bytes, r.backend): r for r in row_stats(current) if r.ratio is not None}
    base = {(r.collective, r.size_bytes, r.backend): r for r in row_stats(baseline) if r.ratio is not None}
    common = [k for k in base if k in cur]
    if not common:
        raise GateError(
            "this run and the baseline have no (collective, size, backend) in common: run the sizes, "
            "collectives and backends of the baseline"
        )
    verdicts = tuple(_verdict(cur[k], base[k], max_slowdown) for k in common)
    missing = tuple(f"{c} {format_size(s)} {b}" for (c, s, b) in base if (c, s, b) not in cur)
    return GateResult(max_slowdown=max_slowdown, raw=raw_label(current), verdicts=verdicts, missing=missing)


def _verdict(cur: RowStats, base: RowStats, max_slowdown: float) -> SizeVerdict:
    baseline_ratio = statistics.median(base.repeat_ratios)
    return SizeVerdict(
        collective=cur.collective,
        size_bytes=cur.size_bytes,
        backend=cur.backend,
        baseline_ratio=baseline_ratio,
        limit=max(1.0, baseline_ratio) * max_slowdown,
        ratio=statistics.median(cur.repeat_ratios),
        repeat_ratios=cur.repeat_ratios,
    )
