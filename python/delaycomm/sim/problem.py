"""The convex problem the simulator trains: binary logistic regression.

The data are synthetic and fully determined by a seed: features are i.i.d.
standard normal, the labels are drawn from a logistic model with a planted
weight vector, so the problem has label noise and a finite optimum (the loss
floor is the Bayes log-loss of the planted model, about 0.26 with the default
margin scale). Each worker owns a contiguous shard of the rows and samples its
mini-batches from it with replacement.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["LogisticProblem", "ProblemConfig"]


@dataclasses.dataclass(frozen=True)
class ProblemConfig:
    """Shape of the synthetic logistic-regression problem.

    Attributes:
        samples: Number of rows (split evenly into worker shards).
        features: Number of features (a bias column is not added; the planted
            model has none).
        margin: Euclidean norm of the planted weight vector. Larger means less
            label noise and a lower optimal loss.
        batch: Mini-batch size of one worker gradient.
        seed: Seed of the data (independent of the run seed, so that runs with
            different run seeds train on the same data).
    """

    samples: int = 4096
    features: int = 20
    margin: float = 4.0
    batch: int = 16
    seed: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        if self.samples < 1:
            raise ValueError(f"ProblemConfig: samples must be >= 1, got {self.samples}")
        if self.features < 1:
            raise ValueError(f"ProblemConfig: features must be >= 1, got {self.features}")
        if not (self.margin > 0 and math.isfinite(self.margin)):
            raise ValueError(f"ProblemConfig: margin must be a finite number > 0, got {self.margin}")
        if self.batch < 1:
            raise ValueError(f"ProblemConfig: batch must be >= 1, got {self.batch}")


def _log1pexp(z: np.ndarray) -> np.ndarray:
    """Numerically stable log(1 + exp(z))."""
    return np.logaddexp(0.0, z)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """Logistic function in the tanh form, which cannot overflow."""
    return 0.5 + 0.5 * np.tanh(0.5 * z)


class LogisticProblem:
    """Mean log-loss of a logistic model on a fixed synthetic data set.

    Args:
        config: The problem's shape.
        workers: Number of shards to split the rows into (one per worker).

    Raises:
        ValueError: If the config is invalid or there are fewer rows than
            workers.
    """

    def __init__(self, config: ProblemConfig, workers: int) -> None:
        config.validate()
        if workers < 1:
            raise ValueError(f"LogisticProblem: workers must be >= 1, got {workers}")
        if config.samples < workers:
            raise ValueError(f"LogisticProblem: samples ({config.samples}) must be >= workers ({workers})")
        self.config = config
        rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(0xDA7A,)))
        w_star = rng.standard_normal(config.features)
        self.w_star = w_star * (config.margin / np.linalg.norm(w_star))
        self.x = rng.standard_normal((config.samples, config.features))
        p = _sigmoid(self.x @ self.w_star)
        # Labels in {-1, +1}: loss = mean log(1 + exp(-y * x.w)).
        self.y = np.where(rng.random(config.samples) < p, 1.0, -1.0)
        self._yx = self.y[:, None] * self.x  # loss = mean log(1 + exp(-yx . w))
        bounds = np.linspace(0, config.samples, workers + 1).astype(np.int64)
        self.shards = [(int(bounds[i]), int(bounds[i + 1])) for i in range(workers)]
        # Smoothness of the mean log-loss: lambda_max(X^T X) / (4 n).
        self.smoothness = float(np.linalg.eigvalsh(self.x.T @ self.x)[-1] / (4.0 * config.samples))

    @property
    def dim(self) -> int:
        """Number of parameters."""
        return self.config.features

    def initial_weights(self) -> np.ndarray:
        """The starting point, all zeros (loss ln 2)."""
        return np.zeros(self.dim)

    def loss(self, w: np.ndarray) -> float:
        """Mean log-loss over all rows at ``w``."""
        return float(np.mean(_log1pexp(-(self._yx @ w))))

    def gradient(self, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Gradient of the mean log-loss over ``rows`` at ``w``."""
        yxb = self._yx[rows]
        return -(_sigmoid(-(yxb @ w)) @ yxb) / len(rows)

    def sample_rows(self, worker: int, rng: np.random.Generator, count: int = 1) -> np.ndarray:
        """Draw ``count`` mini-batches of row indices from ``worker``'s shard.

        Args:
            worker: Whose shard.
            rng: The worker's batch stream.
            count: Number of batches.

        Returns:
            An int64 array of shape ``(count, batch)``.
        """
        lo, hi = self.shards[worker]
        return rng.integers(lo, hi, size=(count, self.config.batch))

    def optimum(self, iterations: int = 30) -> tuple[np.ndarray, float]:
        """Minimise the full loss with Newton's method (for reference lines).

        Args:
            iterations: Newton steps; the problem is small and smooth, 30 is
                far more than enough for double precision.

        Returns:
            The minimiser and its loss.
        """
        w = self.initial_weights()
        for _ in range(iterations):
            z = self.y * (self.x @ w)
            s = _sigmoid(-z)
            grad = -(s * self.y) @ self.x / len(z)
            hess = (self.x * (s * (1.0 - s))[:, None]).T @ self.x / len(z)
            w = w - np.linalg.solve(hess, grad)
        return w, self.loss(w)
