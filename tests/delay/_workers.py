"""Rank functions for the multi-process delay tests (real processes, real Gloo). Each returns plain data."""

from __future__ import annotations

import threading
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

import delaycomm
from delaycomm._registry import backend_of


def _init(rank: int, world_size: int, init_method: str, timeout_s: float = 30.0, **options) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # P99.99 > timeout warnings are checked elsewhere
        dist.init_process_group(
            "delaycomm",
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
            pg_options=delaycomm.DelayConfig(**options),
        )


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


def _inputs(rank: int, i: int, n: int = 33) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * i + rank)
    return torch.randn(n, generator=g)


# One entry per collective: name -> fn(group, rank, world_size, i) -> list of output tensors. Every op is issued
# async, so several are held back at once, then waited for.
def _c_all_reduce_sum(g, r, w, i):
    t = _inputs(r, i)
    return [t], dist.all_reduce(t, group=g, async_op=True)


def _c_all_reduce_max(g, r, w, i):
    t = _inputs(r, i)
    return [t], dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g, async_op=True)


def _c_broadcast(g, r, w, i):
    t = _inputs(r, i)
    return [t], dist.broadcast(t, src=i % w, group=g, async_op=True)


def _c_all_gather(g, r, w, i):
    outs = [torch.empty(33) for _ in range(w)]
    return outs, dist.all_gather(outs, _inputs(r, i), group=g, async_op=True)


def _c_all_gather_into_tensor(g, r, w, i):
    out = torch.empty(33 * w)
    return [out], dist.all_gather_into_tensor(out, _inputs(r, i), group=g, async_op=True)


def _c_reduce(g, r, w, i):
    t = _inputs(r, i)
    return ([t] if r == 0 else []), dist.reduce(t, dst=0, group=g, async_op=True)


def _c_gather(g, r, w, i):
    outs = [torch.empty(33) for _ in range(w)] if r == 0 else None
    return (outs or []), dist.gather(_inputs(r, i), gather_list=outs, dst=0, group=g, async_op=True)


def _c_scatter(g, r, w, i):
    out = torch.empty(33)
    ins = [_inputs(k, i) for k in range(w)] if r == 0 else None
    return [out], dist.scatter(out, scatter_list=ins, src=0, group=g, async_op=True)


def _c_all_to_all_single(g, r, w, i):
    out = torch.empty(8 * w)
    return [out], dist.all_to_all_single(out, _inputs(r, i, 8 * w), group=g, async_op=True)


def _c_send_recv(g, r, w, i):
    t = _inputs(r, i)
    if r == 0:
        return [], dist.isend(t, dst=1, group=g)
    out = torch.empty(33)
    return [out], dist.irecv(out, src=0, group=g)


def _c_barrier(g, r, w, i):
    return [], dist.barrier(group=g, async_op=True)


COLLECTIVES = {name[3:]: fn for name, fn in sorted(globals().items()) if name.startswith("_c_")}


def collectives_bitwise(rank, world_size, init_method, delay, fraction, rounds=2):
    """Every collective through a delayed delaycomm group and through plain Gloo: outputs bitwise equal."""
    _init(rank, world_size, init_method, delay=delay, delay_fraction=fraction, seed=11)
    gloo = dist.new_group(backend="gloo")
    mismatches, compared = [], 0
    for rnd in range(rounds):
        pending = []
        for k, (name, fn) in enumerate(COLLECTIVES.items()):
            i = rnd * 100 + k
            pending.append((name, fn(None, rank, world_size, i), fn(gloo, rank, world_size, i)))
        for name, (outs_d, work_d), (outs_g, work_g) in pending:
            work_d.wait()
            work_g.wait()
            for a, b in zip(outs_d, outs_g):
                compared += 1
                if not torch.equal(_bits(a), _bits(b)):
                    mismatches.append(name)
    s = delaycomm.stats(dist.group.WORLD)
    delayed = sum(op["delayed_calls"] for op in s["ops"].values())
    dist.destroy_process_group()
    return {"mismatches": mismatches, "compared": compared, "delayed": delayed}


def targeting(rank, world_size, init_method):
    """delay_ops / delay_ranks / fraction: which calls were delayed, against the schedule's own prediction."""
    _init(
        rank,
        world_size,
        init_method,
        delay="const:1ms",
        delay_fraction=0.5,
        delay_ranks="1",
        delay_ops="broadcast,all_reduce",
        seed=5,
    )
    backend = backend_of(dist.group.WORLD)
    predicted = {"allreduce": 0, "broadcast": 0, "allgather": 0}
    for i in range(60):
        t = torch.ones(4)
        kind = ("allreduce", "broadcast", "allgather")[i % 3]
        if kind == "allreduce":
            dist.all_reduce(t)
        elif kind == "broadcast":
            dist.broadcast(t, src=0)
        else:
            dist.all_gather([torch.empty(4) for _ in range(world_size)], t)
        predicted[kind] += int(backend.delay_ns_for(kind, i + 1) > 0)
    s = delaycomm.stats(dist.group.WORLD)["ops"]
    got = {k: s[k]["delayed_calls"] for k in predicted}
    delay_p50 = s["broadcast"]["delay"]["p50_us"] if got["broadcast"] else 0.0
    dist.destroy_process_group()
    return {"predicted": predicted, "got": got, "delay_p50_us": delay_p50}


