"""The experiments behind the CLI: seed 002's table and the scenarios beyond it.

The inferred seed-002 parameters live here, in one place; docs/sim.md says how
each was inferred. Every function takes a ``sampler_factory`` so that network
delays come from one injected object (the CLI passes
``delaycomm.DelaySampler``; tests may pass a fake).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .engine import DelaySource, RunResult, SimConfig, simulate
from .policies import StepConfig
from .problem import LogisticProblem, ProblemConfig
from .report import COLUMNS, Row

__all__ = [
    "HEAVY_TAIL_DELAY",
    "PUBLISHED",
    "PUBLISHED_MAX_STALENESS",
    "Check",
    "SamplerFactory",
    "check_published",
    "loss_at",
    "peak_loss",
    "run_configs",
    "scenario_groups",
    "seed002_config",
    "seed002_rows",
    "staleness_sweep_rows",
    "Verdict",
    "winners",
]

SamplerFactory = Callable[[str, int, int], DelaySource]
"""``(spec, seed, rank) -> sampler``; ``delaycomm.DelaySampler`` fits."""

#: Seed 002's table, by model label.
PUBLISHED: dict[str, dict[str, float]] = {
    "bsp": {"updates": 105, "updates_per_s": 0.26, "mean_staleness": 0.00, "max_staleness": 0, "final_loss": 0.2611},
    "lead:2": {
        "updates": 855,
        "updates_per_s": 2.13,
        "mean_staleness": 3.53,
        "max_staleness": 14,
        "final_loss": 0.2688,
    },
    "asp": {"updates": 2934, "updates_per_s": 7.33, "mean_staleness": 6.98, "max_staleness": 45, "final_loss": 0.2672},
}
#: Seed 002's "14 -> 30 -> 45 as s goes 2 -> 8 -> inf".
PUBLISHED_MAX_STALENESS: dict[str, int] = {"lead:2": 14, "lead:8": 30, "asp": 45}

#: A heavy-tailed worker-to-server delay for the scenarios (Pareto tail).
HEAVY_TAIL_DELAY = "pareto:p50=100ms,p99=2s"

#: Tolerance floors of :func:`check_published`: (relative, absolute).
_FLOORS = {
    "updates": (0.01, 0.0),
    "updates_per_s": (0.01, 0.0),
    "mean_staleness": (0.01, 0.0),
    "max_staleness": (0.0, 0.0),
    "final_loss": (0.0, 0.0005),
}


def seed002_config(model: str = "asp", seed: int = 0, **overrides) -> SimConfig:
    """The configuration inferred for seed 002's experiment.

    Eight workers, worker 0 a 4x straggler, 400 s budget, lognormal compute
    jitter (sigma 0.2), a fixed 70 ms push/pull per step, logistic regression
    on 4096 x 20 rows with batches of 64 and learning rate 1.0.

    Args:
        model: Consistency model spec.
        seed: Run seed.
        **overrides: Any :class:`SimConfig` field to replace.

    Returns:
        The configuration.
    """
    base = SimConfig(
        model=model,
        workers=8,
        budget=400.0,
        base_time=0.92,
        straggler=4.0,
        stragglers=1,
        jitter="lognormal:0.2",
        comm=0.07,
        step=StepConfig(rule="const", lr=1.0),
        problem=ProblemConfig(samples=4096, features=20, margin=4.8, batch=64, seed=0),
        seed=seed,
    )
    return dataclasses.replace(base, **overrides)


def _samplers(config: SimConfig, factory: SamplerFactory | None) -> list[DelaySource] | None:
    if config.delay.strip().lower() == "none":
        return None
    if factory is None:
        raise ValueError(f"run_configs: delay {config.delay!r} needs a sampler factory (delaycomm.DelaySampler)")
    return [factory(config.delay, config.seed, rank) for rank in range(config.workers)]


def run_configs(
    configs: Sequence[SimConfig],
    sampler_factory: SamplerFactory | None = None,
    progress: Callable[[Iterable[SimConfig]], Iterable[SimConfig]] | None = None,
) -> list[RunResult]:
    """Run several configurations, sharing problems between them.

    Args:
        configs: What to run.
        sampler_factory: Builds each worker's delay sampler; needed only for
            configs whose ``delay`` is not ``none``.
        progress: Wraps the iteration (e.g. a tqdm bar); identity if None.

    Returns:
        One result per config, in order (a config listed twice is run once
        and its result returned twice).
    """
    problems: dict[tuple[ProblemConfig, int], LogisticProblem] = {}
    done: dict[SimConfig, RunResult] = {}
    unique = list(dict.fromkeys(configs))  # identical configs give identical runs: run each once
    for cfg in (progress or (lambda x: x))(unique):
        key = (cfg.problem, cfg.workers)
        if key not in problems:
            problems[key] = LogisticProblem(cfg.problem, cfg.workers)
        done[cfg] = simulate(cfg, _samplers(cfg, sampler_factory), problems[key])
    return [done[cfg] for cfg in configs]


def seed002_rows(
    seeds: Sequence[int], lead: int = 2, overrides: dict | None = None
) -> list[tuple[str, list[SimConfig], dict[str, float] | None]]:
    """Configurations of seed 002's table: BSP, SSP (``lead:lead``), ASP.

    Args:
        seeds: Run seeds (one run per seed and row).
        lead: The SSP row's lead bound ``s`` (``lead:s``).
        overrides: :class:`SimConfig` fields to replace in every row.

    Returns:
        ``(row name, configs, published values or None)`` per row. Published
        values are attached only when nothing was overridden.
    """
    overrides = overrides or {}
    out = []
    for model in ("bsp", f"lead:{lead}", "asp"):
        cfgs = [seed002_config(model, s, **overrides) for s in seeds]
        published = PUBLISHED.get(model) if not overrides else None
        out.append((cfgs[0].model, cfgs, published))
    return out


def staleness_sweep_rows(seeds: Sequence[int], bounds: Sequence[int | None], overrides: dict | None = None):
    """Configurations of the max-staleness sweep (``None`` in ``bounds`` is ASP).

    Args:
        seeds: Run seeds.
        bounds: Lead bounds ``s`` (``lead:s``).
        overrides: :class:`SimConfig` fields to replace.

    Returns:
        ``(model label, configs, published max staleness or None)`` per bound.
    """
    overrides = overrides or {}
    out = []
    for s in bounds:
        model = "asp" if s is None else f"lead:{s}"
        cfgs = [seed002_config(model, seed, **overrides) for seed in seeds]
        out.append((model, cfgs, None if overrides else PUBLISHED_MAX_STALENESS.get(model)))
    return out


@dataclasses.dataclass(frozen=True)
class Check:
    """Whether one published number is within our seed-to-seed noise.

    Attributes:
        row: Row label.
        column: Column key.
        published: The seed's number.
        mean: Our mean over seeds.
        sd: Our sample standard deviation over seeds.
        tolerance: Allowed ``|mean - published|``.
        ok: Whether it is within tolerance.
    """

    row: str
    column: str
    published: float
    mean: float
    sd: float
    tolerance: float
    ok: bool


def check_published(rows: Sequence[Row]) -> list[Check]:
    """Compare rows with their published values.

    The published table is one run, so its own noise is one seed-to-seed
    standard deviation: a number matches when
    ``|mean - published| <= max(2 sd, rel * |published|, abs)`` with floors
    ``rel`` = 1% for counts, rates and mean staleness (the published values
    are rounded), 0 for max staleness, and ``abs`` = 0.0005 for the loss.

    Args:
        rows: Rows with ``published`` set and at least two runs.

    Returns:
        One check per published cell.

    Raises:
        ValueError: If a row with published values has fewer than two runs.
    """
    checks = []
    for row in rows:
        if row.published is None:
            continue
        if len(row.runs) < 2:
            raise ValueError("check_published: needs at least 2 seeds per row to estimate the noise")
        for col in COLUMNS:
            if col.key not in row.published:
                continue
            vals = row.values(col)
            mean, sd = float(vals.mean()), float(vals.std(ddof=1))
            pub = float(row.published[col.key])
            rel, absolute = _FLOORS[col.key]
            tol = max(2.0 * sd, rel * abs(pub), absolute)
            checks.append(Check(row.name, col.key, pub, mean, sd, tol, abs(mean - pub) <= tol + 1e-12))
    return checks


def scenario_groups(
    seeds: Sequence[int], delay: str = HEAVY_TAIL_DELAY, budget: float = 400.0, overrides: dict | None = None
) -> list[tuple[str, list[tuple[str, list[SimConfig]]]]]:
    """The scenarios beyond the seed, all on seed 002's cluster.

    Groups: the three models under a heavy-tailed network delay; the stale
    policies under ASP with that delay (stale after N - 1 and after
    2(N - 1) updates); the step-size rules under ASP with that delay, plus a
    constant step ten times smaller as a control.

    Args:
        seeds: Run seeds.
        delay: Network-delay spec of every update.
        budget: Long budget (s); the short budget is read off the curves.
        overrides: :class:`SimConfig` fields to replace everywhere.

    Returns:
        ``(group title, [(row name, configs)])`` per group.
    """
    overrides = dict(overrides or {})
    base = dict(delay=delay, budget=budget, **overrides)

    def cfgs(model: str, **kw) -> list[SimConfig]:
        return [seed002_config(model, s, **{**base, **kw}) for s in seeds]

    lr = seed002_config(**overrides).step.lr
    models = [(m, cfgs(m)) for m in ("bsp", "lead:2", "asp")]
    n = seed002_config(**overrides).workers
    policies = [(p, cfgs("asp", policy=p)) for p in ("apply", "drop", "ema")]
    # The default threshold calls an update stale after N - 1 others landed; the wider one after 2(N - 1).
    policies += [(f"{p}, stale>{2 * (n - 1)}", cfgs("asp", policy=p, stale_after=2 * (n - 1))) for p in ("drop", "ema")]
    rules = [
        (rule, cfgs("asp", step=StepConfig(rule=rule, lr=lr)))
        for rule in ("const", "staleness", "adadelay", "dcasgd", "dcasgd-a", "anytime")
    ]
    # Control: a constant step ten times smaller, to tell a delay-aware gain from a smaller step.
    rules.append((f"const, lr {lr / 10:g}", cfgs("asp", step=StepConfig(rule="const", lr=lr / 10))))
    return [
        (f"consistency models, delay {delay}", models),
        (f"stale policies (ASP), delay {delay}", policies),
        (f"step-size rules (ASP, apply), delay {delay}", rules),
    ]


def loss_at(result: RunResult, t: float) -> float:
    """Loss of ``result``'s curve at time ``t`` (linear interpolation)."""
    if t >= result.config.budget:
        return result.final_loss
    return float(np.interp(t, result.curve_time, result.curve_loss))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The best row of a group at one budget.

    Attributes:
        budget: Simulated seconds the losses are read at.
        best: Row with the lowest mean loss.
        loss: Its mean loss.
        ties: Other rows not distinguishable from it at about 95%:
            ``|mean - best| <= 2 sqrt(se^2 + se_best^2)``, ``se = sd / sqrt(seeds)``.
    """

    budget: float
    best: str
    loss: float
    ties: tuple[str, ...]


def winners(rows: Sequence[Row], budgets: Sequence[float]) -> list[Verdict]:
    """Judge a group of rows at each budget.

    Args:
        rows: Rows of one group (at least two runs each for ties to count).
        budgets: Budgets (s) to judge at.

    Returns:
        One :class:`Verdict` per budget.
    """
    out = []
    for b in budgets:
        stats = []
        for row in rows:
            vals = np.array([loss_at(x, b) for x in row.runs])
            se = float(vals.std(ddof=1)) / math.sqrt(vals.size) if vals.size > 1 else 0.0
            stats.append((float(vals.mean()), se, row.name))
        mean, se_best, name = min(stats)
        ties = tuple(n for m, se, n in stats if n != name and abs(m - mean) <= 2.0 * math.hypot(se, se_best))
        out.append(Verdict(b, name, mean, ties))
    return out


def peak_loss(result: RunResult, since: float) -> float:
    """Largest sampled loss of ``result``'s curve from time ``since`` on (and the final loss)."""
    tail = result.curve_loss[result.curve_time >= since]
    return float(max(tail.max(initial=result.final_loss), result.final_loss))


def finite_or_none(x: float) -> float | None:
    """``x``, or ``None`` if it is infinite (for JSON)."""
    return None if math.isinf(x) else x
