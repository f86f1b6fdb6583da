"""Bounded staleness from Python: explicit keys, the DDP comm hook, and flush (docs/staleness.md).

The math lives in the native StalenessEngine (csrc/stale/); these functions only find the group's backend.
"""

import warnings

import torch
import torch.distributed as dist

from delaycomm._registry import backend_of, live_backends

__all__ = ["ddp_hook", "stale_allreduce", "flush", "FlushResult"]


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
    """DDP communication hook: averages each bucket, as DDP's default does, as a stale stream of its own.

    Register it as any hook::

        ddp.register_comm_hook(state=None, hook=delaycomm.ddp_hook)

    The stream is the bucket of this DDP module (``DDP #i bucket #b (comm hook, params ...)``: the module's ordinal,
    the bucket and its parameters), so two DDP modules on one group never share a stream. Plain DDP, without a hook,
    goes stale the same way (docs/staleness.md, "Which reductions go stale"); the hook is for scripts that register
    one. Under ``bsp``, or where the bucket cannot be recognised, the bucket is averaged fresh, with its delay.

    Args:
        process_group: the DDP state: a delaycomm process group, or None for the world.
        bucket: DDP's ``GradBucket``.

    Returns:
        A future completing with the bucket's averaged tensor.
    """
    tensor = bucket.buffer()
    work = _backend(process_group).stale_allreduce(tensor, None, True)
    return work.get_future().then(lambda fut: fut.value()[0])


class FlushResult(dict):
    """What :func:`flush` delivered: ``{key: tensor}`` per stream (a dict, as before), and per parameter.

    Attributes:
        grads: ``{parameter: gradient}``: each pending contribution as the gradient of the parameter it belongs to,
            shaped like that parameter's ``.grad`` on this rank (a DTensor for FSDP2's parameters; the local flat
            shard for FSDP1's), consumed as its owner consumes the stream (DDP's buckets, FSDP's post-divide, dtype
            and shards, HSDP's and HYBRID_SHARD's all-reduce across replicas).
        unapplied: the streams whose consumer delaycomm does not know (``stale_allreduce`` keys, a DDP
            communication hook other than torch's and ``ddp_hook``): their sums are in the dict only.
    """

    def __init__(self):
        super().__init__()
        self.grads: dict[torch.Tensor, torch.Tensor] = {}
        # The loss scale the gradients are at (GradScaler's current scale; 1 without one): apply them, then
        # scaler.step(optimizer) unscales them as it unscales the step's own gradients.
        self.loss_scale = 1.0
        self.unapplied: list[str] = []
        self._consumers: dict[torch.Tensor, object] = {}

    def apply(self) -> None:
        """Add every pending gradient into its parameter's ``.grad`` (creating it where it is None)."""
        for param, grad in self.grads.items():
            self._consumers[param].add_to_grad(param, grad)


def flush(group=None, *, into_grad: bool = False) -> FlushResult:
    """Deliver every stale contribution still pending (collective: every rank calls it at the same point).

    Args:
        group: a delaycomm process group; None (the default): every delaycomm group this rank belongs to, in the
            order they were created.
        into_grad: add the pending gradients into the parameters' ``.grad`` (``FlushResult.apply()``), e.g. before
            a last ``optimizer.step()``.

    Returns:
        A :class:`FlushResult`: ``{key: delivered sum}`` for each stream that had anything pending on any rank (what
        its next steps would have added, flat, the same shape on every rank: an all-reduce stream's sum, or this
        rank's shard of a reduce-scatter stream's; scaled as the stream is: divided by the group size for AVG
        streams), and ``.grads``, the same per parameter. Empty under ``bsp``, under ``stale_policy=drop`` (nothing
        is kept) or when nothing is pending.

    Raises:
        RuntimeError: the ranks' stale bookkeeping differs (docs/staleness.md, "Divergence"), on every rank.
        torch.distributed.DistBackendError: a rank did not call flush within the group's timeout.
    """
    from delaycomm import _C, _owners, _stalecheck

    if group is not None:
        backends = [(getattr(group, "group_name", ""), _backend(group))]
    else:
        backends = [(name, b) for name, (b, cfg) in live_backends().items() if cfg.staleness != "bsp"]
    result = FlushResult()
    result.loss_scale = _C._stale_loss_scale()
    pending: dict[int, torch.Tensor] = {}
    references: dict[int, torch.Tensor] = {}
    for _, backend in backends:
        for key, tensor, consumer, scatter, name, reference in backend.flush():
            c = _owners.consumer_of(consumer) if consumer >= 0 else None
            if reference is not None and c is not None and c.applies:
                references[c.id] = references.get(c.id, 0) + reference
                c.flushed_scatter = scatter
            if tensor is None:
                continue  # stale_check's reference only
            result[key] = tensor
            if c is None or not c.applies:
                result.unapplied.append(name or f"key {key}")
                continue
            pending[c.id] = pending.get(c.id, 0) + tensor
            c.flushed_scatter = scatter
    flushed = {name for name, _ in backends}
    for c in _owners.consumers():
        if group is not None and c.shard_group_name not in flushed:
            continue  # its shard group is not flushed now
        reduced = c.replica_reduce(pending.get(c.id))  # HSDP / HYBRID_SHARD: collective on every rank
        if reduced is not None:
            pending[c.id] = reduced
        if c.id in references:
            reduced = c.replica_reduce(references[c.id])
            if reduced is not None:
                references[c.id] = reduced
    for cid, tensor in pending.items():
        c = _owners.consumer_of(cid)
        for param, grad in c.grads(tensor, getattr(c, "flushed_scatter", False)):
            result.grads[param] = result.grads[param] + grad if param in result.grads else grad
            result._consumers[param] = c
    if _stalecheck.enabled() and backends:
        _check(references, result, backends)
    if into_grad:
        if result.unapplied:
            warnings.warn(
                f"delaycomm: flush(into_grad=True): {len(result.unapplied)} stream(s) have no consumer delaycomm "
                f"knows, so their pending sums are returned but not applied: {', '.join(result.unapplied)}",
                RuntimeWarning,
                stacklevel=2,
            )
        result.apply()
    return result


def _check(references: dict, result: FlushResult, backends) -> None:
    """stale_check: per parameter, consumed + pending == what bsp delivered (delaycomm._stalecheck)."""
    from delaycomm import _owners, _stalecheck

    want: dict[torch.Tensor, torch.Tensor] = {}
    for cid, tensor in references.items():
        c = _owners.consumer_of(cid)
        for param, grad in c.grads(tensor, getattr(c, "flushed_scatter", False)):
            want[param] = want[param] + grad if param in want else grad
    pending = {p: g / result.loss_scale for p, g in result.grads.items()}

    def agree(bad: bool) -> int:
        flag = torch.tensor([1.0 if bad else 0.0], dtype=torch.float64)
        backends[0][1].flush_allreduce(flag)
        return int(flag.item())

    _stalecheck.check_flush(want, pending, agree)
