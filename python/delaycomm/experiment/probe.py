"""What the update did, measured exactly at every step of a built-in task (``--measure-updates``;
docs/experiment.md, "The update metrics").

At step t, with the parameters θ_t that every rank holds:

- ``u_t``: the **applied gradient**, what the optimizer receives (``p.grad`` after DDP's reduction: under
  staleness, the engine's blend of the fresh and the due stale contributions);
- ``f_t``: the **fresh gradient**, what BSP would have applied at θ_t: the mean over ranks of each rank's batch
  gradient. Every rank can compute it alone: each rank's batch is a pure function of (seed, epoch, rank), so the
  probe evaluates the gradient of the loss on the union of this step's batches, with no communication;
- ``g_t``: the full-batch gradient on the whole training set, every ``every``-th step (the costliest part: a
  backward pass over the whole training set); ``L_t``, the training loss at θ_t, at every step (a forward pass).

Each is computed with ``torch.func.functional_call`` on detached copies of the parameters, so no DDP hook runs
and nothing reaches ``p.grad``. Rank 0 probes (every rank would compute the same numbers). Summaries
(:func:`summarize_probe`):

- ``update_noise_ratio`` = Σ‖u - g‖² / Σ‖f - g‖² over the steps where g was computed: the variance of the applied
  update around the true gradient, relative to the fresh gradient's (1: as noisy as BSP; < 1: less noisy);
- ``update_deviation`` = Σ‖u - f‖² / Σ‖f‖²: how far the applied update is from the fresh gradient, relative;
- ``effective_lr`` = lr · mean over steps of ‖u‖ / ‖f‖ (before momentum; lr itself under BSP);
- ``oscillation`` = Σ max(0, L_{t+1} - L_t) over the first K steps: the training loss's total rise (0 for a
  monotone descent), in units of the loss; ``oscillation_2epochs``: the same over the first two epochs, and
  ``full_loss_2epochs`` the training loss after them (what a per-epoch warmup is said to settle).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["UpdateProbe", "summarize_probe", "PROBE_METRICS"]

PROBE_METRICS = (
    "update_noise_ratio",
    "update_deviation",
    "effective_lr",
    "oscillation",
    "oscillation_2epochs",
    "full_loss_2epochs",
)


class UpdateProbe:
    """Per-step measurement of the applied, fresh and full-batch gradients (rank 0 of a built-in task)."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        x_train: torch.Tensor,
        y_train: torch.Tensor,
        every: int = 1,
    ) -> None:
        self.model, self.loss_fn = model, loss_fn
        self.x_train, self.y_train = x_train, y_train
        self.every = every
        self.rows: list[tuple[float, float, float, float, float, float]] = []

    def _grad(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
        from torch.func import functional_call

        params = {n: p.detach().clone().requires_grad_(True) for n, p in self.model.named_parameters()}
        loss = self.loss_fn(functional_call(self.model, params, (x,)), y)
        grads = torch.autograd.grad(loss, list(params.values()))
        return torch.cat([g.reshape(-1) for g in grads]).double(), float(loss.item())

    def record(self, global_batch: torch.Tensor) -> None:
        """After backward (``p.grad`` holds the applied gradient), before ``optimizer.step()``.

        Args:
            global_batch: the indices of every rank's batch of this step, concatenated (equal sizes per rank, so
                the loss's mean over them is the mean of the ranks' batch losses).
        """
        u = torch.cat([p.grad.reshape(-1) for p in self.model.parameters()]).double()
        f, _ = self._grad(self.x_train[global_batch], self.y_train[global_batch])
        nan = float("nan")
        if len(self.rows) % self.every == 0:
            g, full_loss = self._grad(self.x_train, self.y_train)
            u_g, f_g = float((u - g).pow(2).sum()), float((f - g).pow(2).sum())
        else:
            with torch.no_grad():
                full_loss = float(self.loss_fn(self.model(self.x_train), self.y_train).item())
            u_g = f_g = nan
        self.rows.append((full_loss, float(u.norm()), float(f.norm()), u_g, f_g, float((u - f).pow(2).sum())))

    def result(self) -> dict[str, list[float]]:
        """The per-step series (JSON-ready): full training loss and the norms."""
        cols = list(zip(*self.rows)) if self.rows else [[]] * 6
        names = ("full_loss", "u_norm", "f_norm", "u_g_sq", "f_g_sq", "u_f_sq")
        return {n: list(c) for n, c in zip(names, cols)}


def _oscillation(full: np.ndarray, steps: int) -> float:
    k = min(steps, len(full) - 1)
    return float(np.clip(np.diff(full[: k + 1]), 0.0, None).sum())


def summarize_probe(
    series: dict[str, list[float]], lr: float, oscillation_steps: int, steps_per_epoch: int
) -> dict[str, Any]:
    """The probe's metrics (module docstring) from its per-step series."""
    full = np.asarray(series["full_loss"], dtype=float)
    if len(full) == 0:
        return dict.fromkeys(PROBE_METRICS)
    u_norm, f_norm = np.asarray(series["u_norm"]), np.asarray(series["f_norm"])
    f_g, u_g, u_f = (np.asarray(series[k], dtype=float) for k in ("f_g_sq", "u_g_sq", "u_f_sq"))
    measured = np.isfinite(f_g) & np.isfinite(u_g)
    f_g, u_g = f_g[measured], u_g[measured]
    ok = f_norm > 0
    two = 2 * steps_per_epoch
    return {
        "update_noise_ratio": float(u_g.sum() / f_g.sum()) if f_g.sum() > 0 else None,
        "update_deviation": float(u_f.sum() / np.square(f_norm).sum()) if ok.any() else None,
        "effective_lr": float(lr * np.mean(u_norm[ok] / f_norm[ok])) if ok.any() else None,
        "oscillation": _oscillation(full, oscillation_steps),
        "oscillation_2epochs": _oscillation(full, two),
        "full_loss_2epochs": float(full[two]) if len(full) > two else None,
    }
