"""Discrete-event engine: N workers, one parameter server, a heap of events.

Time is simulated seconds. A worker reads the server's parameters, computes a
mini-batch gradient for ``base_time * factor * jitter + comm`` seconds, then
sends it; the server applies it when it arrives (after an optional network
delay, per-worker FIFO like one TCP stream). Under ASP and SSP every gradient
is applied on arrival; under BSP the server waits for all N, applies their
mean once, and starts the next round. Everything is a pure function of the
seeds: the same :class:`SimConfig` gives the same result bit for bit.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import heapq
import logging
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from .models import ConsistencyModel, parse_model, staleness_bound
from .policies import POLICIES, StalePolicy, StepConfig, make_optimizer
from .problem import LogisticProblem, ProblemConfig

__all__ = ["SIM_DELAY_STREAM", "DelaySource", "RunResult", "SimConfig", "parse_jitter", "simulate"]

log = logging.getLogger(__name__)

#: The delay stream the simulator draws from. NOTE: the backend's schedule uses streams [0, 2^16) for op kinds,
#: 2^16 for DelayedLoader and 2^32 | key for staleness keys (csrc/delay/Schedule.hpp); the simulator takes
#: 2^16 + 1 so that its draws are never the backend's.
SIM_DELAY_STREAM = (1 << 16) + 1

_JITTERS = "'none', 'lognormal:SIGMA' (SIGMA >= 0), 'exp:FRAC' (0 <= FRAC <= 1) or 'uniform:W' (0 <= W < 1)"
_DONE, _ARRIVE = 0, 1


class DelaySource(Protocol):
    """What the engine needs from a delay sampler (``delaycomm.DelaySampler``).

    ``sample_many(n, stream, start)`` returns ``n`` delays in seconds: the
    delays with indices ``start .. start + n - 1`` of ``stream``. The engine
    asks for stream :data:`SIM_DELAY_STREAM`; update ``k`` (0-based) of a
    worker gets index ``k`` of its own sampler (one sampler per rank).
    """

    def sample_many(self, n: int, stream: int = 0, start: int = 0) -> np.ndarray: ...


def parse_jitter(spec: str) -> tuple[str, float]:
    """Parse a compute-time jitter spec.

    The jitter ``J`` multiplies a worker's mean compute time and has mean 1:
    ``none`` (J = 1), ``lognormal:SIGMA`` (J = exp(SIGMA Z - SIGMA^2 / 2)),
    ``exp:FRAC`` (J = 1 - FRAC + FRAC E, E ~ Exp(1); FRAC = 1 is exponential)
    and ``uniform:W`` (J ~ U(1 - W, 1 + W)).

    Args:
        spec: The spec string.

    Returns:
        ``(kind, parameter)``.

    Raises:
        ValueError: If ``spec`` is not one of the accepted forms.
    """
    text = str(spec).strip().lower()
    if text == "none":
        return ("none", 0.0)
    kind, _, arg = text.partition(":")
    try:
        value = float(arg)
    except ValueError:
        raise ValueError(f"parse_jitter: bad jitter {spec!r}: expected {_JITTERS}") from None
    ok = {
        "lognormal": lambda v: 0.0 <= v < 10.0,
        "exp": lambda v: 0.0 <= v <= 1.0,
        "uniform": lambda v: 0.0 <= v < 1.0,
    }
    if kind not in ok or not math.isfinite(value) or not ok[kind](value):
        raise ValueError(f"parse_jitter: bad jitter {spec!r}: expected {_JITTERS}")
    return (kind, value)


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """One simulated training run.

    Attributes:
        model: Consistency model spec (see :func:`parse_model`).
        workers: Number of workers ``N``.
        budget: Wall-clock budget in simulated seconds.
        base_time: Mean compute time of one gradient on a normal worker (s).
        straggler: Compute-time factor of the straggler workers.
        stragglers: How many workers (ranks 0..k-1) are stragglers.
        jitter: Compute-time jitter spec (see :func:`parse_jitter`).
        comm: Fixed time a worker spends per step pushing its gradient and
            pulling parameters, paid in its own wall clock (s).
        delay: Network-delay spec of each worker-to-server update, in the
            backend's syntax (``none``, ``exp:p99=400ms``, ...). The engine
            does not parse it: it is a label for the samplers passed in.
        delay_fraction: Fraction of updates that are delayed (Bernoulli).
        delay_where: ``network``: the worker goes on while its update is in
            flight; ``host``: the worker waits until its update is applied.
        policy: Stale policy, ``apply``, ``drop`` or ``ema``.
        alpha: EMA blend weight of stale contributions.
        stale_after: Largest staleness that counts as fresh (``None``: N - 1).
        step: Step-size rule.
        problem: The logistic-regression problem.
        seed: Run seed (compute times, batches, delay-fraction draws).
        eval_interval: Simulated seconds between loss samples of the curve.
    """

    model: str = "asp"
    workers: int = 8
    budget: float = 400.0
    base_time: float = 1.0
    straggler: float = 4.0
    stragglers: int = 1
    jitter: str = "none"
    comm: float = 0.0
    delay: str = "none"
    delay_fraction: float = 1.0
    delay_where: str = "network"
    policy: str = "apply"
    alpha: float = 0.1
    stale_after: int | None = None
    step: StepConfig = dataclasses.field(default_factory=StepConfig)
    problem: ProblemConfig = dataclasses.field(default_factory=ProblemConfig)
    seed: int = 0
    eval_interval: float = 2.0

    def validate(self) -> ConsistencyModel:
        """Check every field; return the parsed model.

        Raises:
            ValueError: Naming the first bad field, its value and what is
                accepted.
        """

        def finite_positive(name: str, value: float) -> None:
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"SimConfig: {name} must be a finite number > 0, got {value!r}")

        model = parse_model(self.model)
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"SimConfig: workers must be an integer >= 1, got {self.workers!r}")
        finite_positive("budget", self.budget)
        finite_positive("base_time", self.base_time)
        finite_positive("straggler", self.straggler)
        finite_positive("eval_interval", self.eval_interval)
        if not (0 <= self.stragglers <= self.workers):
            raise ValueError(f"SimConfig: stragglers must be in [0, workers={self.workers}], got {self.stragglers}")
        if not (math.isfinite(self.comm) and self.comm >= 0):
            raise ValueError(f"SimConfig: comm must be a finite number >= 0, got {self.comm!r}")
        if not (0.0 <= self.delay_fraction <= 1.0):
            raise ValueError(f"SimConfig: delay_fraction must be in [0, 1], got {self.delay_fraction!r}")
        if self.delay_where not in ("network", "host"):
            raise ValueError(f"SimConfig: delay_where must be 'network' or 'host', got {self.delay_where!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"SimConfig: policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not (0.0 < self.alpha <= 1.0):
            raise ValueError(f"SimConfig: alpha must be in (0, 1], got {self.alpha!r}")
        if self.stale_after is not None and self.stale_after < 0:
            raise ValueError(f"SimConfig: stale_after must be >= 0, got {self.stale_after!r}")
        parse_jitter(self.jitter)
        self.step.validate()
        self.problem.validate()
        return model


@dataclasses.dataclass
class RunResult:
    """What one run measured.

    Attributes:
        config: The run's configuration.
        label: Model label (``bsp``, ``lead:2``, ``asp``).
        title: Human model name.
        updates: Updates the server applied within the budget.
        dropped: Arrivals the ``drop`` policy discarded.
        staleness: Staleness of every arrival (applied or dropped), in order.
        arrival_time: Time of every arrival (s).
        arrival_worker: Worker of every arrival.
        arrival_step: The worker's step number (1-based) of every arrival.
        final_loss: Full-data loss at the end of the budget.
        curve_time: Times of the loss samples (s).
        curve_loss: Loss samples.
        worker_updates: Arrivals per worker.
        blocked_seconds: Time each worker spent waiting: at the SSP gate, at the
            BSP barrier, or (``delay_where=host``) for its own update to land.
        bound: The model's staleness bound (``math.inf`` for ASP).
    """

    config: SimConfig
    label: str
    title: str
    updates: int
    dropped: int
    staleness: np.ndarray
    arrival_time: np.ndarray
    arrival_worker: np.ndarray
    arrival_step: np.ndarray
    final_loss: float
    curve_time: np.ndarray
    curve_loss: np.ndarray
    worker_updates: list[int]
    blocked_seconds: list[float]
    bound: float

    @property
    def updates_per_sec(self) -> float:
        """Applied updates per simulated second."""
        return self.updates / self.config.budget

    @property
    def mean_staleness(self) -> float:
        """Mean staleness over arrivals (0 if none)."""
        return float(self.staleness.mean()) if self.staleness.size else 0.0

    @property
    def max_staleness(self) -> int:
        """Largest staleness of any arrival (0 if none)."""
        return int(self.staleness.max()) if self.staleness.size else 0


class _Delays:
    """Buffers one worker's delays from its sampler, in update order."""

    def __init__(self, sampler: DelaySource | None, fraction: float, rng: np.random.Generator) -> None:
        self._sampler = sampler
        self._fraction = fraction
        self._rng = rng
        self._buf = np.empty(0)
        self._start = 0
        self._next = 0

    def next(self) -> float:
        if self._sampler is None:
            return 0.0
        k = self._next
        self._next += 1
        if k - self._start >= self._buf.size:
            chunk = np.asarray(self._sampler.sample_many(256, stream=SIM_DELAY_STREAM, start=k), dtype=np.float64)
            if chunk.shape != (256,) or not np.all(np.isfinite(chunk)) or np.any(chunk < 0):
                raise ValueError(
                    "simulate: delay sampler's sample_many(256) must return 256 finite delays >= 0 "
                    f"in seconds, got shape {chunk.shape}"
                )
            self._buf, self._start = chunk, k
        delay = float(self._buf[k - self._start])
        if self._fraction < 1.0 and self._rng.random() >= self._fraction:
            return 0.0
        return delay


