"""The measuring engine: runs inside every rank, times every call, and hands rank 0 a record of raw times.

For each collective and size, and for each of ``repeats`` rounds, every backend runs ``warmup`` untimed calls and
then ``iters`` timed calls; the backend order alternates between rounds (A B, B A, A B, ...) so that slow drifts of
the machine hit both sides alike. All backends live in the same processes (one process group each, plus a
private Gloo group for the bench's own bookkeeping), so a ratio compares like with like.

NOTE: nccl-tests time a batch of calls and divide. The bench reports percentiles of per-call times where a call's
time is the max over ranks (docs/benchmark.md, "How a call is timed"), so each rank times each call on its own clock
with no barrier inside the loop, and the per-call vectors are max-reduced across ranks afterwards (outside the
timed region). A call's time on one rank
includes its wait for the slowest rank to arrive: that is what a training step sees.

Reporting is elsewhere: this module produces raw times (``times_us[repeat][call]``), never a table.
"""

from __future__ import annotations

import datetime
import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from delaycomm._tools.output import jsonable
from delaycomm.bench import collectives
from delaycomm.bench.results import FORMAT
from delaycomm.bench.settings import Backend, Settings

__all__ = ["run_rank", "FORMAT"]

Clock = Callable[[], int]  # nanoseconds, monotonic


def _sync_fn(device: str) -> Callable[[], None]:
    if device == "cuda":
        import torch

        # NOTE: a host-side time up to a stream sync, not CUDA events: the wrapper's cost is host time, which events
        # on the stream would hide while the GPU waits for the host. The sync costs both backends the same.
        return torch.cuda.synchronize
    return lambda: None


def _make_group(backend: Backend, timeout: datetime.timedelta):
    import torch.distributed as dist

    if backend.is_delaycomm:
        import delaycomm

        return dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(**backend.options), timeout=timeout)
    return dist.new_group(backend=backend.name, timeout=timeout)


def _ordered_for_creation(backends: tuple[Backend, ...]) -> list[Backend]:
    # NOTE: raw groups first, each warmed up at once: NCCL reads NCCL_ALGO when a communicator is created, and a
    # delaycomm group sets it for its own communicator. Creating and warming each group in turn gives each one
    # the setting it asked for (the raw NCCL group keeps the user's environment / NCCL's own choice).
    return [b for b in backends if not b.is_delaycomm] + [b for b in backends if b.is_delaycomm]


def _warm_up_group(group, device: str) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(1, device=device)
    dist.all_reduce(t, group=group)
    _sync_fn(device)()


def _time_calls(calls: list[Callable[[], None]], sync: Callable[[], None], iters: int, clock: Clock) -> list[list[int]]:
    """Per-call times in ns on this rank, ``clock()`` before each call and after its completion.

    ``iters`` rounds; each round makes one call of each of ``calls`` in turn. Returns one list per call.
    """
    out = [[0] * iters for _ in calls]
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside the loop would charge one call with unrelated work
    try:
        for i in range(iters):
            for k, call in enumerate(calls):
                t0 = clock()
                call()
                sync()
                out[k][i] = clock() - t0
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def _injected_delays(backends: tuple[Backend, ...], groups: dict, plan) -> list[dict[str, Any]]:
    """Rank 0's injected-delay summary per delaycomm backend and collective (from delaycomm's own telemetry).

    Timed, warm-up and check calls alike: the delay spec does not depend on the size.
    """
    import delaycomm

    out = []
    for b in backends:
        if not b.is_delaycomm or b.options.get("delay", "none") == "none":
            continue
        ops = delaycomm.stats(groups[b.label]).get("ops", {})
        for spec in dict.fromkeys(spec for spec, _ in plan):
            op = ops.get(spec.stats_op)
            if op:
                d = op["delay"]
                out.append(
                    {
                        "backend": b.label,
                        "collective": spec.name,
                        "calls": op["calls"],
                        "delayed_calls": op["delayed_calls"],
                        "p50_us": d["p50_us"],
                        "p99_us": d["p99_us"],
                        "max_us": d["max_us"],
                    }
                )
    return out


