"""The multi-seed runner's loop: every config x seed once, records on disk, resume, and refusing a folder that holds
another experiment's results. The job here is a plain object that follows the Job protocol (the runner's contract);
the real jobs run end to end in test_experiment_run.py and test_experiment_multiproc.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from delaycomm.experiment.study import StudyError, record_path, run_study


@dataclasses.dataclass(frozen=True)
class _Config:
    name: str
    value: float


class _Job:
    def __init__(self, tag="a", fail=()):
        self.tag, self.fail, self.calls, self.prepared = tag, set(fail), [], 0

    def fingerprint(self):
        return {"tag": self.tag}

    def config_fingerprint(self, config):
        return {"value": config.value}

    def prepare(self):
        self.prepared += 1

    def run(self, config, seed, rundir, note):
        self.calls.append((config.name, seed))
        note(f"step {seed}")
        if (config.name, seed) in self.fail:
            return {"status": "failed", "message": "boom", "metrics": {}, "curves": {}, "delaycomm": None}
        return {"status": "ok", "message": "", "metrics": {"m": config.value + seed}, "curves": {}, "delaycomm": None}


CONFIGS = [_Config("base", 1.0), _Config("x", 2.0)]


def test_every_config_and_seed_once_then_resumed(tmp_path):
    job = _Job(fail={("x", 1)})
    records, reused = run_study(job, CONFIGS, [0, 1], tmp_path, progress=False)
    assert [(r["config"], r["seed"], r["status"]) for r in records] == [
        ("base", 0, "ok"),
        ("base", 1, "ok"),
        ("x", 0, "ok"),
        ("x", 1, "failed"),
    ]
    assert reused == 0 and job.prepared == 1
    doc = json.loads(record_path(tmp_path, "x", 0).read_text())
    assert doc["fingerprint"] == {"job": {"tag": "a"}, "config": {"value": 2.0}, "seed": 0}
    assert doc["record"]["metrics"] == {"m": 2.0}
    # again: the ok runs come from the folder, the failed one runs again; one more seed runs
    again = _Job()
    records, reused = run_study(again, CONFIGS, [0, 1, 2], tmp_path, progress=False)
    assert reused == 3 and again.calls == [("base", 2), ("x", 1), ("x", 2)]
    assert [r["status"] for r in records] == ["ok"] * 6
    # --fresh runs everything
    fresh = _Job()
    run_study(fresh, CONFIGS, [0], tmp_path, fresh=True, progress=False)
    assert fresh.calls == [("base", 0), ("x", 0)]
    # nothing to run: no preparation
    idle = _Job()
    run_study(idle, CONFIGS, [0], tmp_path, progress=False)
    assert idle.calls == [] and idle.prepared == 0


def test_a_folder_of_another_experiment_is_refused_before_anything_runs(tmp_path):
    run_study(_Job("a"), CONFIGS, [0], tmp_path, progress=False)
    other = _Job("b")
    with pytest.raises(StudyError) as e:
        run_study(other, CONFIGS, [0], tmp_path, progress=False)
    assert other.calls == []
    assert str(e.value) == (
        f"{record_path(tmp_path, 'base', 0)} holds a result of another experiment (job.tag: 'a' there, 'b' now); "
        "give another --out, or --fresh to run every config and seed again"
    )
    changed = [_Config("base", 1.5)]
    with pytest.raises(StudyError, match=r"config.value: 1.0 there, 1.5 now"):
        run_study(_Job("a"), changed, [0], tmp_path, progress=False)
    record_path(tmp_path, "x", 0).write_text("{not json")
    with pytest.raises(StudyError, match=r"cannot be read as a result"):
        run_study(_Job("a"), CONFIGS, [0], tmp_path, progress=False)


def test_without_a_folder_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    records, reused = run_study(_Job(), CONFIGS, [0], None, progress=False)
    assert len(records) == 2 and reused == 0 and list(tmp_path.iterdir()) == []
