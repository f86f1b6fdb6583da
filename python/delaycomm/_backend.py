"""The creator behind ``backend="delaycomm"``: builds the inner Gloo/NCCL groups and the native DelayBackend."""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import warnings
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from delaycomm import _C, _ops
from delaycomm._agree import agree
from delaycomm._config import EffectiveConfig, format_value, invalid_value, resolve, stats_file

logger = logging.getLogger("delaycomm")

__all__ = ["create_backend", "nccl_settings", "register", "live_backends", "backend_of"]

_lock = threading.Lock()
# group name -> (DelayBackend, EffectiveConfig) of every live group; stats() and report() read it. An entry leaves
# when its group shuts down (destroy_process_group).
_groups: dict[str, tuple[Any, EffectiveConfig]] = {}
# Group name -> stats path of the live groups whose stats are still to be written: at destroy, or at interpreter
# exit for a group never destroyed (PyTorch Lightning, and many scripts, exit without destroy_process_group).
_stats_due: dict[str, str] = {}
# What delaycomm set for NCCL, and what NCCL saw when its first communicator was possible.
_nccl_state: dict[str, Any] = {"set_by_us": {}, "first_values": None, "report": {}}


def register() -> None:
    """Register ``delaycomm`` with torch.distributed (idempotent)."""
    if "delaycomm" not in dist.Backend.backend_list:
        dist.Backend.register_backend("delaycomm", create_backend, extended_api=True, devices=["cpu", "cuda"])


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


def _apply_nccl_settings(cfg: EffectiveConfig) -> None:
    """Set NCCL_ALGO / NCCL_BUFFSIZE before the inner ProcessGroupNCCL exists (SPEC §6).

    A user's own variable wins and is reported. NCCL reads NCCL_ALGO when a communicator is created and caches
    NCCL_BUFFSIZE at its first read in the process: when NCCL may already be running, a changed value is reported
    as too late.
    """
    wanted = {"NCCL_ALGO": None if cfg.nccl_algo == "auto" else cfg.nccl_algo,
              "NCCL_BUFFSIZE": str(cfg.nccl_buffsize)}
    set_by_us = _nccl_state["set_by_us"]
    started = _nccl_state["first_values"] is not None or _other_nccl_groups_exist()
    report = {}
    for var, value in wanted.items():
        current = os.environ.get(var)
        if current is not None and set_by_us.get(var) != current:
            if value is not None and current != value:
                logger.info("delaycomm: %s=%s from the user's environment wins over delaycomm's %s", var, current, value)
            report[var] = {"value": current, "source": "user environment"}
            continue
        if value is None:
            if current is not None:  # we set it earlier, the new group asks for NCCL's own choice
                del os.environ[var]
                set_by_us.pop(var, None)
            report[var] = {"value": None, "source": "auto (NCCL's tuner)"}
            continue
        if started and current != value:
            first = (_nccl_state["first_values"] or {}).get(var)
            if var == "NCCL_BUFFSIZE":
                logger.warning(
                    "delaycomm: %s=%s is set too late: NCCL caches it at its first read in this process "
                    "(value then: %s); set nccl_buffsize before the first NCCL group", var, value, first)
            else:
                logger.warning(
                    "delaycomm: %s=%s applies to NCCL communicators created from now on; communicators that "
                    "exist keep %s", var, value, first)
        os.environ[var] = value
        set_by_us[var] = value
        report[var] = {"value": value, "source": "delaycomm (nccl_algo)" if var == "NCCL_ALGO"
                       else "delaycomm (nccl_buffsize)"}
    if _nccl_state["first_values"] is None:
        _nccl_state["first_values"] = {k: v["value"] for k, v in report.items()}
    _nccl_state["report"] = report


def nccl_settings() -> dict[str, Any]:
    """The NCCL settings in effect for delaycomm's NCCL groups.

    Returns:
        ``{"NCCL_ALGO": {"value", "source"}, "NCCL_BUFFSIZE": {...}, "nccl_version": str | None}``. Before any
        delaycomm NCCL group exists, the values that the next one would get (from the process-wide config and
        the environment).
    """
    report = dict(_nccl_state["report"])
    if not report:
        cfg = resolve()
        for var, value, name in (("NCCL_ALGO", None if cfg.nccl_algo == "auto" else cfg.nccl_algo, "nccl_algo"),
                                 ("NCCL_BUFFSIZE", str(cfg.nccl_buffsize), "nccl_buffsize")):
            if os.environ.get(var) is not None and _nccl_state["set_by_us"].get(var) != os.environ[var]:
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


def _make_nccl(store, rank: int, size: int, timeout: timedelta, dist_opts, cfg: EffectiveConfig):
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return None
    _apply_nccl_settings(cfg)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    opts.is_high_priority_stream = False
    try:
        opts.global_ranks_in_group = list(dist_opts.global_ranks_in_group)
        opts.group_name = str(dist_opts.group_id)
    except Exception:  # noqa: BLE001 - older torch
        pass
    return dist.ProcessGroupNCCL(dist.PrefixStore("delaycomm/nccl/", store), rank, size, opts)


