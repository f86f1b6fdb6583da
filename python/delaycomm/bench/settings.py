"""What a benchmark run measures: plain, picklable, JSON-able data shared by the CLI, the engine and the reports."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Backend", "Settings", "RAW_BACKENDS"]

# Backends that the bench runs as the "raw" reference (delaycomm wraps them).
RAW_BACKENDS = ("gloo", "nccl")


@dataclasses.dataclass(frozen=True)
class Backend:
    """One measured backend: a torch.distributed backend name plus, for delaycomm, its options.

    Attributes:
        label: the name shown in the table, the JSON and the plot (``delaycomm``, ``delaycomm[nccl_algo=ring]``).
        name: the ``torch.distributed`` backend (``delaycomm``, ``gloo``, ``nccl``).
        options: keywords of :class:`delaycomm.DelayConfig` (delaycomm only).
    """

    label: str
    name: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def is_delaycomm(self) -> bool:
        return self.name == "delaycomm"


@dataclasses.dataclass(frozen=True)
class Settings:
    """A run's parameters (see ``python -m delaycomm.bench --help`` for each)."""

    collectives: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str = "float32"
    redop: str = "sum"
    iters: int = 50
    warmup: int = 5
    repeats: int = 3
    interleave: str = "call"
    check: int = 1
    root: int = 0
    device: str = "cpu"
    backends: tuple[Backend, ...] = ()
    timeout_s: float = 300.0
    progress: bool = False

    @property
    def raw(self) -> Backend | None:
        """The raw reference backend (the first non-delaycomm one), or None."""
        return next((b for b in self.backends if not b.is_delaycomm), None)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["collectives"] = list(self.collectives)
        d["sizes"] = list(self.sizes)
        d["backends"] = [dataclasses.asdict(b) for b in self.backends]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Settings:
        d = dict(d)
        d["collectives"] = tuple(d["collectives"])
        d["sizes"] = tuple(int(s) for s in d["sizes"])
        d["backends"] = tuple(Backend(**b) for b in d["backends"])
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})
