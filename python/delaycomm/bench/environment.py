"""The environment a run was measured in (the ``#`` header of the table and ``environment`` in the JSON)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from typing import Any

from delaycomm.bench.settings import Settings

__all__ = ["environment", "cpu_model"]


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    """The commit of the delaycomm checkout the bench runs from, when it runs from one (editable install)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(settings: Settings) -> dict[str, Any]:
    """Versions, machine and settings that affect the numbers. Called on rank 0 of a run."""
    import torch

    import delaycomm

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "delaycomm": delaycomm.__version__,
        "delaycomm_commit": _git_commit(),
        "delaycomm_cuda_compiled": bool(delaycomm._C.cuda_compiled),
        "python": sys.version.split()[0],
        "nccl": None,
        "machine": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "gpu": None,
        },
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