def create_backend(dist_opts, pg_options):
    """The creator registered for ``backend="delaycomm"`` (extended API).

    Every rank of the group checks its options, then the ranks agree through the group's store that the options
    which must match do (delaycomm._agree) before any inner group exists: a bad value on one rank, or options
    that differ, raise on every rank.

    Args:
        dist_opts: torch's ``_DistributedBackendOptions`` (store, group_rank, group_size, timeout, group_id).
        pg_options: a :class:`delaycomm.DelayConfig` or None.

    Returns:
        The native ``DelayBackend``.

    Raises:
        ValueError: a bad option (named, with where it came from and what is accepted), on this rank or another;
            options that must match and differ across ranks (each named, with each rank's value).
        torch.distributed.DistStoreError: a rank of the group did not answer within the group's timeout.
    """
    if isinstance(pg_options, torch._C._distributed_c10d.Backend.Options):
        # torch may hand a group a copy of its parent's c10d Options: keep the process-wide config then.
        # Anything else that is not a DelayConfig is refused by resolve(), with the one message for it.
        pg_options = None
    store = dist_opts.store
    rank, size, timeout = dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout
    group_name = str(dist_opts.group_id)
    has_nccl = torch.cuda.is_available() and dist.is_nccl_available()
    cfg, stats_path, error = None, None, None
    try:
        cfg = resolve(pg_options)
        _check_group_config(cfg, rank, size, has_nccl)
        stats_path = stats_target(cfg, dist_opts)
    except ValueError as e:
        error = e
    agree(store, rank, size, timeout, group_name, _global_ranks(dist_opts), cfg, error)

    gloo = dist.ProcessGroupGloo(dist.PrefixStore("delaycomm/gloo/", store), rank, size, timeout)
    nccl = _make_nccl(store, rank, size, timeout, dist_opts, cfg)

    native = _C.BackendOptions()
    native.timeout = timeout
    native.group_name = group_name
    _fill_delay_options(native, cfg, rank, timeout)
    _fill_stale_options(native, cfg, store)
    backend = _C.DelayBackend(rank, size, gloo, nccl, native)
    backend._set_warning_hook(lambda msg: warnings.warn(msg, RuntimeWarning, stacklevel=2))

    with _lock:
        _groups[group_name] = (backend, cfg)
    backend_ref = weakref.ref(backend)  # the hook must not keep its own backend alive
    backend._set_shutdown_hook(lambda: _on_shutdown(group_name, stats_path, backend_ref()))
    if stats_path is not None:
        with _lock:
            _stats_due[group_name] = stats_path
    logger.info(
        "delaycomm: group %r rank %d/%d: %s", group_name, rank, size,
        ", ".join(f"{k}={v!r} ({cfg.sources[k]})" for k, v in cfg.values.items()),
    )
    return backend


_STALENESS = {"bsp": _C.Staleness.BSP, "ssp": _C.Staleness.SSP, "asp": _C.Staleness.ASP}
_STALE_POLICY = {"ema": _C.StalePolicy.EMA, "apply": _C.StalePolicy.APPLY, "drop": _C.StalePolicy.DROP}
_DELAY_WHERE = {"network": _C.DelayWhere.NETWORK, "host": _C.DelayWhere.HOST}


def _fill_stale_options(native, cfg: EffectiveConfig, store) -> None:
    """Copy the staleness options (validated by _config) into the native BackendOptions, typed."""
    mode, _, bound = cfg.staleness.partition(":")
    native.staleness = _STALENESS[mode]
    native.stale_bound = int(bound) if bound else 0
    native.stale_policy = _STALE_POLICY[cfg.stale_policy]
    native.ema_alpha = cfg.ema_alpha
    native.step_ms = cfg.step_ms if cfg.step_ms is not None else 0.0
    native.max_pending = cfg.max_pending
    native.store = dist.PrefixStore("delaycomm/stale/", store)


def _fill_delay_options(native, cfg: EffectiveConfig, rank: int, timeout: timedelta) -> None:
    """Copy the delay options (validated by _config) into the native BackendOptions, typed; warn when the tail
    reaches the group's timeout."""
    native.delay = cfg.delay
    native.delay_fraction = cfg.delay_fraction if cfg.delay != "none" else 0.0
    native.delay_ranks = list(cfg.delay_ranks) if cfg.delay_ranks is not None else []
    native.delay_ops = [_ops.BY_NAME[name].kind for name in cfg.delay_ops] if cfg.delay_ops is not None else []
    native.delay_where = _DELAY_WHERE[cfg.delay_where]
    native.seed = cfg.seed
    native.slowdown = dict(cfg.slowdown).get(rank, 1.0)
    if cfg.delay == "none" or native.delay_fraction == 0.0:
        return
    p9999 = _C.DelaySampler(cfg.delay).quantile(0.9999)
    if p9999 > timeout.total_seconds():
        warnings.warn(
            f"delaycomm: the delay {cfg.delay!r} has a P99.99 of {p9999:.3f} s, longer than the group's timeout of "
            f"{timeout.total_seconds():g} s: delayed collectives in that tail will fail with a timeout error "
            "(raise the timeout of init_process_group/new_group, or choose a lighter tail)",
            RuntimeWarning, stacklevel=3)


