"""DDP communication hooks as staleness sees them (docs/staleness.md, "Which reductions go stale").

A DDP communication hook (fp16/bf16 compression, PowerSGD, a user's) reduces a new tensor on every call, and may
issue several reductions per bucket, some from future callbacks that run on the calling thread or on another one
depending on timing. The backend tells the bucket's gradient reduction from the hook's other reductions by the
bucket the hook is running on: :func:`install` wraps every hook registered on a DDP module so that, while the hook
runs, the calling thread is marked with the bucket's index and size (``stale/Recognition.hpp``). Only the first
reduction of the bucket's size in that scope can go stale (keyed by the bucket); the hook's other reductions, and
everything its callbacks issue, keep their delay as under bsp.

NOTE: DDP registers a Python hook through ``torch.distributed._register_comm_hook`` (DDP's
``register_comm_hook``); that is the one function wrapped. The wrapper keeps the hook's name, signature and
annotations (DDP checks them and logs the name). tests/stale/test_paths.py runs DDP with torch's hooks, so a torch
release that registers hooks another way fails there.
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


def install() -> None:
    """Wrap ``torch.distributed._register_comm_hook`` (once) so that every DDP hook runs in its bucket's scope."""
    register = getattr(dist, "_register_comm_hook", None)
    if register is None or getattr(register, "__delaycomm_scoped__", False):
        return

    @functools.wraps(register)
    def register_comm_hook(reducer, state, hook):
        return register(reducer, state, _scoped(hook))

    register_comm_hook.__delaycomm_scoped__ = True
    dist._register_comm_hook = register_comm_hook
