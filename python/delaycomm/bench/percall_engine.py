"""The per-call cost engine: one process, world size 1, raw backend vs delaycomm, paired blocks of calls.

This module runs inside one measuring process (``python -m delaycomm.bench percall`` starts one per run, a fresh
interpreter, through :mod:`delaycomm._tools.launch`; :func:`run_process` is its entry) and returns that run's raw block
times; the statistics are in :mod:`~delaycomm.bench.percall_results`, the table in :mod:`~delaycomm.bench.percall`,
the gate in :mod:`~delaycomm.bench.gate`.

What is timed: a *block* is ``calls`` back-to-back calls of one path (below) through one group; its cost per call
is the process CPU time (every thread of the process: the caller, Gloo's or NCCL's workers, delaycomm's) and the
wall time spent from before its first call to after its last completed (a device synchronise on CUDA), divided by
``calls``. Blocks come in *pairs*, one through the raw group and one through the delaycomm group, back to back
with the order alternating from one pair to the next (raw first, then delaycomm first, ...): a pair's difference
is what delaycomm adds per call, measured within a few milliseconds on the same machine state. Each item (size,
path) gets ``blocks`` pairs; the items take turns block by block (repeat-major), so a burst of load spoils one
pair of several items rather than every pair of one.

NOTE: at world size 1 the inner collective does almost nothing, so the difference is the wrapper's own cost per
call (its Python dispatch, virtual calls, work objects, timestamps, histogram updates), free of network noise.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
import types
from collections.abc import Callable
from typing import Any

__all__ = ["PATHS", "Path", "measure", "work", "calibrate", "run_process"]


@dataclasses.dataclass(frozen=True)
class Path:
    """One way of calling a collective (one spec of the engine).

    Attributes:
        name: the key used in flags, JSON and tables.
        what: how a user's code reaches it.
        make: ``make(tensor, group) -> call``, a no-argument function making one call and waiting for it as this
            path's callers do.
    """

    name: str
    what: str
    make: Callable[[Any, Any], Callable[[], None]]


def _sync(t, group):
    import torch.distributed as dist

    return lambda: dist.all_reduce(t, group=group)


def _async_wait(t, group):
    import torch.distributed as dist

    return lambda: dist.all_reduce(t, group=group, async_op=True).wait()


def _future_then(t, group):
    import torch.distributed as dist

    def first(fut):
        return fut.value()[0]

    # NOTE: DDP's comm hooks return work.get_future().then(...), and the reducer waits on the chained future.
    return lambda: dist.all_reduce(t, group=group, async_op=True).get_future().then(first).wait()


PATHS = {
    p.name: p
    for p in (
        Path("sync", "dist.all_reduce(t)", _sync),
        Path("async_wait", "dist.all_reduce(t, async_op=True).wait()", _async_wait),
        Path(
            "future_then",
            "dist.all_reduce(t, async_op=True).get_future().then(f).wait() (DDP comm hooks)",
            _future_then,
        ),
    )
}


def work(iterations: int) -> None:
    """The injected slowdown: a fixed amount of work, like code added to the wrapper (see :func:`calibrate`)."""
    for _ in range(iterations):
        pass


def calibrate(us: float, trials: int = 7) -> dict[str, float]:
    """How many iterations of :func:`work` take ``us`` microseconds of CPU time on this machine when it is least busy.

    NOTE: a fixed amount of work, not a spin until a clock says ``us``: under load, real wrapper code costs more CPU
    time per call than on an idle core (its core is shared), and so does this. The fastest of ``trials`` timings
    is taken as the machine's speed. A clock-based spin would also overshoot by one clock read (over 1 µs for
    CLOCK_THREAD_CPUTIME_ID on this project's VM).
    """
    n = 200_000
    best = min(_cpu_ns(n) for _ in range(trials)) / n
    return {"inject_us": us, "iterations": round(us * 1e3 / best), "ns_per_iteration": round(best, 4)}


def _cpu_ns(n: int) -> int:
    t0 = time.thread_time_ns()
    work(n)
    return time.thread_time_ns() - t0


def _injected(call: Callable[[], None], iterations: int) -> Callable[[], None]:
    if iterations <= 0:
        return call

    def slowed() -> None:
        work(iterations)
        call()

    return slowed


def _block(call: Callable[[], None], calls: int, sync: Callable[[], None]) -> tuple[float, float]:
    """(CPU µs per call, wall µs per call) of ``calls`` back-to-back calls and the final synchronise."""
    c0, w0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(calls):
        call()
    sync()
    w1, c1 = time.perf_counter_ns(), time.process_time_ns()
    return (c1 - c0) / calls / 1e3, (w1 - w0) / calls / 1e3


def measure(spec: dict[str, Any], progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Measure one run in this process and return its raw block times.

    Args:
        spec: ``device`` (cpu / cuda), ``sizes`` (bytes), ``paths`` (names in :data:`PATHS`), ``calls`` per block,
            ``blocks`` (measured pairs per item), ``warmup_blocks`` (unrecorded pairs per item first),
            ``inject_us`` (work added before each delaycomm call, in µs of CPU time on this machine when least
            busy; 0 normally).
        progress: called as ``progress(done, total)`` after each round of blocks.

    Returns:
        ``{"items": [{"size_bytes", "path", "raw_cpu_us": [...], "dc_cpu_us": [...], "raw_wall_us": [...],
        "dc_wall_us": [...], "first": [...]}], "checks": {...}}``, one value per measured pair; ``first`` says which
        side ran first in each pair.

    Raises:
        RuntimeError: the delaycomm group is not a delaycomm backend, a result is wrong, or delaycomm's telemetry
            did not count every call (a wrapper that skipped work would look cheap).
    """
    import torch
    import torch.distributed as dist

    import delaycomm

    device = spec["device"]
    raw_name = "nccl" if device == "cuda" else "gloo"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        raw = dist.new_group(backend=raw_name)
        dc = dist.new_group(backend="delaycomm")
        be = type(dc._get_backend(torch.device(device))).__name__
        if be != "DelayBackend":
            raise RuntimeError(f"the delaycomm group's {device} backend is {be}, expected DelayBackend")
        injection = calibrate(spec["inject_us"]) if spec["inject_us"] > 0 else None
        items = _items(spec, raw, dc, injection["iterations"] if injection else 0)
        for it in items:  # first calls: connect, allocate, load kernels (not counted: the stats are reset)
            for c in it["calls"]:
                for _ in range(8):
                    c()
        sync()
        delaycomm.reset_stats(dc)
        calls_made = _rounds(items, spec, sync, progress)
        sync()
        checks = _check(items, dc, calls_made)
        checks = {"delaycomm_backend": be, "raw_backend": raw_name, **checks, "injection": injection}
        for it in items:
            del it["t"], it["calls"]
        return {"items": items, "checks": checks}
    finally:
        dist.destroy_process_group()


