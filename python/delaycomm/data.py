"""Data-side delay: :class:`DelayedLoader` makes a fraction of batches arrive late, with the backend's samplers."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from delaycomm import _C
from delaycomm._config import parse_delay

__all__ = ["DelayedLoader"]


class DelayedLoader:
    """Wraps an iterable of batches (a ``DataLoader``) and delays a fraction of them before they are yielded.

    Batch i (counted across epochs) of rank r is delayed when the schedule says so: a Bernoulli(``fraction``) draw
    and a delay from the ``delay`` distribution, both pure functions of ``(seed, r, i)`` on their own stream
    (``DelaySchedule.LOADER_STREAM``), so runs repeat exactly and ranks differ. The wait blocks the iterating
    thread (the GIL is released).

    Args:
        loader: any iterable of batches; ``len()`` is passed through when it has one.
        delay: a delay spec as for the backend's ``delay`` option (e.g. ``"exp:p99=400ms"``).
        fraction: share of delayed batches, in [0, 1].
        seed: seed of the schedule (>= 0).
        rank: whose schedule; default: ``torch.distributed.get_rank()`` when initialised, else 0.

    Raises:
        ValueError: a bad spec, fraction, seed or rank.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        delay: str = "exp:p99=400ms",
        fraction: float = 0.3,
        seed: int = 0,
        rank: int | None = None,
    ) -> None:
        try:
            spec = parse_delay(delay)
        except ValueError as e:
            raise ValueError(f"delaycomm.data.DelayedLoader: invalid delay {delay!r}: {e}") from None
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, (int, float))
            or not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0)
        ):
            raise ValueError(f"delaycomm.data.DelayedLoader: fraction must be a number in [0, 1], got {fraction!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"delaycomm.data.DelayedLoader: seed must be an integer >= 0, got {seed!r}")
        if rank is None:
            import torch.distributed as dist

            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"delaycomm.data.DelayedLoader: rank must be an integer >= 0, got {rank!r}")
        self.loader = loader
        self.delay = spec
        self.fraction = float(fraction)
        self.seed = seed
        self.rank = rank
        self._schedule = _C.DelaySchedule(spec.spec, self.fraction, seed, [])  # the parsed spec: no second read
        self._next = 0
        self._delays_s: list[float] = []

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def delay_of(self, index: int) -> float:
        """The delay in seconds of batch ``index`` (counted from 0 across epochs); 0 when it is not delayed."""
        return self._schedule.delay_ns(self.rank, _C.DelaySchedule.LOADER_STREAM, index) * 1e-9

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            d = self.delay_of(self._next)
            self._next += 1
            if d > 0:
                _C.sleep_precise(d)
                self._delays_s.append(d)
            yield batch

    def stats(self) -> dict[str, Any]:
        """Batches yielded, batches delayed, and the injected delay (total, p50, p99, max in seconds)."""
        ds = sorted(self._delays_s)

        def pct(q: float) -> float:
            return ds[min(len(ds) - 1, int(q * len(ds)))] if ds else 0.0

        return {
            "batches": self._next,
            "delayed": len(ds),
            "total_delay_s": float(sum(ds)),
            "p50_s": pct(0.5),
            "p99_s": pct(0.99),
            "max_s": ds[-1] if ds else 0.0,
        }
