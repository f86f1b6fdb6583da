"""delaycomm: a torch.distributed backend for training and testing under communication delay.

``import delaycomm`` registers ``backend="delaycomm"`` (so does ``import torch`` alone, through the
``torch.backends`` entry point). Gloo serves CPU tensors, NCCL CUDA tensors; every collective is measured.
"""

from __future__ import annotations

import torch.distributed  # noqa: F401  (registers the c10d classes that _C derives from)

from delaycomm import _build

_build.check_torch()  # the torch _C was built against is the one running, or an ImportError naming both
try:
    from delaycomm import _C  # noqa: F401
except ImportError as _error:
    raise _build.load_error(_error) from _error

from delaycomm import schedule  # noqa: F401  (delaycomm.schedule.EpochWarmup)
from delaycomm._backend import register
from delaycomm._config import DelayConfig, configure, resolve
from delaycomm._delay import DelayFit, DelaySampler, fit
from delaycomm._nccl import nccl_settings
from delaycomm._stats import report, reset_stats, stats
from delaycomm.stale import ddp_hook, flush, stale_allreduce

__version__ = "0.1.0"

__all__ = [
    "DelayConfig",
    "configure",
    "resolve",
    "nccl_settings",
    "stats",
    "reset_stats",
    "report",
    "DelaySampler",
    "DelayFit",
    "fit",
    "ddp_hook",
    "stale_allreduce",
    "flush",
    "__version__",
]

register()
