"""The creator behind ``backend="delaycomm"``: builds the inner Gloo/NCCL groups and the native DelayBackend."""

from __future__ import annotations

import logging
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from delaycomm import _C, _ddp, _fsdp, _nccl, _owners, _registry, timeline
from delaycomm._agree import agree
from delaycomm._config import OPTIONS, EffectiveConfig, GroupView, format_value, group_seed, invalid_value, resolve
from delaycomm._stats import file as statsfile

logger = logging.getLogger("delaycomm")

__all__ = ["create_backend", "register", "group_seed"]


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
    members, world = _global_ranks(dist_opts), _world_size(dist_opts)
    cfg, stats, error = None, None, None
    try:
        cfg = resolve(pg_options)
        _check_group_config(cfg, world, has_nccl)
        stats = statsfile.target(cfg, dist_opts, members, world)
    except ValueError as e:
        error = e
    generation = agree(store, rank, size, timeout, group_name, members, cfg, error)
    # This creation's own keys: a restarted attempt (or a re-created group) that shares the store never reads an
    # earlier one's Gloo addresses or staleness records (docs/ecosystem.md, "torchrun restarts").
    store = dist.PrefixStore(f"delaycomm/{generation}/", store)

    gloo = dist.ProcessGroupGloo(dist.PrefixStore("delaycomm/gloo/", store), rank, size, timeout)
    nccl = _nccl.make_group(store, rank, size, timeout, dist_opts, cfg)

    native = _C.BackendOptions()
    native.timeout = timeout
    native.group_name = group_name
    _fill_delay_options(native, cfg, rank, timeout, members, every_rank=members == list(range(world)), world=world)
    _fill_stale_options(native, cfg, store)
    if cfg.staleness != "bsp":
        # The owners of gradient reductions (docs/staleness.md, "Which reductions go stale").
        _owners.install(check=cfg.stale_check)
        _ddp.install()
        _fsdp.install()
    elif cfg.update_stats:
        warnings.warn(
            "delaycomm: update_stats=1 measures the steps of the staleness engine, and staleness='bsp' has none: "
            "stats()['staleness']['update'] stays empty (set staleness='ssp:S' or 'asp'; docs/telemetry.md)",
            RuntimeWarning,
            stacklevel=2,
        )
    backend = _C.DelayBackend(rank, size, gloo, nccl, native)
    backend._set_warning_hook(lambda msg: warnings.warn(msg, RuntimeWarning, stacklevel=2))

    _registry.add(group_name, backend, cfg)
    statsfile.arm(group_name, stats, backend)
    timeline.arm(cfg.trace, cfg.trace_events, members[rank], world)  # DELAYCOMM_TRACE (docs/telemetry.md)
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


def _fill_stale_options(native, cfg: EffectiveConfig, store) -> None:
    """Copy the staleness options (validated and parsed by _config) into the native BackendOptions, typed."""
    stale = native.stale
    stale.mode = _STALENESS[cfg.staleness.mode]
    stale.bound = cfg.staleness.bound
    stale.policy = _STALE_POLICY[cfg.stale_policy]
    stale.alpha = cfg.ema_alpha
    stale.step_ms = cfg.step_ms if cfg.step_ms is not None else 0.0
    stale.max_pending = cfg.max_pending
    stale.update_stats = cfg.update_stats
    stale.check = cfg.stale_check
    native.store = dist.PrefixStore("delaycomm/stale/", store)


