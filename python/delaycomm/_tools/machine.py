"""Where a number was measured: host, CPU, cores, platform and the versions that affect it (one function for the
``#`` header of every tool's table and the ``machine`` / ``versions`` of every JSON record)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["cpu_model", "git_commit", "machine_info", "versions"]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` where there is one, else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    """The commit of the delaycomm checkout this package runs from (an editable install), else None."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def machine_info() -> dict[str, Any]:
    """Host, platform, CPU model, cores (all and those this process may run on) and load average."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def versions(packages: Sequence[str] = ()) -> dict[str, Any]:
    """Python's, delaycomm's (and its commit) and each of ``packages``' versions (None when not installed)."""
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    from delaycomm import __version__

    out["delaycomm"] = __version__
    out["delaycomm_commit"] = git_commit()
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out
