"""The live delaycomm groups of this process: who has which native backend, for stats(), report() and the hooks.

A group enters when its backend is created (delaycomm._backend.create_backend) and leaves when it shuts down
(destroy_process_group); :func:`backend_of` finds the backend behind any ProcessGroup.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from delaycomm import _C
from delaycomm._config import EffectiveConfig

__all__ = ["add", "remove", "live_backends", "backend_of", "config_of"]

_lock = threading.Lock()
# group name -> (DelayBackend, EffectiveConfig) of every live group.
_groups: dict[str, tuple[Any, EffectiveConfig]] = {}


def add(group_name: str, backend: Any, cfg: EffectiveConfig) -> None:
    """Record a new group's backend (a group of the same name that was not shut down is replaced)."""
    with _lock:
        _groups[group_name] = (backend, cfg)


def remove(group_name: str, backend: Any) -> None:
    """Forget ``group_name`` if ``backend`` is still the one recorded for it (a newer group of that name stays)."""
    with _lock:
        entry = _groups.get(group_name)
        if entry is not None and entry[0] is backend:
            del _groups[group_name]


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


def config_of(group) -> EffectiveConfig:
    """The resolved options of a live delaycomm group (its ``delay`` holds the parsed spec the group replays).

    Raises:
        ValueError: the group is not a live delaycomm group.
    """
    backend = backend_of(group)
    with _lock:
        for b, cfg in _groups.values():
            if b is backend:
                return cfg
    raise ValueError(f"delaycomm: group {getattr(group, 'group_name', group)!r} is not a live delaycomm group")
