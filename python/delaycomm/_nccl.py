"""NCCL's environment for delaycomm's NCCL groups: NCCL_ALGO and NCCL_BUFFSIZE set before a communicator exists,
the user's own values respected, and what is in effect reported (docs/gpu.md, "NCCL settings"; docs/config.md).

NCCL reads NCCL_ALGO when a communicator is created and caches NCCL_BUFFSIZE at its first read in the process, so
the variables are set just before the inner ProcessGroupNCCL is made, and a value changed after NCCL may have
started is logged as too late.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from delaycomm._config import EffectiveConfig, resolve

logger = logging.getLogger("delaycomm")

__all__ = ["make_group", "nccl_settings"]

# What delaycomm set for NCCL, and what NCCL saw when its first communicator was possible.
_state: dict[str, Any] = {"set_by_us": {}, "first_values": None, "report": {}}


def _other_nccl_groups_exist() -> bool:
    """True when an NCCL process group not made by delaycomm exists (its communicators may already run)."""
    try:
        world = dist.distributed_c10d._world
        for pg in list(world.pg_map):
            try:
                if pg._get_backend(torch.device("cuda")).__class__.__name__ == "ProcessGroupNCCL":
                    return True
            except Exception:  # noqa: BLE001 - a group without a cuda backend
                continue
    except Exception:  # noqa: BLE001
        return False
    return False


def _apply_settings(cfg: EffectiveConfig) -> None:
    """Set NCCL_ALGO / NCCL_BUFFSIZE before the inner ProcessGroupNCCL exists (docs/config.md, ``nccl_algo``).

    A user's own variable wins and is reported. NCCL reads NCCL_ALGO when a communicator is created and caches
    NCCL_BUFFSIZE at its first read in the process: when NCCL may already be running, a changed value is reported
    as too late.
    """
    wanted = {"NCCL_ALGO": None if cfg.nccl_algo == "auto" else cfg.nccl_algo, "NCCL_BUFFSIZE": str(cfg.nccl_buffsize)}
    set_by_us = _state["set_by_us"]
    started = _state["first_values"] is not None or _other_nccl_groups_exist()
    report = {}
    for var, value in wanted.items():
        current = os.environ.get(var)
        if current is not None and set_by_us.get(var) != current:
            if value is not None and current != value:
                logger.info(
                    "delaycomm: %s=%s from the user's environment wins over delaycomm's %s", var, current, value
                )
            report[var] = {"value": current, "source": "user environment"}
            continue
        if value is None:
            if current is not None:  # we set it earlier, the new group asks for NCCL's own choice
                del os.environ[var]
                set_by_us.pop(var, None)
            report[var] = {"value": None, "source": "auto (NCCL's tuner)"}
            continue
        if started and current != value:
            first = (_state["first_values"] or {}).get(var)
            if var == "NCCL_BUFFSIZE":
                logger.warning(
                    "delaycomm: %s=%s is set too late: NCCL caches it at its first read in this process "
                    "(value then: %s); set nccl_buffsize before the first NCCL group",
                    var,
                    value,
                    first,
                )
            else:
                logger.warning(
                    "delaycomm: %s=%s applies to NCCL communicators created from now on; communicators that "
                    "exist keep %s",
                    var,
                    value,
                    first,
                )
        os.environ[var] = value
        set_by_us[var] = value
        report[var] = {
            "value": value,
            "source": "delaycomm (nccl_algo)" if var == "NCCL_ALGO" else "delaycomm (nccl_buffsize)",
        }
    if _state["first_values"] is None:
        _state["first_values"] = {k: v["value"] for k, v in report.items()}
    _state["report"] = report


def nccl_settings() -> dict[str, Any]:
    """The NCCL settings in effect for delaycomm's NCCL groups.

    Returns:
        ``{"NCCL_ALGO": {"value", "source"}, "NCCL_BUFFSIZE": {...}, "nccl_version": str | None}``. Before any
        delaycomm NCCL group exists, the values that the next one would get (from the process-wide config and
        the environment).
    """
    report = dict(_state["report"])
    if not report:
        cfg = resolve()
        for var, value, name in (
            ("NCCL_ALGO", None if cfg.nccl_algo == "auto" else cfg.nccl_algo, "nccl_algo"),
            ("NCCL_BUFFSIZE", str(cfg.nccl_buffsize), "nccl_buffsize"),
        ):
            if os.environ.get(var) is not None and _state["set_by_us"].get(var) != os.environ[var]:
                report[var] = {"value": os.environ[var], "source": "user environment"}
            elif value is None:
                report[var] = {"value": None, "source": "auto (NCCL's tuner)"}
            else:
                report[var] = {"value": value, "source": f"delaycomm ({name}), not applied yet"}
    version = None
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()
            version = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001
            version = None
    report["nccl_version"] = version
    return report


def make_group(store, rank: int, size: int, timeout: timedelta, dist_opts, cfg: EffectiveConfig):
    """The inner ProcessGroupNCCL of a delaycomm group, NCCL's environment set first; None without CUDA/NCCL."""
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return None
    _apply_settings(cfg)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    opts.is_high_priority_stream = False
    try:
        opts.global_ranks_in_group = list(dist_opts.global_ranks_in_group)
        opts.group_name = str(dist_opts.group_id)
    except Exception:  # noqa: BLE001 - older torch
        pass
    return dist.ProcessGroupNCCL(dist.PrefixStore("delaycomm/nccl/", store), rank, size, opts)
