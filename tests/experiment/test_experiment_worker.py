"""The pieces that make the configs comparable: sharding, step counts, initial weights, the data split."""

from __future__ import annotations

import numpy as np
import torch

from delaycomm.experiment.runner import load_digits_split
from delaycomm.experiment.worker import MODELS, build_model, shard_indices, steps_per_epoch


def test_steps_per_epoch():
    assert steps_per_epoch(1437, 2, 32) == 22
    assert steps_per_epoch(1437, 3, 32) == 14
    assert steps_per_epoch(10, 2, 6) == 0


def test_shards_are_disjoint_equal_and_deterministic():
    shards = [shard_indices(1437, 3, r, 32, seed=5, epoch=2) for r in range(3)]
    assert [len(s) for s in shards] == [14 * 32] * 3
    union = np.concatenate(shards)
    assert len(np.unique(union)) == len(union)
    assert union.min() >= 0 and union.max() < 1437
    again = shard_indices(1437, 3, 1, 32, seed=5, epoch=2)
    assert np.array_equal(again, shards[1])
    assert not np.array_equal(shard_indices(1437, 3, 1, 32, seed=5, epoch=3), shards[1])
    assert not np.array_equal(shard_indices(1437, 3, 1, 32, seed=6, epoch=2), shards[1])


def test_models_start_from_the_same_weights_for_the_same_seed():
    for name in MODELS:
        a = build_model(name, 64, 10, seed=1)
        b = build_model(name, 64, 10, seed=1)
        c = build_model(name, 64, 10, seed=2)
        pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
        assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert sum(p.numel() for p in build_model("mlp", 64, 10, 0).parameters()) == 4810
    assert sum(p.numel() for p in build_model("logreg", 64, 10, 0).parameters()) == 650


def test_digits_split_is_stratified_and_fixed_by_the_seed():
    a = load_digits_split(seed=0, test_fraction=0.2)
    b = load_digits_split(seed=0, test_fraction=0.2)
    assert a["x_train"].shape == (1437, 64) and a["x_test"].shape == (360, 64)
    assert a["x_train"].dtype == np.float32 and a["y_train"].dtype == np.int64
    assert 0.0 <= a["x_train"].min() and a["x_train"].max() <= 1.0
    assert np.array_equal(a["x_train"], b["x_train"]) and np.array_equal(a["y_test"], b["y_test"])
    counts = np.bincount(a["y_test"], minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
