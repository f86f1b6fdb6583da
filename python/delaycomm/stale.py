"""Bounded staleness from Python: explicit keys, the DDP comm hook, and flush (docs/staleness.md).

The math lives in the native StalenessEngine (csrc/stale/); these functions only find the group's backend.
"""

import torch
import torch.distributed as dist

from delaycomm._registry import backend_of

__all__ = ["ddp_hook", "stale_allreduce", "flush"]


def _backend(group):
    return backend_of(group if group is not None else dist.group.WORLD)


def stale_allreduce(tensor: torch.Tensor, key: int, group=None, average: bool = False, async_op: bool = False):
    """All-reduce ``tensor`` in place as one step of the stream ``key`` under the group's staleness model.

    Under ``staleness=bsp`` this is a plain SUM (or AVG) all-reduce.

    Args:
        tensor: a dense floating tensor (every rank passes the same shape for the same key).
        key: the stream's id, an integer in [0, 2^40); the same on every rank.
        group: a delaycomm process group (default: the world).
        average: divide the sum by the group size.
        async_op: return the Work instead of waiting.

    Returns:
        The Work when ``async_op``, else None.

    Raises:
        ValueError: not a delaycomm group, a bad key or tensor.
        RuntimeError: under ``asp``, a late contribution beyond ``max_pending`` (raised on every rank alike).
        torch.distributed.DistBackendError: the SSP gate wait (the delay beyond S steps) exceeds the group's
            timeout, or the ranks could not agree on ``step_ms=auto`` within it.
    """
    if isinstance(key, bool) or not isinstance(key, int) or key < 0:
        raise ValueError(f"delaycomm: stale_allreduce: key must be an integer in [0, 2^40), got {key!r}")
    work = _backend(group).stale_allreduce(tensor, key, average)
    if async_op:
        return work
    work.wait()
    return None


def ddp_hook(process_group, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averages each bucket as its own stale stream, keyed by ``bucket.index()``.

    Use it when storage identity is not a reliable key (the default for plain ``all_reduce`` calls)::

        ddp.register_comm_hook(state=None, hook=delaycomm.ddp_hook)

    Args:
        process_group: the DDP state: a delaycomm process group, or None for the world.
        bucket: DDP's ``GradBucket``.

    Returns:
        A future completing with the bucket's averaged tensor.
    """
    tensor = bucket.buffer()
    work = _backend(process_group).stale_allreduce(tensor, int(bucket.index()), True)
    return work.get_future().then(lambda fut: fut.value()[0])


def flush(group=None) -> dict[int, torch.Tensor]:
    """Deliver every stale contribution still pending (collective: every rank calls it at the same point).

    Args:
        group: a delaycomm process group (default: the world).

    Returns:
        ``{key: delivered sum}`` for each key that had anything pending on any rank (what the next steps would
        have added, scaled as the stream is: divided by the group size for AVG streams such as ``ddp_hook``'s);
        empty under ``bsp``, under ``stale_policy=drop`` (nothing is kept) or when nothing is pending.
    """
    return dict(_backend(group).flush())