def ddp_params(rank, world_size, init_method, steps=6):
    """DDP trained through a delayed group and an undelayed one from the same start: final parameters."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    groups = {
        "none": dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(delay="none")),
        "delayed": dist.new_group(
            backend="delaycomm",
            pg_options=delaycomm.DelayConfig(delay="lognormal:p50=3ms,p99=30ms", delay_fraction=0.5, seed=2),
        ),
    }
    params = {}
    for name, g in groups.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=g, bucket_cap_mb=0.001)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(steps):
            x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        params[name] = [p.detach().clone() for p in model.parameters()]
    delayed = sum(op["delayed_calls"] for op in delaycomm.stats(groups["delayed"])["ops"].values())
    equal = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(params["none"], params["delayed"]))
    dist.destroy_process_group()
    return {"equal": equal, "delayed": delayed}


def two_threads(rank, world_size, init_method, n=40):
    """Two threads take turns issuing async all-reduces; the delays differ per call; results must match order."""
    _init(rank, world_size, init_method, delay="exp:p99=20ms", delay_fraction=0.5, seed=9)
    turn = threading.Condition()
    state = {"next": 0}
    works: list = [None] * n
    tensors: list = [None] * n

    def issue(parity: int) -> None:
        for i in range(parity, n, 2):
            with turn:
                turn.wait_for(lambda i=i: state["next"] == i)
                t = torch.full((16,), float((rank + 1) * (i + 1)))
                tensors[i] = t
                works[i] = dist.all_reduce(t, async_op=True)
                state["next"] += 1
                turn.notify_all()

    threads = [threading.Thread(target=issue, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in works:
        w.wait()
    total = sum(r + 1 for r in range(world_size))
    wrong = [i for i in range(n) if not torch.all(tensors[i] == total * (i + 1))]
    delayed = delaycomm.stats(dist.group.WORLD)["ops"]["allreduce"]["delayed_calls"]
    dist.destroy_process_group()
    return {"wrong": wrong, "delayed": delayed}


def delay_beyond_timeout(rank, world_size, init_method):
    """Rank 0 holds its all-reduce back for 6 s; the group's timeout is 2 s: both ranks get an error, no hang."""
    _init(
        rank,
        world_size,
        init_method,
        timeout_s=2.0,
        delay="const:6s",
        delay_fraction=1.0,
        delay_ranks="0",
        delay_ops="allreduce",
    )
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        outcome = ("ok", "")
    except Exception as e:  # noqa: BLE001 - reported
        outcome = (type(e).__name__, str(e))
    elapsed = time.monotonic() - t0
    # NOTE: rank 0 stays until rank 1 has its outcome: a rank that returned is torn down (its held op issued at
    # destroy), which could complete rank 1's op before rank 1's own timeout. A store of its own, not the group.
    sync = dist.FileStore(init_method.removeprefix("file://") + ".sync", world_size)
    if rank == 1:
        sync.set("outcome", outcome[0])
    else:
        sync.wait(["outcome"], timedelta(seconds=20))
    return {"outcome": outcome, "elapsed": elapsed}


