"""Entry point of the ``torch.backends`` group: makes ``backend="delaycomm"`` available after ``import torch``.

NOTE: a top-level package of its own, not ``delaycomm._autoload``: importing a submodule of ``delaycomm`` would run
``delaycomm/__init__.py`` (and load the native module) in the middle of ``import torch``.

torch calls :func:`register` at the end of ``import torch`` (unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). It must be
cheap and must never break ``import torch``: it registers a creator that imports the compiled module only when a
process group is actually created, and it swallows (and logs) any error.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("delaycomm")


def _lazy_creator(dist_backend_opts, pg_options):
    from delaycomm._backend import create_backend

    return create_backend(dist_backend_opts, pg_options)


def register() -> None:
    """Register the ``delaycomm`` backend with torch.distributed without importing the native module."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        if "delaycomm" in dist.Backend.backend_list:
            return
        dist.Backend.register_backend("delaycomm", _lazy_creator, extended_api=True, devices=["cpu", "cuda"])
    except Exception:  # autoload must never break `import torch` (logged with the traceback)
        logger.warning("delaycomm: could not register the backend at torch import", exc_info=True)