class _Blocks:
    """Hands out draws one at a time from blocks of ``draw(k)``: far fewer RNG calls, same determinism."""

    def __init__(self, draw: Callable[[int], np.ndarray], block: int = 256) -> None:
        self._draw = draw
        self._block = block
        self._buf = draw(block)
        self._k = 0

    def next(self):
        if self._k == len(self._buf):
            self._buf, self._k = self._draw(self._block), 0
        self._k += 1
        return self._buf[self._k - 1]


def _jitter_sampler(spec: str, rng: np.random.Generator) -> Callable[[], float]:
    kind, v = parse_jitter(spec)
    if kind == "none" or v == 0.0:
        return lambda: 1.0
    if kind == "lognormal":
        blocks = _Blocks(lambda k: rng.lognormal(-0.5 * v * v, v, size=k).tolist())
    elif kind == "exp":
        blocks = _Blocks(lambda k: (1.0 - v + v * rng.exponential(size=k)).tolist())
    else:
        blocks = _Blocks(lambda k: rng.uniform(1.0 - v, 1.0 + v, size=k).tolist())
    return blocks.next


def _stream(seed: int, purpose: int, worker: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(purpose, worker)))


class _Simulation:
    """One run's state and its event handlers: the server, the workers, the event heap.

    Events are ``(time, seq, kind, worker)`` on a heap; ``seq`` breaks ties in push order, so the run is a pure
    function of the seeds. A worker is *computing* (a ``_DONE`` event pending), *blocked* (in ``blocked``: at the
    SSP gate, the BSP barrier, or waiting for its own update when ``waiting_own``), and its pushed updates sit in
    ``inflight`` until they arrive (per-worker FIFO).
    """

    def __init__(
        self,
        config: SimConfig,
        model: ConsistencyModel,
        delay_samplers: Sequence[DelaySource] | None,
        problem: LogisticProblem,
    ) -> None:
        n = config.workers
        self.config = config
        self.model = model
        self.n = n
        self.problem = problem
        self.opt = make_optimizer(problem.initial_weights(), config.step, problem.smoothness)
        stale_after = n - 1 if config.stale_after is None else config.stale_after
        self.policy = StalePolicy(config.policy, n, stale_after, config.alpha)
        self.bsp = model.kind == "bsp"
        self.host = config.delay_where == "host"
        self.network_delay = delay_samplers is not None and not self.host

        # Per-worker random streams: purpose 1 jitter, 2 batches, 3 delay-fraction draws.
        self.factors = [config.straggler if i < config.stragglers else 1.0 for i in range(n)]
        self.jitters = [_jitter_sampler(config.jitter, _stream(config.seed, 1, i)) for i in range(n)]
        self.batches = [
            _Blocks(functools.partial(problem.sample_rows, i, _stream(config.seed, 2, i)), block=64) for i in range(n)
        ]
        self.delays = [
            _Delays(
                None if delay_samplers is None else delay_samplers[i], config.delay_fraction, _stream(config.seed, 3, i)
            )
            for i in range(n)
        ]

        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.version = 0
        self.updates = 0
        self.dropped = 0
        self.pushed = [0] * n
        self.arrived = [0] * n
        self.last_arrival = [0.0] * n
        self.computing: list[tuple[np.ndarray, int, np.ndarray] | None] = [None] * n
        self.inflight: list[collections.deque] = [collections.deque() for _ in range(n)]
        self.blocked: dict[int, float] = {}  # worker -> time it started waiting
        self.blocked_seconds = [0.0] * n
        self.waiting_own = [False] * n
        self.staleness: list[int] = []
        self.arrivals: list[tuple[float, int, int]] = []  # (time, worker, step)
        self.round_grads: list[np.ndarray] = []
        self.round_read: np.ndarray | None = None
        self.grid = np.arange(0.0, config.budget + 1e-12, config.eval_interval)
        self.curve_loss: list[float] = []

    def run(self) -> RunResult:
        """Start every worker at t = 0, process events up to the budget, and measure."""
        budget = self.config.budget
        for i in range(self.n):
            self._start(i, 0.0)
        while self.heap and self.heap[0][0] <= budget:
            t, _, kind, i = heapq.heappop(self.heap)
            self._sample_curve(until=t)
            if kind == _DONE:
                self._done(i, t)
            else:
                self._arrive(i, t)
        self._sample_curve(until=math.inf)
        for j, since in self.blocked.items():
            self.blocked_seconds[j] += budget - since
        return self._result()

    def _sample_curve(self, until: float) -> None:
        """Record the loss at every grid time before ``until`` not yet sampled."""
        grid = self.grid
        while len(self.curve_loss) < grid.size and grid[len(self.curve_loss)] < until:
            self.curve_loss.append(self.problem.loss(self.opt.weights()))

    def _push(self, t: float, kind: int, worker: int) -> None:
        heapq.heappush(self.heap, (t, self.seq, kind, worker))
        self.seq += 1

    def _start(self, i: int, t: float) -> None:
        """Worker ``i`` reads the parameters and starts computing a gradient."""
        read = self.opt.read()
        rows = self.batches[i].next()
        self.computing[i] = (self.problem.gradient(read, rows), self.version, read)
        cfg = self.config
        self._push(t + cfg.base_time * self.factors[i] * self.jitters[i]() + cfg.comm, _DONE, i)

    def _try_start(self, i: int, t: float) -> None:
        if self.model.may_start(i, self.pushed, self.arrived):
            self._start(i, t)
        else:
            self.blocked[i] = t

    def _unblock(self, j: int, t: float) -> None:
        self.blocked_seconds[j] += t - self.blocked.pop(j)

    def _release(self, t: float) -> None:
        """Start every blocked worker (in rank order) that may start now."""
        for j in sorted(self.blocked):
            if not self.waiting_own[j] and self.model.may_start(j, self.pushed, self.arrived):
                self._unblock(j, t)
                self._start(j, t)

    def _done(self, i: int, t: float) -> None:
        """Worker ``i`` finished its gradient: push it towards the server."""
        self.pushed[i] += 1
        self.inflight[i].append((*self.computing[i], self.pushed[i]))
        self.computing[i] = None
        at = max(t + self.delays[i].next(), self.last_arrival[i])
        self.last_arrival[i] = at
        if self.bsp or self.host:
            self.blocked[i] = t
            self.waiting_own[i] = not self.bsp
        if at > t:
            self._push(at, _ARRIVE, i)
        else:
            self._arrive(i, t)
        if not self.bsp and not self.host:
            self._try_start(i, t)

    def _arrive(self, i: int, t: float) -> None:
        """Worker ``i``'s oldest in-flight update reaches the server."""
        grad, read_version, read, step = self.inflight[i].popleft()
        self.arrived[i] += 1
        self.arrivals.append((t, i, step))
        if self.bsp:
            self._arrive_bsp(grad, read, t)
            return
        tau = self.version - read_version
        self.staleness.append(tau)
        scale = self.policy.scale(tau)
        if scale > 0.0:
            self.opt.apply(grad, tau, read, scale)
            self.version += 1
            self.updates += 1
        else:
            self.dropped += 1
        if self.waiting_own[i]:
            self.waiting_own[i] = False
        self._release(t)

    def _arrive_bsp(self, grad: np.ndarray, read: np.ndarray, t: float) -> None:
        """BSP: collect the round; when all N are in, apply their mean and start the next round."""
        self.staleness.append(0)  # everyone read the parameters of the round's start
        self.round_grads.append(grad)
        self.round_read = read
        if len(self.round_grads) < self.n:
            return
        self.opt.apply(np.mean(self.round_grads, axis=0), 0, self.round_read)
        self.version += 1
        self.updates += 1
        self.round_grads.clear()
        for j in range(self.n):
            if j in self.blocked:
                self._unblock(j, t)
            self._start(j, t)

    def _result(self) -> RunResult:
        arrivals = self.arrivals
        return RunResult(
            config=self.config,
            label=self.model.label,
            title=self.model.title,
            updates=self.updates,
            dropped=self.dropped,
            staleness=np.asarray(self.staleness, dtype=np.int64),
            arrival_time=np.array([a[0] for a in arrivals], dtype=np.float64),
            arrival_worker=np.array([a[1] for a in arrivals], dtype=np.int64),
            arrival_step=np.array([a[2] for a in arrivals], dtype=np.int64),
            final_loss=self.problem.loss(self.opt.weights()),
            curve_time=self.grid,
            curve_loss=np.asarray(self.curve_loss),
            worker_updates=list(self.arrived),
            blocked_seconds=self.blocked_seconds,
            bound=staleness_bound(self.model, self.n, network_delay=self.network_delay),
        )