def _items(spec: dict[str, Any], raw, dc, iterations: int) -> list[dict[str, Any]]:
    """One item per (size, path): its two tensors, its two calls (raw, delaycomm) and empty result lists."""
    import torch

    device = spec["device"]
    paths = [PATHS[p] for p in spec["paths"]]
    items = []
    for size in spec["sizes"]:
        n = max(1, size // 4)
        for p in paths:
            # Ones: a SUM over one rank leaves them ones, whatever the number of calls (checked at the end).
            t_raw = torch.ones(n, dtype=torch.float32, device=device)
            t_dc = torch.ones(n, dtype=torch.float32, device=device)
            items.append(
                {
                    "size_bytes": n * 4,
                    "path": p.name,
                    "t": (t_raw, t_dc),
                    "calls": (p.make(t_raw, raw), _injected(p.make(t_dc, dc), iterations)),
                    "raw_cpu_us": [],
                    "dc_cpu_us": [],
                    "raw_wall_us": [],
                    "dc_wall_us": [],
                    "first": [],
                }
            )
    return items


def _rounds(
    items: list[dict[str, Any]],
    spec: dict[str, Any],
    sync: Callable[[], None],
    progress: Callable[[int, int], None] | None,
) -> int:
    """Run every round of paired blocks (repeat-major, order alternating); record the measured ones.

    Returns:
        The number of delaycomm calls made (every side of every round, warm-up rounds included).
    """
    calls, rounds = int(spec["calls"]), int(spec["warmup_blocks"]) + int(spec["blocks"])
    calls_made = 0
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside a block would charge one side with unrelated work
    try:
        for r in range(rounds):
            for k, it in enumerate(items):
                raw_first = (r + k) % 2 == 0
                order = (0, 1) if raw_first else (1, 0)
                res = {}
                for side in order:
                    res[side] = _block(it["calls"][side], calls, sync)
                calls_made += calls
                if r >= spec["warmup_blocks"]:
                    it["raw_cpu_us"].append(round(res[0][0], 4))
                    it["dc_cpu_us"].append(round(res[1][0], 4))
                    it["raw_wall_us"].append(round(res[0][1], 4))
                    it["dc_wall_us"].append(round(res[1][1], 4))
                    it["first"].append("raw" if raw_first else "delaycomm")
            if progress is not None:
                progress(r + 1, rounds)
    finally:
        if gc_was_enabled:
            gc.enable()
    return calls_made


def _check(items: list[dict[str, Any]], dc, calls_made: int) -> dict[str, Any]:
    """Every result still right, and delaycomm's telemetry counted every call; raise otherwise."""
    import delaycomm

    wrong = sum(int((t != 1).sum()) for it in items for t in it["t"])
    if wrong:
        raise RuntimeError(f"{wrong} elements changed: an all_reduce SUM over one rank must leave its input as it was")
    st = delaycomm.stats(dc)["ops"].get("allreduce", {})
    counted = st.get("calls", 0)
    if counted != calls_made:
        raise RuntimeError(f"delaycomm's telemetry counted {counted} all_reduce calls, the harness made {calls_made}")
    return {"wrong_elements": wrong, "delaycomm_calls_counted": counted, "delaycomm_calls_made": calls_made}


def _pin_process(cpu: int) -> None:
    """Every thread of this process, and every thread it starts from now on, on ``cpu`` alone.

    NOTE: the launcher's fresh interpreter has imported torch before the target runs, so threads may exist already;
    each is pinned by its id (``sched_setaffinity`` of one id acts on that thread only), and the threads started
    later (each group's Gloo worker) inherit the caller's mask.
    """
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    os.sched_setaffinity(0, {cpu})


def run_process(rank: int, nproc: int, post, spec: dict[str, Any]) -> dict[str, Any]:
    """One run in this fresh process (the target of :func:`delaycomm._tools.launch.run_ranks`, one rank).

    Pinned first when ``spec["pin_cpu"]`` names a CPU; then nothing configured: every ``DELAYCOMM_*`` variable is
    removed from this process's environment before delaycomm reads it (at group creation), and OpenMP gets one
    thread unless the caller chose otherwise.

    Returns:
        :func:`measure`'s result with the ``environment`` it was measured in.
    """
    if spec.get("pin_cpu") is not None:
        _pin_process(int(spec["pin_cpu"]))
    for k in [k for k in os.environ if k.startswith("DELAYCOMM_")]:
        del os.environ[k]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = measure(spec)
    from delaycomm.bench.environment import environment

    # environment() reads the device alone of a run's settings
    result["environment"] = environment(types.SimpleNamespace(device=spec["device"]))  # type: ignore[arg-type]
    return result