def _profile_targets(backends: tuple[Backend, ...], groups: dict, plan, elsize: int, n: int) -> list[dict[str, Any]]:
    """Per delaycomm backend replaying a profile (delay profile:FILE) and per (collective, size): the profile's p50
    and p99 for the call as delaycomm classes it (its op, its input bytes), read from the parsed spec the group
    replays (docs/profile.md): the profile file is not read again."""
    from delaycomm import _registry

    out = []
    for b in backends:
        if not b.is_delaycomm:
            continue
        sampler = _registry.config_of(groups[b.label]).delay.spec
        if sampler.family != "profile":
            continue
        for spec, count in plan:
            nbytes = spec.buffer_counts(count, n)[0] * elsize
            q50, q99 = (sampler.quantile(q, op=spec.stats_op, nbytes=nbytes) * 1e6 for q in (0.5, 0.99))
            out.append(
                {
                    "backend": b.label,
                    "collective": spec.name,
                    "size_bytes": count * elsize,
                    "op": spec.stats_op,
                    "call_bytes": nbytes,
                    "p50_us": q50,
                    "p99_us": q99,
                }
            )
    return out


def run_rank(
    rank: int, world_size: int, settings: Settings, init_method: str, clock: Clock | None = None
) -> dict[str, Any] | None:
    """Measure everything ``settings`` asks for in this rank; return the run record on rank 0 (None elsewhere).

    Args:
        rank: this process's rank.
        world_size: number of ranks.
        settings: the run's parameters.
        init_method: the rendezvous (``env://`` under torchrun, ``file://...`` when the bench spawns its ranks).
        clock: a nanosecond clock (default ``time.perf_counter_ns``); tests pass a scripted one.
    """
    import torch
    import torch.distributed as dist

    from delaycomm.bench.environment import environment

    collectives.bind_torch_ops()
    clock = clock or time.perf_counter_ns
    device = settings.device
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    timeout = datetime.timedelta(seconds=settings.timeout_s)
    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.monotonic()
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
    control = dist.group.WORLD
    groups = {}
    try:
        for b in _ordered_for_creation(settings.backends):
            groups[b.label] = _make_group(b, timeout)
            _warm_up_group(groups[b.label], device)
        record = _measure(rank, world_size, settings, groups, control, clock)
        if rank != 0:
            return None
        record.update(
            {
                "format": FORMAT,
                "settings": settings.as_dict(),
                "world_size": world_size,
                "environment": environment(settings),
                "started_utc": started.isoformat(timespec="seconds"),
                "elapsed_s": round(time.monotonic() - t_start, 3),
            }
        )
        return record
    finally:
        dist.destroy_process_group()


def _bind(spec, buffers, group, settings: Settings) -> Callable[[], None]:
    inp, out = buffers

    def call() -> None:
        spec.run(inp, out, group, settings.redop, settings.root)

    return call


def _plan(settings: Settings, n: int, elsize: int) -> tuple[list[tuple[Any, int]], list[dict[str, Any]]]:
    """The (collective spec, element count) pairs to measure, and the sizes skipped (with why)."""
    plan, skipped = [], []
    for name in settings.collectives:
        spec = collectives.get(name)
        last_count = None
        for size in settings.sizes:
            count = spec.count_for(size, elsize, n)
            if count == 0 or count == last_count:
                why = "smaller than one element per rank" if count == 0 else "same element count as the previous size"
                skipped.append({"collective": name, "size_bytes": size, "reason": why})
                continue
            last_count = count
            plan.append((spec, count))
    return plan, skipped


