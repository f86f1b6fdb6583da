"""Helpers of the bench tests that run inside the spawned ranks (so: module-level and picklable)."""

from __future__ import annotations

import time
from typing import Any


class ScriptedClock:
    """A nanosecond clock whose k-th timed call on a rank lasts ``durations_ns[rank][k % len]``.

    The engine reads the clock exactly twice per timed call (before and after), so the measured per-call times
    are the script, whatever the machine does.
    """

    def __init__(self, durations_ns: dict[int, list[int]]):
        self.durations_ns = durations_ns
        self._now = 0
        self._calls = 0
        self._rank: int | None = None

    def __call__(self) -> int:
        import os

        if self._rank is None:
            self._rank = int(os.environ["RANK"])
        if self._calls % 2 == 1:
            script = self.durations_ns[self._rank]
            self._now += script[(self._calls // 2) % len(script)]
        self._calls += 1
        return self._now


def _patched_entry(slow_labels: dict[str, float], corrupt_labels: tuple[str, ...]):
    """Patch the engine inside this rank: extra seconds per call on some backends, a wrong element on others."""
    from delaycomm.bench import collectives, engine

    tagged: dict[int, str] = {}
    make_group = engine._make_group

    def tagging_make_group(backend, timeout):
        group = make_group(backend, timeout)
        tagged[id(group)] = backend.label
        return group

    run = collectives.Collective.run

    def patched_run(self, inp, out, group, redop, root):
        label = tagged.get(id(group))
        if label in slow_labels:
            time.sleep(slow_labels[label])
        run(self, inp, out, group, redop, root)
        if label in corrupt_labels:
            import torch.distributed as dist

            if dist.get_rank() == 0:
                self.result(inp, out).view(-1)[0] += 1  # one wrong element, on one rank

    engine._make_group = tagging_make_group
    collectives.Collective.run = patched_run


def slow_entry(slow_labels: dict[str, float]):
    """An engine entry (same signature as run_rank) where calls on ``slow_labels`` sleep that many seconds."""
    return _Entry(slow_labels, ())


def corrupt_entry(corrupt_labels: tuple[str, ...]):
    """An engine entry where ``corrupt_labels`` return one wrong element on rank 0."""
    return _Entry({}, corrupt_labels)


class _Entry:
    def __init__(self, slow_labels: dict[str, float], corrupt_labels: tuple[str, ...]):
        self.slow_labels = slow_labels
        self.corrupt_labels = corrupt_labels

    def __call__(self, rank: int, world_size: int, settings, init_method: str, clock=None) -> Any:
        from delaycomm.bench import engine

        _patched_entry(self.slow_labels, self.corrupt_labels)
        return engine.run_rank(rank, world_size, settings, init_method, clock)


def make_record(
    times: dict[tuple[str, int, str], list[list[float]]],
    world_size: int = 2,
    backends: tuple[str, ...] = ("delaycomm", "gloo"),
    device: str = "cpu",
) -> dict[str, Any]:
    """A run record with the given raw times (``times[(collective, size, backend)][repeat][call]``, in us)."""
    from delaycomm.bench.results import FORMAT

    rows = []
    for (coll, size, label), t in times.items():
        rows.append(
            {
                "collective": coll,
                "size_bytes": size,
                "count": size // 4,
                "dtype": "float32",
                "redop": "sum" if coll in ("all_reduce", "reduce_scatter") else "none",
                "backend": label,
                "times_us": t,
                "wrong": 0,
            }
        )
    return {
        "format": FORMAT,
        "world_size": world_size,
        "settings": {
            "collectives": sorted({k[0] for k in times}),
            "sizes": sorted({k[1] for k in times}),
            "dtype": "float32",
            "redop": "sum",
            "iters": len(next(iter(times.values()))[0]),
            "warmup": 1,
            "repeats": len(next(iter(times.values()))),
            "check": 1,
            "root": 0,
            "device": device,
            "backends": [{"label": b, "name": b.split("[")[0], "options": {}} for b in backends],
            "timeout_s": 60.0,
            "progress": False,
        },
        "rows": rows,
        "skipped": [],
    }


def failing_entry(rank: int, world_size: int, settings, init_method: str, clock=None) -> Any:
    """An engine entry whose rank 1 fails before joining the group (rank 0 would wait for it)."""
    from delaycomm.bench import engine

    if rank == 1:
        raise RuntimeError("rank 1 broke on purpose")
    return engine.run_rank(rank, world_size, settings, init_method, clock)
