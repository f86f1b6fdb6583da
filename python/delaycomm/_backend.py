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

import torch
import torch.distributed as dist

from delaycomm import _C, _ddp, _nccl, _ops, _registry
from delaycomm._agree import agree
from delaycomm._config import EffectiveConfig, format_value, invalid_value, resolve, stats_file
from delaycomm._stats import group_stats

logger = logging.getLogger("delaycomm")

__all__ = ["create_backend", "register", "stats_target"]

_lock = threading.Lock()
# Group name -> stats path of the live groups whose stats are still to be written: at destroy, or at interpreter
# exit for a group never destroyed (PyTorch Lightning, and many scripts, exit without destroy_process_group).
_stats_due: dict[str, str] = {}


def register() -> None:
    """Register ``delaycomm`` with torch.distributed (idempotent)."""
    if "delaycomm" not in dist.Backend.backend_list:
        dist.Backend.register_backend("delaycomm", create_backend, extended_api=True, devices=["cpu", "cuda"])


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
    nccl = _nccl.make_group(store, rank, size, timeout, dist_opts, cfg)

    native = _C.BackendOptions()
    native.timeout = timeout
    native.group_name = group_name
    _fill_delay_options(native, cfg, rank, timeout)
    _fill_stale_options(native, cfg, store)
    if cfg.staleness != "bsp":
        _ddp.install()  # DDP hooks run in their bucket's scope (docs/staleness.md, "Which reductions go stale")
    backend = _C.DelayBackend(rank, size, gloo, nccl, native)
    backend._set_warning_hook(lambda msg: warnings.warn(msg, RuntimeWarning, stacklevel=2))

    _registry.add(group_name, backend, cfg)
    backend_ref = weakref.ref(backend)  # the hook must not keep its own backend alive
    backend._set_shutdown_hook(lambda: _on_shutdown(group_name, stats_path, backend_ref()))
    if stats_path is not None:
        with _lock:
            _stats_due[group_name] = stats_path
    logger.info(
        "delaycomm: group %r rank %d/%d: %s",
        group_name,
        rank,
        size,
        ", ".join(f"{k}={v!r} ({cfg.sources[k]})" for k, v in cfg.values.items()),
    )
    return backend


_STALENESS = {"bsp": _C.Staleness.BSP, "ssp": _C.Staleness.SSP, "asp": _C.Staleness.ASP}
_STALE_POLICY = {"ema": _C.StalePolicy.EMA, "apply": _C.StalePolicy.APPLY, "drop": _C.StalePolicy.DROP}
_DELAY_WHERE = {"network": _C.DelayWhere.NETWORK, "host": _C.DelayWhere.HOST}


def _fill_stale_options(native, cfg: EffectiveConfig, store) -> None:
    """Copy the staleness options (validated and parsed by _config) into the native BackendOptions, typed."""
    stale = native.stale
    stale.mode = _STALENESS[cfg.staleness.mode]
    stale.bound = cfg.staleness.bound
    stale.policy = _STALE_POLICY[cfg.stale_policy]
    stale.alpha = cfg.ema_alpha
    stale.step_ms = cfg.step_ms if cfg.step_ms is not None else 0.0
    stale.max_pending = cfg.max_pending
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
            RuntimeWarning,
            stacklevel=3,
        )


def _check_group_config(cfg: EffectiveConfig, rank: int, size: int, has_nccl: bool) -> None:
    """Checks that need the group (rank numbers) and options whose engines are not in this build."""
    if cfg.delay_ranks is not None:
        bad = [r for r in cfg.delay_ranks if r >= size]
        if bad:
            raise invalid_value(
                "delay_ranks",
                list(cfg.delay_ranks),
                cfg.origins["delay_ranks"],
                f"{'rank' if len(bad) == 1 else 'ranks'} {','.join(map(str, bad))} not in a group "
                f"of {size}; expected ranks in [0, {size})",
            )
    bad = [r for r, _ in cfg.slowdown if r >= size]
    if bad:
        raise invalid_value(
            "slowdown",
            format_value("slowdown", cfg.slowdown),
            cfg.origins["slowdown"],
            f"{'rank' if len(bad) == 1 else 'ranks'} {','.join(map(str, bad))} not in a group of "
            f"{size}; expected ranks in [0, {size})",
        )
    if (
        has_nccl
        and cfg.delay != "none"
        and cfg.delay_fraction > 0
        and cfg.delay_where == "network"
        and not _C.cuda_compiled
    ):
        raise invalid_value(
            "delay_where",
            "network",
            cfg.origins["delay_where"],
            "network delay of GPU collectives needs the CUDA sleep kernel and this build of "
            "delaycomm has no CUDA sources; expected 'host', or a delaycomm built with nvcc",
        )


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
    entry = _registry.live_backends().get(group_name)
    if entry is not None and entry[0] is backend:  # a newer group of that name keeps its stats due
        with _lock:
            _stats_due.pop(group_name, None)
    _registry.remove(group_name, backend)
    if backend is not None and stats_path is not None:
        _write_stats(stats_path, group_name, backend)


@atexit.register
def _write_stats_at_exit() -> None:
    """Writes the stats of the groups that were never destroyed (their shutdown hook never ran)."""
    live = _registry.live_backends()
    with _lock:
        due = [(name, path, live[name][0]) for name, path in _stats_due.items() if name in live]
        _stats_due.clear()
    for name, path, backend in due:
        try:
            _write_stats(path, name, backend)
        except Exception as e:  # noqa: BLE001 - at exit there is no caller to raise to
            logger.warning("delaycomm: could not write the stats of group %r to %s at exit: %s", name, path, e)


def _write_stats(path: str, group_name: str, backend) -> None:
    data = group_stats(backend, group_name)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
    logger.info("delaycomm: wrote stats of group %r to %s", group_name, path)