def _measure(rank: int, n: int, settings: Settings, groups: dict, control, clock: Clock) -> dict[str, Any]:
    """Time every (collective, size, backend) ``repeats`` times; check each once; rank 0 gets the rows.

    NOTE: the loops run repeat-major (every size once, then every size again, ...), not size-major: a burst of
    load lasting seconds then spoils one repeat of several sizes (which the gate's majority rule absorbs), never
    every repeat of one size. The backend order alternates from one block to the next.
    """
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, collectives.DTYPES[settings.dtype][0])
    elsize = collectives.DTYPES[settings.dtype][1]
    device = settings.device
    sync = _sync_fn(device)
    backends = settings.backends
    nb, reps, iters = len(backends), settings.repeats, settings.iters
    plan, skipped = _plan(settings, n, elsize)
    bar = None
    if settings.progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=len(plan) * reps, file=sys.stderr, unit="size", dynamic_ncols=True, leave=False)
    times = torch.zeros(len(plan), nb, reps, iters, dtype=torch.float64)
    try:
        for rep in range(reps):
            for pi, (spec, count) in enumerate(plan):
                if bar is not None:
                    from delaycomm.bench.units import format_size

                    bar.set_description(f"repeat {rep + 1}/{reps} {spec.name} {format_size(count * elsize)}")
                bufs = [
                    spec.buffers(count, dtype, device, rank, n, settings.redop, settings.root, for_check=False)
                    for _ in backends
                ]
                order = list(range(nb)) if (rep + pi) % 2 == 0 else list(reversed(range(nb)))
                calls = [_bind(spec, bufs[bi], groups[backends[bi].label], settings) for bi in range(nb)]
                # call: one call of each backend in turn (A B A B ...); block: all calls of A, then all of B.
                batches = [order] if settings.interleave == "call" else [[bi] for bi in order]
                for batch in batches:
                    dist.barrier(group=control)
                    for _ in range(settings.warmup):
                        for bi in batch:
                            calls[bi]()
                    sync()
                    measured = _time_calls([calls[bi] for bi in batch], sync, iters, clock)
                    for bi, t in zip(batch, measured):
                        times[pi, bi, rep] = torch.tensor(t, dtype=torch.float64)
                del calls
                del bufs
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=control)
    wrong = [
        _check(spec, settings, groups, rank, n, count, dtype, control) if settings.check else None
        for spec, count in plan
    ]
    injected = _injected_delays(backends, groups, plan)
    if rank != 0:
        return {}
    targets = _profile_targets(backends, groups, plan, elsize, n)
    rows = []
    for pi, (spec, count) in enumerate(plan):
        for bi, b in enumerate(backends):
            rows.append(
                {
                    "collective": spec.name,
                    "size_bytes": count * elsize,
                    "count": count,
                    "dtype": settings.dtype,
                    "redop": settings.redop if spec.reduces else "none",
                    "backend": b.label,
                    "times_us": [[round(t / 1e3, 3) for t in rep_times] for rep_times in times[pi, bi].tolist()],
                    "wrong": None if wrong[pi] is None else wrong[pi][bi],
                }
            )
    return {
        "rows": rows,
        "skipped": skipped,
        "backends": _backend_info(backends, groups),
        "injected_delay": injected,
        **({"profile_targets": targets} if targets else {}),
    }


def _check(spec, settings: Settings, groups: dict, rank: int, n: int, count: int, dtype, control) -> list[int]:
    """#wrong per backend: elements that differ from the expected result, summed over ranks."""
    import torch
    import torch.distributed as dist

    expected = spec.expected(count, rank, n, settings.redop, settings.root)
    wrong = []
    for b in settings.backends:
        inp, out = spec.buffers(count, dtype, settings.device, rank, n, settings.redop, settings.root, for_check=True)
        spec.run(inp, out, groups[b.label], settings.redop, settings.root)
        _sync_fn(settings.device)()
        wrong.append(spec.count_wrong(spec.result(inp, out), expected, settings.dtype, settings.redop))
    total = torch.tensor(wrong, dtype=torch.int64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=control)
    return total.tolist()


def _backend_info(backends: tuple[Backend, ...], groups: dict) -> list[dict[str, Any]]:
    """Each backend with, for delaycomm, its effective configuration (every option, resolved): the one its group was
    created with (a trace or profile file is not read again)."""
    from delaycomm import _registry

    info = []
    for b in backends:
        entry = {"label": b.label, "name": b.name, "options": dict(b.options)}
        if b.is_delaycomm:
            entry["config"] = jsonable(_registry.config_of(groups[b.label]).as_dict())
        info.append(entry)
    return info
