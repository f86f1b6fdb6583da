"""Consistency models: BSP, SSP with a lead bound (``lead:S``) and ASP, and the SSP gate.

Clocks. ``pushed[i]`` counts the gradients worker ``i`` has finished and sent;
``applied[i]`` counts those the server has applied. Without network delay the
two are equal.

The SSP rule (the seed's "applied-steps" form, see docs/sim.md): worker ``i``
may begin computing its next gradient only if, once that gradient is applied,
it is at most ``s`` applied steps ahead of the slowest worker::

    pushed[i] + 1 - min_j applied[j] <= s

It is spelled ``lead:S``, ``S >= 1`` (with ``S = 0`` no worker could ever
start). NOTE: not ``ssp:S``: the backend's ``staleness=ssp:S`` is another bound
(a contribution at most S steps late, docs/staleness.md), and the simulator refuses
that spelling rather than read it as a different rule. Ho et al.'s clock rule
"a worker at clock c waits until the slowest has reached c - s" is the same
gate with ``s`` one smaller: lead:S == Ho SSP(S - 1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

__all__ = ["ConsistencyModel", "parse_model", "staleness_bound"]

_ACCEPTED = "'bsp', 'asp', 'lead:S' with an integer S >= 1, or 'lead:inf' (ASP)"


@dataclasses.dataclass(frozen=True)
class ConsistencyModel:
    """One consistency model.

    Attributes:
        kind: ``"bsp"``, ``"ssp"`` or ``"asp"``.
        bound: The lead bound ``s`` of ``lead:s`` (``None`` for BSP and ASP).
    """

    kind: str
    bound: int | None = None

    @property
    def label(self) -> str:
        """Spec-style name: ``bsp``, ``lead:2``, ``asp``."""
        return f"lead:{self.bound}" if self.kind == "ssp" else self.kind

    @property
    def title(self) -> str:
        """Human name as in seed 002's table."""
        if self.kind == "bsp":
            return "sync (BSP)"
        if self.kind == "asp":
            return "async (ASP)"
        return f"SSP lead:{self.bound}"

    def may_start(self, worker: int, pushed: Sequence[int], applied: Sequence[int]) -> bool:
        """Whether ``worker`` may begin its next gradient now (SSP and ASP).

        Args:
            worker: The worker asking.
            pushed: Gradients each worker has finished and sent.
            applied: Gradients of each worker the server has applied.

        Returns:
            True if the gate lets it start. BSP is gated by its barrier in the
            engine, not here, and always returns False.
        """
        if self.kind == "asp":
            return True
        if self.kind == "bsp":
            return False
        return pushed[worker] + 1 - min(applied) <= self.bound


def parse_model(spec: str) -> ConsistencyModel:
    """Parse a consistency-model spec.

    Args:
        spec: ``bsp``, ``asp``, ``lead:S`` (S an integer >= 1) or
            ``lead:inf`` (ASP).

    Returns:
        The model.

    Raises:
        ValueError: If ``spec`` is not one of the accepted forms.
    """
    if not isinstance(spec, str):
        raise ValueError(f"parse_model: model must be a string ({_ACCEPTED}), got {spec!r}")
    text = spec.strip().lower()
    if text in ("bsp", "sync"):
        return ConsistencyModel("bsp")
    if text in ("asp", "async"):
        return ConsistencyModel("asp")
    if text.startswith("ssp:"):
        raise ValueError(
            f"parse_model: {spec!r} is the backend's staleness bound (a contribution at most S steps late); the "
            f"simulator's SSP gate is 'lead:S' (a worker at most S applied steps ahead of the slowest, seed "
            f"002's rule; docs/sim.md): expected {_ACCEPTED}"
        )
    if text.startswith("lead:"):
        arg = text[5:].strip()
        if arg in ("inf", "infinity", "∞"):
            return ConsistencyModel("asp")
        try:
            bound = int(arg)
        except ValueError:
            raise ValueError(f"parse_model: bad lead bound in {spec!r}: expected {_ACCEPTED}") from None
        if bound < 1:
            raise ValueError(
                f"parse_model: lead bound must be >= 1 (with 0 no worker could start; a barrier is 'bsp'), "
                f"got {bound} in {spec!r}"
            )
        return ConsistencyModel("ssp", bound)
    raise ValueError(f"parse_model: unknown consistency model {spec!r}: expected {_ACCEPTED}")


def staleness_bound(model: ConsistencyModel, workers: int, network_delay: bool = False) -> float:
    """Largest staleness the model allows.

    Staleness of an update is the number of updates the server applied
    between the read of the weights its gradient was computed on and its own
    application. Under lead:s another worker ``j`` can apply at most
    ``2s - 1`` updates while worker ``i`` computes (``j`` may start from
    ``i``'s clock minus ``s - 1`` and may reach ``i``'s clock plus ``s``), and
    with network delay up to ``s - 1`` of ``i``'s own earlier updates may
    still be in flight, hence::

        tau_max = (N - 1) * (2s - 1)              without network delay
        tau_max = (N - 1) * (2s - 1) + (s - 1)    with network delay

    For updates of the slowest worker the first term is ``(N - 1) * s``.

    Args:
        model: The consistency model.
        workers: Number of workers ``N``.
        network_delay: Whether updates spend time in flight.

    Returns:
        The bound (``0`` for BSP, ``math.inf`` for ASP).
    """
    if model.kind == "bsp":
        return 0
    if model.kind == "asp":
        return math.inf
    s = model.bound
    bound = (workers - 1) * (2 * s - 1)
    return bound + (s - 1) if network_delay else bound
