"""The environment a run was measured in (the ``#`` header of the table and ``environment`` in the JSON)."""

from __future__ import annotations

import os
from typing import Any

from delaycomm._tools.machine import machine_info, versions
from delaycomm.bench.settings import Settings

__all__ = ["environment"]


def environment(settings: Settings) -> dict[str, Any]:
    """Versions, machine and settings that affect the numbers. Called on rank 0 of a run."""
    import torch

    import delaycomm

    env: dict[str, Any] = {
        "torch": torch.__version__,
        **versions(),
        "delaycomm_cuda_compiled": bool(delaycomm._C.cuda_compiled),
        "nccl": None,
        "machine": {**machine_info(), "gpu": None},
        "threads": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "torch": torch.get_num_threads()},
    }
    if settings.device == "cuda" and torch.cuda.is_available():
        v = torch.cuda.nccl.version()
        env["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        env["machine"]["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        env["nccl_settings"] = delaycomm.nccl_settings()
        env["nccl_env"] = {k: os.environ.get(k) for k in ("NCCL_ALGO", "NCCL_PROTO", "NCCL_BUFFSIZE")}
    return env
