"""Stale-gradient policies and delay-adaptive step sizes of the simulated server.

A policy decides how much of an arriving gradient counts (a scale, 0 drops
it); a step-size rule turns the scaled gradient into a parameter update. The
two compose: every rule works under every policy and every consistency model.
Definitions, sources and the adaptation of the backend's policies
(docs/staleness.md) to a parameter server are in docs/sim.md; each rule's docstring gives its exact update.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np

__all__ = [
    "POLICIES",
    "STEP_RULES",
    "ServerOptimizer",
    "StalePolicy",
    "StepConfig",
    "make_optimizer",
]

POLICIES = ("apply", "drop", "ema")
STEP_RULES = ("const", "staleness", "adadelay", "dcasgd", "dcasgd-a", "anytime")


class StalePolicy:
    """Weights fresh and stale arrivals as the backend's policies do (docs/staleness.md), per update.

    An arrival is *stale* when its staleness exceeds ``stale_after``. The
    server treats the last ``N`` arrivals (this one included) as one virtual
    all-reduce step with ``n_f`` fresh and ``n_s`` stale contributions
    (``m = n_f + n_s``, which is ``N`` once ``N`` updates have arrived) and
    scales the current arrival by the weight the backend's policy gives it, in
    units of one ordinary update:

    * ``apply``: 1.
    * ``drop``: 0 if stale; ``m / n_f`` if fresh.
    * ``ema``: if both kinds are in the window, ``(1 - alpha) * m / n_f`` for
      a fresh arrival and ``alpha * m / n_s`` for a stale one; otherwise 1
      (the backend: ``(N / n_fresh) * sum(fresh)`` with no stale due, and
      ``N * mean(due-stale)`` when every contribution is late).

    Args:
        kind: ``apply``, ``drop`` or ``ema``.
        workers: ``N``, the window length.
        stale_after: Largest staleness that still counts as fresh.
        alpha: EMA blend weight of stale contributions, in (0, 1].

    Raises:
        ValueError: On an unknown kind or an out-of-range argument.
    """

    def __init__(self, kind: str, workers: int, stale_after: int, alpha: float = 0.1) -> None:
        if kind not in POLICIES:
            raise ValueError(f"StalePolicy: unknown policy {kind!r}: expected one of {', '.join(POLICIES)}")
        if workers < 1:
            raise ValueError(f"StalePolicy: workers must be >= 1, got {workers}")
        if stale_after < 0:
            raise ValueError(f"StalePolicy: stale_after must be >= 0, got {stale_after}")
        if not (0.0 < alpha <= 1.0):
            raise ValueError(f"StalePolicy: alpha must be in (0, 1], got {alpha}")
        self.kind = kind
        self.stale_after = stale_after
        self.alpha = alpha
        self._window: collections.deque[bool] = collections.deque(maxlen=workers)

    def scale(self, staleness: int) -> float:
        """Record one arrival and return its weight.

        Args:
            staleness: The arrival's staleness (updates applied since its read).

        Returns:
            The factor its gradient is multiplied by; 0 means drop it.
        """
        stale = staleness > self.stale_after
        self._window.append(stale)
        if self.kind == "apply":
            return 1.0
        m = len(self._window)
        n_s = sum(self._window)
        n_f = m - n_s
        if self.kind == "drop":
            return 0.0 if stale else m / n_f
        if n_s == 0 or n_f == 0:
            return 1.0
        return self.alpha * m / n_s if stale else (1.0 - self.alpha) * m / n_f


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Step-size rule and its constants.

    Attributes:
        rule: One of ``STEP_RULES``.
        lr: Base learning rate ``eta``.
        dc_lambda: DC-ASGD variance-control constant ``lambda`` (constant
            form) or ``lambda_0`` (adaptive form).
        dc_momentum: DC-ASGD-a mean-square decay ``m``.
        radius: Radius ``R`` of the ball the ``anytime`` rule projects onto.
    """

    rule: str = "const"
    lr: float = 0.5
    dc_lambda: float = 0.04
    dc_momentum: float = 0.95
    radius: float = 10.0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        if self.rule not in STEP_RULES:
            raise ValueError(f"StepConfig: unknown step rule {self.rule!r}: expected one of {', '.join(STEP_RULES)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"StepConfig: lr must be a finite number > 0, got {self.lr}")
        if not (self.dc_lambda >= 0 and math.isfinite(self.dc_lambda)):
            raise ValueError(f"StepConfig: dc_lambda must be a finite number >= 0, got {self.dc_lambda}")
        if not (0.0 <= self.dc_momentum < 1.0):
            raise ValueError(f"StepConfig: dc_momentum must be in [0, 1), got {self.dc_momentum}")
        if not (self.radius > 0 and math.isfinite(self.radius)):
            raise ValueError(f"StepConfig: radius must be a finite number > 0, got {self.radius}")


class ServerOptimizer:
    """The server's parameters and update rule.

    Workers compute gradients at :meth:`read`; the server calls :meth:`apply`
    once per accepted arrival; the loss is measured at :meth:`weights`.

    Args:
        w0: Initial parameters (copied).
        config: The step-size rule.
        smoothness: Smoothness constant ``L`` of the objective (AdaDelay).
    """

    def __init__(self, w0: np.ndarray, config: StepConfig, smoothness: float) -> None:
        config.validate()
        self.config = config
        self.smoothness = smoothness
        self.w = np.array(w0, dtype=np.float64)
        self.t = 0  # applied updates
        self.last_step = 0.0
        self._mean_square = np.zeros_like(self.w)
        # anytime: x is the weighted average the workers query, w the online iterate.
        self._x = self.w.copy()
        self._sum_sq = 0.0

    def read(self) -> np.ndarray:
        """The point a worker computes its gradient at (a copy)."""
        return (self._x if self.config.rule == "anytime" else self.w).copy()

    def weights(self) -> np.ndarray:
        """The point the loss is reported at (no copy: do not modify)."""
        return self._x if self.config.rule == "anytime" else self.w

    def step_size(self, staleness: int) -> float:
        """Scalar step of the next update for the scalar rules.

        ``const``: ``eta``. ``staleness``: ``eta / (1 + tau)``. ``adadelay``:
        ``1 / (L + c * sqrt(t + tau))`` with ``c = 1 / eta`` and ``t`` the
        1-based index of this update. DC-ASGD uses ``eta``.

        Args:
            staleness: ``tau`` of the arriving gradient.

        Returns:
            The step size (not used by ``anytime``, whose step is per update).
        """
        rule = self.config.rule
        eta = self.config.lr
        if rule == "staleness":
            return eta / (1.0 + staleness)
        if rule == "adadelay":
            return 1.0 / (self.smoothness + math.sqrt(self.t + 1 + staleness) / eta)
        return eta

    def apply(self, grad: np.ndarray, staleness: int, read_point: np.ndarray, scale: float = 1.0) -> None:
        """Apply one (scaled) gradient.

        Args:
            grad: The gradient, computed at ``read_point``.
            staleness: Updates applied since ``read_point`` was read.
            read_point: The parameters the worker read.
            scale: Policy weight of this gradient (> 0).
        """
        cfg = self.config
        g = scale * grad
        if cfg.rule in ("dcasgd", "dcasgd-a"):
            # DC-ASGD (Zheng et al. 2017): g + lambda * g * g * (w_now - w_read).
            if cfg.rule == "dcasgd":
                lam = cfg.dc_lambda
            else:
                self._mean_square = cfg.dc_momentum * self._mean_square + (1.0 - cfg.dc_momentum) * g * g
                lam = cfg.dc_lambda / np.sqrt(self._mean_square + 1e-12)
            g = g + lam * g * g * (self.w - read_point)
        if cfg.rule == "anytime":
            self._apply_anytime(g)
            return
        step = self.step_size(staleness)
        self.w -= step * g
        self.t += 1
        self.last_step = step

    def _apply_anytime(self, g: np.ndarray) -> None:
        """Anytime averaging with an AdaGrad-norm step (our reading of seed 004).

        With weights ``a_t = t`` and ``A_t = t (t + 1) / 2``::

            eta_t = 2 R / sqrt(sum_{k <= t} a_k^2 |g_k|^2)
            w_t   = Proj_{|w| <= R}(w_{t-1} - eta_t a_t g_t)
            x_t   = x_{t-1} + (a_t / A_t) (w_t - x_{t-1})

        Gradients are queried at ``x`` (what :meth:`read` returns).
        """
        self.t += 1
        a_t = float(self.t)
        self._sum_sq += a_t * a_t * float(g @ g)
        if self._sum_sq == 0.0:
            self.last_step = 0.0
            return
        eta = 2.0 * self.config.radius / math.sqrt(self._sum_sq)
        self.w -= eta * a_t * g
        norm = float(np.linalg.norm(self.w))
        if norm > self.config.radius:
            self.w *= self.config.radius / norm
        self._x += (a_t / (a_t * (a_t + 1.0) / 2.0)) * (self.w - self._x)
        self.last_step = eta * a_t


def make_optimizer(w0: np.ndarray, config: StepConfig, smoothness: float) -> ServerOptimizer:
    """Build the server optimizer for ``config``.

    Args:
        w0: Initial parameters.
        config: Step-size rule.
        smoothness: Smoothness constant of the objective.

    Returns:
        A fresh :class:`ServerOptimizer`.

    Raises:
        ValueError: If ``config`` is invalid.
    """
    return ServerOptimizer(w0, config, smoothness)
