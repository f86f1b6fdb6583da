"""The built-in tasks: real data that ships inside scikit-learn (nothing is downloaded), split by the run's seed.

- ``digits``: ``load_digits``, 1797 8x8 images of 10 classes, pixels scaled to [0, 1], a stratified 80/20 split
  (1437 train / 360 test); classification, cross-entropy.
- ``diabetes``: ``load_diabetes``, 442 patients, 10 standardised features, a disease-progression score one year
  later; the target standardised with the training split's mean and standard deviation, an 80/20 split (353 / 89);
  regression, mean squared error. A task of another kind than digits: a continuous target, a smooth loss, a tenth
  of the features and a quarter of the samples.

scikit-learn is the ``tools`` extra: :func:`require_sklearn` says so when it is missing (the built-in tasks need
it; ``python -m delaycomm.experiment run`` with a user's script does not).
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Task", "TASKS", "MissingExtra", "require_sklearn", "require_matplotlib", "load_split", "load_digits_split"]


class MissingExtra(RuntimeError):
    """An optional dependency is missing; the message names it and the extra that installs it."""


def _require(module: str, package: str, what: str) -> None:
    try:
        __import__(module)
    except ImportError as e:
        raise MissingExtra(f"{what} needs {package}, which is not installed ({e}): pip install {package}") from None


def require_sklearn(what: str = "the built-in tasks (digits, diabetes)") -> None:
    """Raises :class:`MissingExtra` naming the extra when scikit-learn cannot be imported."""
    _require("sklearn", "scikit-learn", what)


def require_matplotlib(what: str = "--plot") -> None:
    """Raises :class:`MissingExtra` naming the extra when matplotlib cannot be imported."""
    _require("matplotlib", "matplotlib", what)


@dataclasses.dataclass(frozen=True)
class Task:
    """A built-in task.

    Attributes:
        name: ``--task`` value.
        kind: ``classification`` (cross-entropy; accuracy) or ``regression`` (mean squared error; R²).
        description: one line for headers.
        hidden: width of the MLP's hidden layer.
    """

    name: str
    kind: str
    description: str
    hidden: int


TASKS = {
    "digits": Task("digits", "classification", "sklearn digits (8x8 images, 10 classes)", 64),
    "diabetes": Task("diabetes", "regression", "sklearn diabetes (10 features, a continuous target)", 32),
}


def load_digits_split(seed: int, test_fraction: float) -> dict[str, np.ndarray]:
    """scikit-learn's digits (1797 8x8 images, 10 classes; ships with the package), split stratified by ``seed``.

    Pixels are scaled from [0, 16] to [0, 1].
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test, "n_classes": np.int64(10)}


def _load_diabetes_split(seed: int, test_fraction: float) -> dict[str, np.ndarray]:
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    x, y = load_diabetes(return_X_y=True, scaled=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=test_fraction, random_state=seed)
    mean, std = y_train.mean(), y_train.std()
    # The features come centred with unit norm per column (scaled=True): rescaled to unit variance.
    scale = 1.0 / x_train.std(axis=0)
    return {
        "x_train": (x_train * scale).astype(np.float32),
        "y_train": ((y_train - mean) / std).astype(np.float32),
        "x_test": (x_test * scale).astype(np.float32),
        "y_test": ((y_test - mean) / std).astype(np.float32),
        "n_classes": np.int64(0),
    }


def load_split(task: str, seed: int, test_fraction: float) -> dict[str, np.ndarray]:
    """The task's train/test split for ``seed`` (``n_classes`` 0 for a regression task)."""
    require_sklearn()
    if task == "digits":
        return load_digits_split(seed, test_fraction)
    if task == "diabetes":
        return _load_diabetes_split(seed, test_fraction)
    raise ValueError(f"unknown task {task!r}; accepted: {', '.join(TASKS)}")
