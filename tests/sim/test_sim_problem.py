"""The logistic-regression problem, and the simulator's import footprint."""

from __future__ import annotations

import ast
import math
import pathlib

import numpy as np
import pytest

import delaycomm.sim
from delaycomm.sim import LogisticProblem, ProblemConfig


@pytest.fixture(scope="module")
def problem():
    return LogisticProblem(ProblemConfig(samples=300, features=4, margin=3.0, batch=16, seed=3), workers=3)


def test_loss_at_zero_is_ln2(problem):
    assert problem.loss(problem.initial_weights()) == pytest.approx(math.log(2), rel=1e-15)


def test_gradient_matches_finite_differences(problem):
    w = np.array([0.3, -0.7, 1.1, 0.05])
    rows = np.arange(300)
    g = problem.gradient(w, rows)
    eps = 1e-6
    fd = [(problem.loss(w + eps * e) - problem.loss(w - eps * e)) / (2 * eps) for e in np.eye(4)]
    assert g == pytest.approx(fd, abs=1e-8)


def test_optimum_is_stationary_and_lowest(problem):
    w_opt, f_opt = problem.optimum()
    assert np.abs(problem.gradient(w_opt, np.arange(300))).max() < 1e-10
    assert f_opt < problem.loss(problem.w_star)


def test_shards_partition_the_rows_and_batches_stay_in_their_shard(problem):
    assert problem.shards == [(0, 100), (100, 200), (200, 300)]
    rows = problem.sample_rows(2, np.random.default_rng(0), count=5)
    assert rows.shape == (5, 16) and rows.min() >= 200 and rows.max() < 300


def test_smoothness_bounds_the_hessian(problem):
    # The Hessian of the mean log-loss is X^T D X / n with D <= 1/4.
    assert problem.smoothness == pytest.approx(np.linalg.eigvalsh(problem.x.T @ problem.x)[-1] / (4 * 300))


@pytest.mark.parametrize(
    ("cfg", "workers", "message"),
    [
        (ProblemConfig(samples=0), 1, r"ProblemConfig: samples must be >= 1, got 0"),
        (ProblemConfig(margin=-1.0), 1, r"ProblemConfig: margin must be a finite number > 0, got -1.0"),
        (ProblemConfig(samples=4), 8, r"LogisticProblem: samples \(4\) must be >= workers \(8\)"),
    ],
)
def test_problem_rejects(cfg, workers, message):
    with pytest.raises(ValueError, match=message):
        LogisticProblem(cfg, workers)


def test_simulator_modules_import_numpy_only_at_top_level():
    # torch never; matplotlib and tqdm only inside the functions that plot or show progress.
    for path in pathlib.Path(delaycomm.sim.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in ("torch", "matplotlib", "tqdm", "scipy"), (path.name, name)
