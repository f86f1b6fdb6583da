"""The stats file of each delaycomm group (docs/config.md, "Stats files"): named and checked when the group is
created, written when it is destroyed, or at interpreter exit for a group that never is.

A group's file must be one this process may replace: at creation its directory must exist, a file already there
must be a regular file of this user that is not read-only (delaycomm never replaces another user's file, nor one
made read-only), and a probe file must be creatable beside it. The write goes through the shared JSON writer
(``delaycomm._tools.output``: a temporary file in the same directory, then ``os.replace``); a write that fails all
the same (the path changed since) removes the temporary file and says so loudly: a ``RuntimeWarning`` and an error
in the log (the group is destroyed regardless).

A process that creates a group whose file it already used (a second init/destroy cycle) writes the next
``.cycle{C}`` file instead of overwriting the first; a torchrun restart adds ``.restart{N}`` (or fills
``{restart}``).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import stat
import threading
import warnings

from delaycomm import _registry
from delaycomm._config import EffectiveConfig, invalid_value, restart_count, shorten, stats_file
from delaycomm._stats import group_stats
from delaycomm._tools.output import check_writable, write_json

logger = logging.getLogger("delaycomm")

__all__ = ["target", "arm", "on_shutdown"]

_lock = threading.Lock()
# Group name -> stats path of the live groups whose stats are still to be written: at destroy, or at interpreter
# exit for a group never destroyed (PyTorch Lightning, and many scripts, exit without destroy_process_group).
_due: dict[str, str] = {}
# Stats path of a cycle-0 group -> the cycles of it this process has created (a re-created group's next file).
_cycles: dict[str, int] = {}


def target(cfg: EffectiveConfig, dist_opts, global_ranks: list[int], world: int) -> tuple[str, str] | None:
    """This rank's stats file for the group being created, checked replaceable now; and its cycle-0 path.

    Args:
        cfg: the group's options.
        dist_opts: torch's ``_DistributedBackendOptions`` of the group.
        global_ranks: the global rank of each member.
        world: the job's number of ranks.

    Returns:
        ``(path, first)``: the file to write, and the file of the group's first cycle in this process (the key
        :func:`arm` records); None when ``stats`` is none.

    Raises:
        ValueError: the file's directory does not exist, the path is not a regular file, belongs to another user or
            is read-only, or cannot be written.
    """
    if cfg.stats is None:
        return None
    default_group = not list(getattr(dist_opts, "global_ranks_in_group", None) or [])
    rank = global_ranks[dist_opts.group_rank]
    group = str(dist_opts.group_id)
    first = stats_file(cfg.stats, rank, group, world, default_group, restart_count())
    with _lock:
        cycle = _cycles.get(os.path.abspath(first), 0)
    path = stats_file(cfg.stats, rank, group, world, default_group, restart_count(), cycle)
    where = f"the file of rank {rank} in group {group!r}, {shorten(repr(path))},"

    def bad(why: str) -> ValueError:
        return invalid_value("stats", cfg.stats, cfg.origins["stats"], f"{where} {why}; expected a writable path")

    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise bad("is in a directory that does not exist")
    try:
        entry = os.lstat(path)
    except FileNotFoundError:
        entry = None
    except OSError as e:
        raise bad(f"cannot be examined ({e.strerror})") from None
    if entry is not None:
        if not os.path.isfile(path):
            raise bad("exists and is not a regular file")
        if entry.st_uid != os.geteuid():
            raise bad(
                f"exists and belongs to another user (uid {entry.st_uid}); delaycomm replaces the file when the group "
                "is destroyed and never replaces another user's file"
            )
        if stat.S_ISREG(entry.st_mode) and not entry.st_mode & stat.S_IWUSR:
            raise bad(
                f"exists and is read-only (mode {stat.S_IMODE(entry.st_mode):04o}); delaycomm replaces the file "
                "when the group is destroyed and never replaces a read-only file"
            )
    try:
        check_writable(path)  # a temporary file beside it, as write() makes first
    except OSError as e:
        raise bad(f"cannot be written ({e.strerror})") from None
    return path, first


def arm(group_name: str, stats: tuple[str, str] | None, backend) -> None:
    """Record a created group's stats file (from :func:`target`) and write it when the group shuts down."""
    path = None
    if stats is not None:
        path, first = stats
        with _lock:
            _due[group_name] = path
            key = os.path.abspath(first)
            _cycles[key] = _cycles.get(key, 0) + 1
    # The hook is given its backend when it runs: it must not keep it alive, nor revive it through a weak reference.
    backend._set_shutdown_hook(functools.partial(on_shutdown, group_name, path))


def on_shutdown(group_name: str, path: str | None, backend) -> None:
    """The group is being destroyed: forget it and write its stats file."""
    entry = _registry.live_backends().get(group_name)
    if entry is not None and entry[0] is backend:  # a newer group of that name keeps its stats due
        with _lock:
            _due.pop(group_name, None)
    _registry.remove(group_name, backend)
    from delaycomm import timeline  # DELAYCOMM_TRACE: the timeline so far (docs/telemetry.md, "Timeline")

    if backend is not None:
        backend._harvest_cuda_timings()  # the CUDA calls whose GPU time is known by now join the timeline
    timeline.on_shutdown()
    if backend is not None and path is not None:
        try:
            write(path, group_name, backend)
        except OSError as e:
            message = (
                f"delaycomm: the stats of group {group_name!r} were not written to {path!r}: {e} (the path was "
                "checked when the group was created and has changed since)"
            )
            logger.error("%s", message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)


@atexit.register
def _write_at_exit() -> None:
    """Writes the stats of the groups that were never destroyed (their shutdown hook never ran)."""
    live = _registry.live_backends()
    with _lock:
        due = [(name, path, live[name][0]) for name, path in _due.items() if name in live]
        _due.clear()
    for name, path, backend in due:
        try:
            write(path, name, backend)
        except Exception as e:  # noqa: BLE001 - at exit there is no caller to raise to
            logger.error("delaycomm: could not write the stats of group %r to %s at exit: %s", name, path, e)


def write(path: str, group_name: str, backend) -> None:
    """Write the group's stats as JSON to ``path``, atomically (a failed write leaves no temporary file).

    Raises:
        OSError: the file could not be written or put in place.
    """
    write_json(path, group_stats(backend, group_name))
    logger.info("delaycomm: wrote stats of group %r to %s", group_name, path)
