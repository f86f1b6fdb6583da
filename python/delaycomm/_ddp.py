"""DDP communication hooks as staleness sees them (docs/staleness.md, "Which reductions go stale").

A DDP communication hook (fp16/bf16 compression, PowerSGD, a user's) reduces a new tensor on every call, and may
issue several reductions per bucket, some from future callbacks that run on the calling thread or on another one
depending on timing. The backend tells the bucket's gradient reduction from the hook's other reductions by the
bucket the hook is running on: :func:`install` wraps every hook registered on a DDP module so that, while the hook
runs, the calling thread is marked with the bucket's index and size (``stale/Recognition.hpp``). Only the first
reduction of the bucket's size in that scope can go stale (keyed by the bucket); the hook's other reductions, and
everything its callbacks issue, keep their delay as under bsp.

DDP's ``join()`` (uneven inputs): a joined rank shadows the active ranks' backward pass with all-reduces of zero
buckets (and of the used-parameter map), issued outside any backward pass. :func:`install` also marks the calling
thread while DDP issues them, so that they are recognised as a backward pass of their own: the same streams as the
active ranks' buckets, so the ranks' stale bookkeeping stays the same and ``flush()`` agrees.

NOTE: DDP registers a Python hook through ``torch.distributed._register_comm_hook`` (DDP's
``register_comm_hook``), and a joined rank shadows the backward pass in DDP's ``_match_all_reduce_for_bwd_pass``
and ``_match_unused_params_allreduce``: those are the functions wrapped. The hook's wrapper keeps its name,
signature and annotations (DDP checks them and logs the name). tests/stale/test_paths.py runs DDP with torch's
hooks and with join(), so a torch release that changes either fails there.
"""

from __future__ import annotations

import functools

import torch.distributed as dist

from delaycomm import _C

__all__ = ["install"]


def _scoped(hook):
    if getattr(hook, "__delaycomm_scoped__", False):
        return hook

    @functools.wraps(hook)
    def scoped(state, bucket):
        _C._ddp_bucket_enter(int(bucket.index()), int(bucket.buffer().numel()))
        try:
            return hook(state, bucket)
        finally:
            _C._ddp_bucket_exit()

    scoped.__delaycomm_scoped__ = True
    return scoped


def _shadowing(method, new_pass: bool):
    @functools.wraps(method)
    def shadowing(self, *args, **kwargs):
        _C._ddp_join_shadow_enter(new_pass)
        try:
            return method(self, *args, **kwargs)
        finally:
            _C._ddp_join_shadow_exit()

    shadowing.__delaycomm_scoped__ = True
    return shadowing


def _install_join_shadow() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    for name, new_pass in (("_match_all_reduce_for_bwd_pass", True), ("_match_unused_params_allreduce", False)):
        method = getattr(DDP, name, None)
        if method is not None and not getattr(method, "__delaycomm_scoped__", False):
            setattr(DDP, name, _shadowing(method, new_pass))


def install() -> None:
    """Wrap ``torch.distributed._register_comm_hook`` (once) so that every DDP hook runs in its bucket's scope, and
    DDP's join() shadow of the backward pass so that it is recognised as one."""
    _install_join_shadow()
    register = getattr(dist, "_register_comm_hook", None)
    if register is None or getattr(register, "__delaycomm_scoped__", False):
        return

    @functools.wraps(register)
    def register_comm_hook(reducer, state, hook):
        return register(reducer, state, _scoped(hook))

    register_comm_hook.__delaycomm_scoped__ = True
    dist._register_comm_hook = register_comm_hook