def _fill_delay_options(
    native,
    cfg: EffectiveConfig,
    rank: int,
    timeout: timedelta,
    members: list[int] | None = None,
    every_rank: bool = True,
    world: int | None = None,
) -> None:
    """Fill the native delay options (``native.delay``, a ``DelayOptions``) from the option table: each delay
    option names its field and its value there (``_config.Native``); warn when the tail reaches the group's timeout.

    ``delay_ranks`` and ``slowdown`` name global ranks (docs/config.md, "Ranks"); ``members`` are the group's
    global ranks (None: the default group, whose ranks are global), so the native options get the group ranks of
    the members named, and this rank's own slowdown. A group that is not every rank of the job in order draws its
    schedule from the seed mixed with its members: two disjoint subgroups with one seed do not delay in lockstep.
    """
    group = GroupView(rank, tuple(members) if members is not None else None, every_rank)
    delay = native.delay
    for opt in OPTIONS:
        if opt.native is not None:
            setattr(delay, opt.native.field, opt.native.value(cfg, group))
    if delay.spec.is_none or delay.fraction == 0.0:
        return
    if world is not None:
        _warn_profile_world(cfg, world)
    p9999 = delay.spec.quantile(0.9999)  # the parsed spec: its file is not read again
    if p9999 > timeout.total_seconds():
        warnings.warn(
            f"delaycomm: the delay {cfg.delay!r} has a P99.99 of {p9999:.3f} s, longer than the group's timeout of "
            f"{timeout.total_seconds():g} s: delayed collectives in that tail will fail with a timeout error "
            "(raise the timeout of init_process_group/new_group, or choose a lighter tail)",
            RuntimeWarning,
            stacklevel=3,
        )


def _warn_profile_world(cfg: EffectiveConfig, world: int) -> None:
    """A profile recorded at another world size replays as recorded: latency grows with the ranks, so say so,
    unless the profile was re-targeted to a scale (``metadata.retargeted``: docs/profile.md, docs/costmodel.md)."""
    meta = getattr(cfg.delay, "metadata", None)
    if not isinstance(meta, dict) or meta.get("retargeted"):
        return
    recorded = meta.get("world_size")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded != world:
        warnings.warn(
            f"delaycomm: the profile {cfg.delay!r} was recorded at a world size of {recorded} and is replayed at "
            f"{world}: its latencies are replayed as recorded, not scaled (re-target it to this scale with "
            f"`python -m delaycomm profile SOURCE --ranks {world} --nodes M -o FILE`: docs/profile.md)",
            RuntimeWarning,
            stacklevel=3,
        )


def _check_group_config(cfg: EffectiveConfig, world: int, has_nccl: bool) -> None:
    """Checks that need the job (rank numbers against the world size) and options whose engines are not in this
    build. Ranks name global ranks: one outside the group is fine, one outside the job is a mistake."""
    if cfg.delay_ranks is not None:
        bad = [r for r in cfg.delay_ranks if r >= world]
        if bad:
            raise invalid_value(
                "delay_ranks",
                format_value("delay_ranks", cfg.delay_ranks),
                cfg.origins["delay_ranks"],
                f"{'rank' if len(bad) == 1 else 'ranks'} {','.join(map(str, bad))} not in a job of {world} "
                f"{'rank' if world == 1 else 'ranks'}; expected global ranks in [0, {world})",
            )
    bad = [r for r, _ in cfg.slowdown if r >= world]
    if bad:
        raise invalid_value(
            "slowdown",
            format_value("slowdown", cfg.slowdown),
            cfg.origins["slowdown"],
            f"{'rank' if len(bad) == 1 else 'ranks'} {','.join(map(str, bad))} not in a job of {world} "
            f"{'rank' if world == 1 else 'ranks'}; expected global ranks in [0, {world})",
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


def _is_default_group(dist_opts) -> bool:
    return not list(getattr(dist_opts, "global_ranks_in_group", None) or [])


def _global_ranks(dist_opts) -> list[int]:
    """The global rank of each rank of the group being created (torch passes none for the default group)."""
    ranks = list(getattr(dist_opts, "global_ranks_in_group", None) or [])
    return ranks if ranks else list(range(dist_opts.group_size))


def _world_size(dist_opts) -> int:
    """The job's number of ranks: the default group's size (being created, or created before)."""
    if _is_default_group(dist_opts) or not dist.is_initialized():
        # NOTE: a group built by hand over its own store (tests/harness/threads.py) is its own world.
        return max(dist_opts.group_size, max(_global_ranks(dist_opts)) + 1)
    return dist.get_world_size()
