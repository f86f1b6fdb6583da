"""Learning-rate schedules for training under delay.

``EpochWarmup`` restarts a linear warmup at the start of every epoch (docs/staleness.md). It is a *multiplicative
factor* on whatever learning rate the optimizer holds, so it composes with any other chainable scheduler
(``StepLR``, ``ExponentialLR``, ``MultiplicativeLR``, ``ChainedScheduler``, ...): stepping them together gives
``lr = base_lr * warmup_factor(t) * other_factor(t)``, whatever the order in which they are stepped.
"""

from __future__ import annotations

import numbers

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["EpochWarmup"]


def _check_int(name: str, value: object, minimum: int) -> int:
    # bool is an int in Python: reject it, as True is never a meant step count.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"EpochWarmup: {name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"EpochWarmup: {name} must be an integer >= {minimum}, got {value}")
    return int(value)


class EpochWarmup(LRScheduler):
    """Linear learning-rate warmup at the start of every epoch, as a multiplicative factor.

    Call ``step()`` once per optimizer step (per batch), after ``optimizer.step()``. At step ``t`` (counted from 0
    since the scheduler was made), with ``k = t % steps_per_epoch`` the step within the epoch, the factor is::

        factor(t) = min(1, (k + 1) / warmup_steps)

    so every epoch starts at ``1 / warmup_steps`` of the learning rate and reaches it after ``warmup_steps``
    steps. ``t`` starts at 0 when the scheduler is made: make it at the start of an epoch. To resume, save and
    load ``state_dict()`` together with the optimizer's (torch's convention; the step count travels in it).

    Composition: each ``step()`` multiplies every param group's current ``lr`` by ``factor(t) / factor(t - 1)``
    (the "chainable" form of ``torch.optim.lr_scheduler.LinearLR``), so the changes other schedulers make to the
    same ``lr`` are kept: with ``StepLR(optimizer, step_size, gamma)`` stepped alongside (directly or in a
    ``ChainedScheduler``), ``lr(t) = base_lr * factor(t) * gamma ** (t // step_size)``. The factor is never 0,
    so the ratio is always defined. A scheduler that *sets* the learning rate from its own closed form
    (``LambdaLR``, ``OneCycleLR``, ``CosineAnnealingWarmRestarts``) overwrites this factor: step it first and
    ``EpochWarmup`` last. Products of ratios drift from the closed form by a few ulps over long runs
    (relative 1e-15 per step), as with every chainable torch scheduler.

    Args:
        optimizer: the wrapped optimizer.
        warmup_steps: steps of linear warmup at the start of each epoch; 1 disables the warmup (factor 1).
        steps_per_epoch: optimizer steps per epoch (``len(loader)``, per rank); at least ``warmup_steps``.

    Raises:
        ValueError: an argument is not an integer in its range, or ``warmup_steps > steps_per_epoch`` (the
            warmup would restart before it finishes).
        TypeError: ``optimizer`` is not a ``torch.optim.Optimizer`` (raised by ``LRScheduler``).
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int = 500, *, steps_per_epoch: int) -> None:
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, 1)
        self.steps_per_epoch = _check_int("steps_per_epoch", steps_per_epoch, 1)
        if self.warmup_steps > self.steps_per_epoch:
            raise ValueError(
                f"EpochWarmup: warmup_steps ({self.warmup_steps}) must not exceed steps_per_epoch "
                f"({self.steps_per_epoch}): the warmup restarts every epoch and would never finish"
            )
        super().__init__(optimizer)

    def factor(self, step: int) -> float:
        """The warmup factor at `step` (0-based, counted since the scheduler was made)."""
        k = step % self.steps_per_epoch
        return min(1.0, (k + 1) / self.warmup_steps)

    def get_lr(self) -> list[float]:
        """The learning rates for the current step, from the param groups' current ones (chainable form)."""
        t = self.last_epoch
        if t == 0:
            return [group["lr"] * self.factor(0) for group in self.optimizer.param_groups]
        ratio = self.factor(t) / self.factor(t - 1)
        return [group["lr"] * ratio for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        """The learning rates at ``last_epoch`` from ``base_lrs`` (used by the deprecated ``step(epoch)``)."""
        return [base_lr * self.factor(self.last_epoch) for base_lr in self.base_lrs]