def simulate(
    config: SimConfig,
    delay_samplers: Sequence[DelaySource] | None = None,
    problem: LogisticProblem | None = None,
) -> RunResult:
    """Run one simulation.

    Args:
        config: What to simulate.
        delay_samplers: One delay source per worker (rank ``i`` gets
            ``delay_samplers[i]``), or ``None`` for no network delay.
        problem: A prebuilt problem matching ``config.problem`` and
            ``config.workers`` (saves rebuilding it across runs).

    Returns:
        The run's measurements.

    Raises:
        ValueError: If the config is invalid or the samplers misbehave.
    """
    model = config.validate()
    n = config.workers
    if delay_samplers is not None and len(delay_samplers) != n:
        raise ValueError(f"simulate: need one delay sampler per worker ({n}), got {len(delay_samplers)}")
    if problem is None:
        problem = LogisticProblem(config.problem, n)
    elif problem.config != config.problem or len(problem.shards) != n:
        raise ValueError("simulate: problem does not match config.problem and config.workers")
    result = _Simulation(config, model, delay_samplers, problem).run()
    log.debug(
        "simulate %s: %d updates, mean stale %.2f, max stale %d, final loss %.4f",
        result.label,
        result.updates,
        result.mean_staleness,
        result.max_staleness,
        result.final_loss,
    )
    return result