def destroy_pending(rank, world_size, init_method, n=8):
    """destroy_process_group() with delayed ops still held back: they are issued, the thread joins, no hang."""
    _init(rank, world_size, init_method, delay="const:400ms", delay_fraction=1.0, delay_ops="allreduce")
    backend = backend_of(dist.group.WORLD)
    tensors = [torch.full((8,), float(rank + 1)) for _ in range(n)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    pending_before = backend.pending_delayed_ops()
    dist.destroy_process_group()
    pending_after = backend.pending_delayed_ops()
    outcomes = []
    for w, t in zip(works, tensors):
        try:
            w.wait()
            outcomes.append("ok" if torch.all(t == sum(range(1, world_size + 1))) else "wrong")
        except Exception as e:  # noqa: BLE001 - a clean failure is acceptable, a hang is not
            outcomes.append(f"error: {e}")
    return {"pending_before": pending_before, "pending_after": pending_after, "outcomes": outcomes}


class _Handoff:
    """The control of a delayed call's timing: a thread that sleeps the delay, then wakes a caller that waits for it
    (two threads waking from a timed wait, as a delayed call's issuer and its caller do), timed by the caller."""

    def __init__(self) -> None:
        self.requests: list[float] = []
        self.wake = threading.Condition()
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self.wake:
                while not self.requests:
                    self.wake.wait()
                seconds = self.requests.pop()
            time.sleep(seconds)
            self.done.set()

    def __call__(self, seconds: float) -> float:
        self.done.clear()
        t0 = time.perf_counter()
        with self.wake:
            self.requests.append(seconds)
            self.wake.notify()
        self.done.wait()
        return time.perf_counter() - t0


def latency_shift(rank, world_size, init_method, n=40, delay_ms=20):
    """p50 all-reduce latency seen by every rank, without and with const delay on rank 0 only; and, interleaved
    with them so that the machine's load weighs on all alike, the p50 of the control (:class:`_Handoff`) of the
    same delay: its lateness is what a loaded machine adds to a delayed call."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    base = dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(delay="none"))
    slow = dist.new_group(
        backend="delaycomm",
        pg_options=delaycomm.DelayConfig(
            delay=f"const:{delay_ms}ms", delay_fraction=1.0, delay_ranks="0", delay_ops="allreduce"
        ),
    )
    t = torch.ones(1024)
    for g in (base, slow):
        for _ in range(3):
            dist.all_reduce(t, group=g)
        delaycomm.reset_stats(g)
    handoff, control = _Handoff(), []
    for _ in range(n):  # interleaved, so both see the same machine load
        dist.all_reduce(t, group=base)
        dist.all_reduce(t, group=slow)
        control.append(handoff(delay_ms * 1e-3))
    p50 = {
        name: delaycomm.stats(g)["ops"]["allreduce"]["latency"]["p50_us"]
        for name, g in (("base", base), ("slow", slow))
    }
    p50["control_late"] = (sorted(control)[n // 2] - delay_ms * 1e-3) * 1e6
    slow_ops = delaycomm.stats(slow)["ops"]["allreduce"]
    p50["injected"] = slow_ops["delay"]["p50_us"] if slow_ops["delayed_calls"] else 0.0
    p50["delayed"] = slow_ops["delayed_calls"]
    dist.destroy_process_group()
    return p50


def host_vs_network(rank, world_size, init_method, delay_ms=500):
    """How long the *call* takes (not its completion): host delay blocks the caller, network delay does not."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    out = {}
    for where in ("network", "host"):
        g = dist.new_group(
            backend="delaycomm",
            pg_options=delaycomm.DelayConfig(
                delay=f"const:{delay_ms}ms",
                delay_fraction=1.0,
                delay_ranks="0",
                delay_ops="allreduce",
                delay_where=where,
            ),
        )
        t = torch.ones(4)
        t0 = time.monotonic()
        w = dist.all_reduce(t, group=g, async_op=True)
        call_s = time.monotonic() - t0
        w.wait()
        out[where] = {"call_s": call_s, "done_s": time.monotonic() - t0, "value": t[0].item()}
    dist.destroy_process_group()
    return out


def slowdown(rank, world_size, init_method, steps=8, compute_s=0.02):
    """slowdown=0:3x: rank 0 blocks 2x the time between its collectives; rank 1 never blocks."""
    _init(rank, world_size, init_method, slowdown="0:3x")
    t = torch.ones(4)
    for _ in range(steps):
        time.sleep(compute_s)  # "compute"
        dist.all_reduce(t)
    s = delaycomm.stats(dist.group.WORLD)["slowdown"]
    report = delaycomm.report(dist.group.WORLD)
    dist.destroy_process_group()
    return {"calls": s["calls"], "p50_ms": s["blocked"]["p50_ms"], "min_ms": s["blocked"]["min_ms"], "report": report}


def inner_errors(rank, world_size, init_method):
    """An op the inner Gloo rejects, held back by a delay: its error reaches wait() and the future, as without
    delay; the group goes on."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    delayed = dist.new_group(
        backend="delaycomm",
        pg_options=delaycomm.DelayConfig(delay="const:50ms", delay_fraction=1.0, delay_ops="allreduce"),
    )
    plain = dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(delay="none"))
    out = {}
    t = torch.ones(4)
    work = dist.all_reduce(t, op=dist.ReduceOp.BAND, group=delayed, async_op=True)  # floats: Gloo refuses
    out["completed_before"] = work.is_completed()
    try:
        work.wait()
        out["wait"] = "ok"
    except Exception as e:  # noqa: BLE001
        out["wait"] = f"{type(e).__name__}: {e}"
    out["completed_after"] = work.is_completed()
    out["exception"] = work.exception() is not None
    try:
        work.get_future().wait()
        out["future"] = "ok"
    except Exception as e:  # noqa: BLE001
        out["future"] = f"{type(e).__name__}: {e}"
    dist.all_reduce(t, group=delayed)
    out["next_value"] = t[0].item()
    try:
        dist.all_reduce(t, op=dist.ReduceOp.BAND, group=plain, async_op=True).wait()
        out["undelayed"] = "ok"
    except Exception as e:  # noqa: BLE001
        out["undelayed"] = f"{type(e).__name__}: {e}"
    out["errors"] = delaycomm.stats(delayed)["ops"]["allreduce"]["errors"]
    dist.destroy_process_group()
    return out


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def memory_over_many_ops(rank, world_size, init_method, n=10_000):
    """10^4 delayed async all-reduces of fresh 16 KiB tensors: resident memory stays flat (works, futures and
    tensors are released once complete)."""
    _init(rank, world_size, init_method, delay="const:20us", delay_fraction=0.5, delay_ops="allreduce")
    backend = backend_of(dist.group.WORLD)

    def burst(count):
        works = []
        for _ in range(count):
            works.append(dist.all_reduce(torch.ones(4096), async_op=True))
            if len(works) == 64:
                for w in works:
                    w.wait()
                works.clear()
        for w in works:
            w.wait()

    burst(500)
    before = _rss_mb()
    burst(n)
    after = _rss_mb()
    delayed = delaycomm.stats(dist.group.WORLD)["ops"]["allreduce"]["delayed_calls"]
    pending = backend.pending_delayed_ops()
    dist.destroy_process_group()
    return {"growth_mb": after - before, "delayed": delayed, "pending": pending}


def match_mode(rank, world_size, init_method, n=80):
    """delay_mode=match against delay_mode=add and no delay, in one job (three groups, interleaved so that the
    machine's load weighs on each alike): each call timed by this script's own clock, 1 KiB and 4 MiB all-reduces
    interleaved. The delay: lognormal p50=3ms,p99=30ms on every call of rank 0 (so a call's target is that
    lognormal). A fourth group delays every rank in bursts (delay_burst=8 at delay_fraction=0.3): each rank's own
    delays, and its schedule of every rank, come back to be compared across ranks."""
    _init(rank, world_size, init_method)
    spec = dict(delay="lognormal:p50=3ms,p99=30ms", delay_fraction=1.0, delay_ranks="0")
    bursty = dict(delay="const:200us", delay_fraction=0.3, delay_burst=8, seed=5)
    groups = {
        "none": dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(delay="none")),
        "match": dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(delay_mode="match", **spec)),
        "add": dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(delay_mode="add", **spec)),
    }
    burst_group = dist.new_group(backend="delaycomm", pg_options=delaycomm.DelayConfig(**bursty))
    sizes = {"1KiB": 256, "4MiB": 1 << 20}
    times = {g: {s: [] for s in sizes} for g in groups}
    bufs = {s: torch.ones(numel) for s, numel in sizes.items()}
    for _ in range(n):
        for name, g in groups.items():
            for s, t in bufs.items():
                t0 = time.perf_counter()
                dist.all_reduce(t, group=g, async_op=True).wait()
                times[name][s].append(time.perf_counter() - t0)
        dist.all_reduce(bufs["1KiB"], group=burst_group)
    # The target of each call of the match group: rank 0's delay in the schedule (the only delayed rank), by the
    # group's sequence numbers 1, 2, ... (the sizes alternate).
    backend = backend_of(groups["match"])
    targets = [backend.delay_ns_for("allreduce", seq) * 1e-9 if rank == 0 else 0.0 for seq in range(1, 2 * n + 1)]
    mine = [backend_of(burst_group).delay_ns_for("allreduce", seq) for seq in range(1, n + 1)]
    schedule = delaycomm._C.DelaySchedule("const:200us", 0.3, 5, [], 8.0)
    everyones = [[schedule.delay_ns(r, 1, seq) for seq in range(1, n + 1)] for r in range(world_size)]
    out = {
        "times": times,
        "targets": {s: targets[i :: len(sizes)] for i, s in enumerate(sizes)},
        "match": delaycomm.stats(groups["match"])["ops"]["allreduce"]["match"],
        "delayed": {g: delaycomm.stats(groups[g])["ops"]["allreduce"]["delayed_calls"] for g in groups},
        "injected": {g: delaycomm.stats(groups[g])["ops"]["allreduce"]["delay"] for g in groups},
        "burst": {
            "mine": mine,
            "everyones": everyones,
            "delayed": delaycomm.stats(burst_group)["ops"]["allreduce"]["delayed_calls"],
        },
    }
    dist.destroy_process_group()
    return out