def _check_group_config(cfg: EffectiveConfig, rank: int, size: int, has_nccl: bool) -> None:
    """Checks that need the group (rank numbers) and options whose engines are not in this build."""
    if cfg.delay_ranks is not None:
        bad = [r for r in cfg.delay_ranks if r >= size]
        if bad:
            raise invalid_value("delay_ranks", list(cfg.delay_ranks), cfg.origins["delay_ranks"],
                                f"{'rank' if len(bad) == 1 else 'ranks'} {','.join(map(str, bad))} not in a group "
                                f"of {size}; expected ranks in [0, {size})")
    bad = [r for r, _ in cfg.slowdown if r >= size]
    if bad:
        raise invalid_value("slowdown", format_value("slowdown", cfg.slowdown), cfg.origins["slowdown"],
                            f"{'rank' if len(bad) == 1 else 'ranks'} {','.join(map(str, bad))} not in a group of "
                            f"{size}; expected ranks in [0, {size})")
    if has_nccl and cfg.delay != "none" and cfg.delay_fraction > 0 and cfg.delay_where == "network" \
            and not _C.cuda_compiled:
        raise invalid_value("delay_where", "network", cfg.origins["delay_where"],
                            "network delay of GPU collectives needs the CUDA sleep kernel and this build of "
                            "delaycomm has no CUDA sources; expected 'host', or a delaycomm built with nvcc")


def _global_ranks(dist_opts) -> list[int]:
    """The global rank of each rank of the group being created (torch passes none for the default group)."""
    ranks = list(getattr(dist_opts, "global_ranks_in_group", None) or [])
    return ranks if ranks else list(range(dist_opts.group_size))


def stats_target(cfg: EffectiveConfig, dist_opts) -> str | None:
    """This rank's stats file for the group being created, checked writable now (README "Stats files").

    Raises:
        ValueError: the file's directory does not exist, the path is not a regular file, or it cannot be written.
    """
    if cfg.stats is None:
        return None
    default_group = not list(getattr(dist_opts, "global_ranks_in_group", None) or [])
    rank = _global_ranks(dist_opts)[dist_opts.group_rank]
    world = dist_opts.group_size if default_group else dist.get_world_size()
    path = stats_file(cfg.stats, rank, str(dist_opts.group_id), world, default_group)
    where = f"the file of rank {rank} in group {str(dist_opts.group_id)!r}, {path!r},"

    def bad(why: str) -> ValueError:
        return invalid_value("stats", cfg.stats, cfg.origins["stats"], f"{where} {why}; expected a writable path")

    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise bad("is in a directory that does not exist")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise bad("exists and is not a regular file")
    probe = f"{path}.tmp{os.getpid()}"  # the name _write_stats writes first
    try:
        with open(probe, "x"):
            pass
        os.remove(probe)
    except OSError as e:
        raise bad(f"cannot be written ({e.strerror})") from None
    return path


def _on_shutdown(group_name: str, stats_path: str | None, backend) -> None:
    with _lock:
        entry = _groups.get(group_name)
        if entry is not None and entry[0] is backend:
            del _groups[group_name]
            _stats_due.pop(group_name, None)
    if backend is not None and stats_path is not None:
        _write_stats(stats_path, group_name, backend)


@atexit.register
def _write_stats_at_exit() -> None:
    """Writes the stats of the groups that were never destroyed (their shutdown hook never ran)."""
    with _lock:
        due = [(name, path, _groups[name][0]) for name, path in _stats_due.items() if name in _groups]
        _stats_due.clear()
    for name, path, backend in due:
        try:
            _write_stats(path, name, backend)
        except Exception as e:  # noqa: BLE001 - at exit there is no caller to raise to
            logger.warning("delaycomm: could not write the stats of group %r to %s at exit: %s", name, path, e)


def _write_stats(path: str, group_name: str, backend) -> None:
    from delaycomm._stats import group_stats

    data = group_stats(backend, group_name)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
    logger.info("delaycomm: wrote stats of group %r to %s", group_name, path)


def live_backends() -> dict[str, tuple[Any, EffectiveConfig]]:
    """Group name -> (DelayBackend, config) for every delaycomm group still alive."""
    with _lock:
        return dict(_groups)


def backend_of(group) -> Any:
    """The DelayBackend behind a ProcessGroup (unwrapping TORCH_DISTRIBUTED_DEBUG's wrapper).

    Raises:
        ValueError: the group is not a delaycomm group.
    """
    for device in ("cpu", "cuda"):
        try:
            b = group._get_backend(torch.device(device))
        except Exception:  # noqa: BLE001
            continue
        while b is not None and not isinstance(b, _C.DelayBackend):
            b = getattr(b, "wrapped_pg", None)
        if isinstance(b, _C.DelayBackend):
            return b
    raise ValueError(f"delaycomm: group {getattr(group, 'group_name', group)!r} is not a delaycomm group")
