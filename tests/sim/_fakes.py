"""Helpers of the simulator tests: a test-only delay sampler and small configs (imported, not a conftest)."""

from __future__ import annotations

import dataclasses

import numpy as np

from delaycomm.sim import ProblemConfig, SimConfig, StepConfig


class FakeSampler:
    """Test-only stand-in for ``delaycomm.DelaySampler`` (same call shape).

    Supports ``const:X`` and ``exp:mean=X`` with X in seconds (or ``ms``/``s``), or an explicit
    list of delays (then index k returns ``values[k % len(values)]``). Delay k
    of a stream is a pure function of (seed, rank, stream, k), like the real
    sampler's counter-based RNG. Records every ``sample_many`` call.
    """

    def __init__(self, spec: str | list[float], seed: int = 0, rank: int = 0) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.seed, self.rank = seed, rank
        if isinstance(spec, list):
            self.values = np.asarray(spec, dtype=np.float64)
            self.kind = "list"
            return
        kind, _, arg = spec.partition(":")
        if kind == "const":
            self.kind, self.mean = "const", _seconds(arg)
        elif kind == "exp" and arg.startswith("mean="):
            self.kind, self.mean = "exp", _seconds(arg[5:])
        else:
            raise ValueError(f"FakeSampler: unsupported spec {spec!r}")

    def sample_many(self, n: int, stream: int = 0, start: int = 0) -> np.ndarray:
        self.calls.append((n, stream, start))
        idx = np.arange(start, start + n)
        if self.kind == "list":
            return self.values[idx % self.values.size]
        if self.kind == "const":
            return np.full(n, self.mean)
        rng = np.random.default_rng([self.seed, self.rank, stream])
        return rng.exponential(self.mean, size=start + n)[start:]


def _seconds(text: str) -> float:
    """``0.5``, ``0.5s`` or ``500ms`` in seconds (the CLI passes the backend's syntax, which needs a unit)."""
    if text.endswith("ms"):
        return float(text[:-2]) / 1e3
    return float(text.removesuffix("s"))


def small(**overrides) -> SimConfig:
    """A fast configuration: small problem, short budget."""
    base = SimConfig(
        model="asp",
        workers=4,
        budget=60.0,
        base_time=1.0,
        straggler=3.0,
        jitter="lognormal:0.3",
        step=StepConfig(lr=0.5),
        problem=ProblemConfig(samples=256, features=5, margin=3.0, batch=8),
        eval_interval=5.0,
    )
    return dataclasses.replace(base, **overrides)
