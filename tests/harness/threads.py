"""Ranks as threads of the test process, over one in-memory store, with the real Gloo and the real DelayBackend.

A group here is a ``torch.distributed.ProcessGroup`` built the way ``new_group`` builds one (a ``PrefixStore``
per group, the backend registered for CPU), without a default group: several "processes" live in one. Only the
rank table that ``dist.*`` functions use to translate ranks knows the groups (group rank = global rank). What
that rules out:

- functions that read the default group: ``dist.get_rank()`` without a group, ``new_group``,
  ``destroy_process_group``, functional collectives (they find groups by name in the default group's world).
- Process-wide settings: ``TORCH_DISTRIBUTED_DEBUG``, ``DELAYCOMM_*`` variables that differ per rank, faults that
  kill a process, DDP/FSDP, torchrun. Use :mod:`tests.harness.procs` for those.

A rank that raises makes the run fail at once with every rank's traceback (the other ranks get a short grace to
report theirs; a rank still blocked then is reported with the stack it is blocked in). Groups are created with the
run's timeout, so a rank left blocked ends by itself within that time.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["RankContext", "run_threads"]

_run_ids = itertools.count()
# After the first rank fails, how long the others get to report before the run is judged.
_GRACE_S = 5.0


class RankContext:
    """What one rank's function gets: its rank, the world size, the run's store, and a group factory."""

    def __init__(self, rank: int, world_size: int, store, run_name: str, timeout: timedelta):
        self.rank = rank
        self.world_size = world_size
        self.store = store
        self.timeout = timeout
        self._run_name = run_name
        self._count = 0
        self.groups: list[Any] = []

    def group(self, backend: str = "delaycomm", config=None, timeout: timedelta | None = None, **options):
        """A new group of every rank of the run, on ``backend`` (``"delaycomm"`` or ``"gloo"``).

        Every rank must create its groups in the same order (as with ``new_group``).

        Args:
            backend: ``"delaycomm"`` (the real DelayBackend over a real Gloo group) or ``"gloo"``.
            config: a :class:`delaycomm.DelayConfig` (delaycomm only); or give its keywords as ``**options``.
            timeout: the group's timeout (default: the run's).

        Returns:
            A ``torch.distributed.ProcessGroup`` usable with ``dist.*(..., group=g)`` and
            ``delaycomm.stats(g)``.
        """
        import torch
        import torch.distributed as dist

        index = self._count
        self._count += 1
        name = f"{self._run_name}-g{index}"
        timeout = timeout or self.timeout
        prefix = dist.PrefixStore(f"{name}/", self.store)
        pg = dist.ProcessGroup(prefix, self.rank, self.world_size)
        device_store = dist.PrefixStore("cpu/", prefix)
        if backend == "gloo":
            if config is not None or options:
                raise ValueError("tests.harness: options are for delaycomm groups, got a gloo group with options")
            inner = dist.ProcessGroupGloo(device_store, self.rank, self.world_size, timeout)
            inner._set_sequence_number_for_group()
            kind = dist.ProcessGroup.BackendType.GLOO
        elif backend == "delaycomm":
            from torch._C._distributed_c10d import _DistributedBackendOptions

            import delaycomm
            from delaycomm._backend import create_backend

            if options:
                if config is not None:
                    raise ValueError("tests.harness: pass config= or option keywords, not both")
                config = delaycomm.DelayConfig(**options)
            opts = _DistributedBackendOptions()
            opts.store = device_store
            opts.group_rank = self.rank
            opts.group_size = self.world_size
            opts.timeout = timeout
            # NOTE: delaycomm keeps a registry of live groups by name: each rank's backend gets its own name.
            opts.group_id = f"{name}-r{self.rank}"
            opts.global_ranks_in_group = list(range(self.world_size))
            inner = create_backend(opts, config)
            kind = dist.ProcessGroup.BackendType.CUSTOM
        else:
            raise ValueError(f"tests.harness: backend must be 'delaycomm' or 'gloo', got {backend!r}")
        pg._set_default_backend(kind)
        pg._register_backend(torch.device("cpu"), kind, inner)
        pg._set_group_name(f"{name}-r{self.rank}")
        # Group ranks are the global ranks of the run: functions that translate ranks (recv's src, P2POp's peer)
        # find the identity in torch's table, keyed by this rank's own group object.
        dist.distributed_c10d._world.pg_group_ranks[pg] = {r: r for r in range(self.world_size)}
        self.groups.append(pg)
        return pg

    def shutdown(self) -> None:
        """Shut down every group this rank made (as ``destroy_process_group`` does); errors are ignored."""
        import torch.distributed as dist

        for pg in reversed(self.groups):
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - a failed run is reported by its exception, not this one
                pass
            dist.distributed_c10d._world.pg_group_ranks.pop(pg, None)
        self.groups.clear()

    def abort(self) -> None:
        """Abort every group this rank made, so that peers blocked on this rank fail instead of waiting."""
        for pg in self.groups:
            try:
                pg.abort()
            except Exception:  # noqa: BLE001
                pass


def run_threads(
    fn: Callable[[RankContext], Any], world_size: int = 2, timeout: float = 60.0, group_timeout: float | None = None
) -> list[Any]:
    """Run ``fn(ctx)`` on ``world_size`` ranks (threads); return the results, by rank.

    Args:
        fn: called once per rank with its :class:`RankContext`; may be a closure.
        world_size: number of ranks.
        timeout: seconds for the whole run; past it the test fails naming the ranks still running and where.
        group_timeout: the timeout of the groups made by ``ctx.group`` (default: ``timeout``).

    Raises:
        AssertionError: a rank raised (every rank's traceback is in the message), or a rank did not finish in
            time (with the stack it is blocked in).
    """
    import torch.distributed as dist

    run_name = f"t{next(_run_ids)}"
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=group_timeout or timeout))
    ctxs = [
        RankContext(r, world_size, store, run_name, timedelta(seconds=group_timeout or timeout))
        for r in range(world_size)
    ]
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    done = threading.Condition()

    def body(ctx: RankContext) -> None:
        try:
            value = fn(ctx)
        except BaseException:  # noqa: BLE001 - reported with every other rank's outcome
            tb = traceback.format_exc()
            ctx.abort()
            with done:
                errors[ctx.rank] = tb
                done.notify_all()
            return
        try:
            ctx.shutdown()
        except BaseException:  # noqa: BLE001 - shutdown() ignores the groups' errors: this one is the harness's
            with done:
                errors[ctx.rank] = "after its function returned, shutting down its groups raised:\n" + (
                    traceback.format_exc()
                )
                done.notify_all()
            return
        with done:
            results[ctx.rank] = value
            done.notify_all()

    threads = [threading.Thread(target=body, args=(c,), name=f"{run_name}-rank{c.rank}", daemon=True) for c in ctxs]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    with done:
        while len(results) + len(errors) < world_size:
            now = time.monotonic()
            if errors:
                deadline = min(deadline, now + _GRACE_S)
            if now >= deadline:
                break
            done.wait(min(0.5, deadline - now))
    for t in threads:
        t.join(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
    stuck = {
        c.rank: t for c, t in zip(ctxs, threads) if t.is_alive() and c.rank not in results and c.rank not in errors
    }
    if stuck:
        frames = sys._current_frames()
        for ctx in ctxs:
            if ctx.rank in stuck:
                ctx.abort()
    if errors or stuck:
        parts = [f"--- rank {r} raised:\n{tb}" for r, tb in sorted(errors.items())]
        for r, t in sorted(stuck.items()):
            frame = frames.get(t.ident)
            where = "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)\n"
            parts.append(
                f"--- rank {r} still running after {'the grace period' if errors else f'{timeout:g} s'}, in:\n{where}"
            )
        head = (
            f"{len(errors)} of {world_size} rank(s) failed"
            if errors
            else f"ranks {sorted(stuck)} did not finish within {timeout:g} s (a hang)"
        )
        raise AssertionError(head + "\n" + "\n".join(parts))
    return [results[r] for r in range(world_size)]
