"""The suite's hooks: rank processes with one thread each, the harness's fork server started early, and the `gpu`
marker kept findable.

GPU tests: a test that needs a CUDA device carries the ``gpu`` marker, written in its own file as
``pytest.mark.gpu`` (on the test, the module's ``pytestmark`` or a ``cuda`` parameter), wherever its subject's tests
live (tests/gpu holds the backend on one GPU and the GPU check's scripts; the kernels' CUDA cases sit with their CPU
cases). bench/gpu_check.sh and scripts/cuda-check.sh run ``-m gpu`` over the files that contain that text; the
collection below refuses a ``gpu`` test whose file does not, so no GPU test is left out of the GPU check
(docs/gpu.md).
"""

import os
import re

import pytest

# Rank processes of the multi-process tests use few threads: the CI machine has 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

_fork_server_started = False
# What bench/gpu_check.sh and scripts/cuda-check.sh look for in a test file (with grep -E).
GPU_MARK_PATTERN = r"pytest\.mark\.gpu\b"


def pytest_itemcollected(item):
    """Start the harness's fork server (it imports torch and the training stack once, seconds) as soon as a
    multi-rank test is collected, so that it loads while the rest of the suite is collected."""
    global _fork_server_started
    if _fork_server_started or item.get_closest_marker("multiproc") is None:
        return
    if item.config.getoption("collectonly"):
        return
    _fork_server_started = True
    from tests.harness.procs import start_fork_server

    start_fork_server()


def pytest_collection_finish(session):
    """Wait here for the fork server started above to finish its imports, not in the first multi-rank test: on a
    loaded machine they take a minute, which that test's timeout would count (docs/ci.md, "Timing under load")."""
    if not _fork_server_started:
        return
    from tests.harness.procs import wait_fork_server

    wait_fork_server()


# The slowest files of the default run, slowest first (seconds on the 2-core VM, 4 workers, 2026-12-03:
# `--durations`). pytest-xdist hands whole files to its workers in the order of the collection (scripts/test.sh
# passes --no-loadscope-reorder, which would otherwise order them by their number of tests), so these start first
# and the workers end together instead of one worker running a long file alone at the end (docs/ci.md, "Stages").
# A file not listed runs after them, in the usual order; a listed file that is gone fails the run.
SLOWEST_FIRST = (
    "tests/stale/test_acceptance.py",  # 41-64 s
    "tests/backend/test_config.py",  # 44-52 s
    "tests/experiment/test_experiment_ends.py",  # 31-39 s (2026-12-06, tests/experiment + tests/stale, load 5-8)
    "tests/experiment/test_experiment_multiproc.py",  # 31-33 s
    "tests/bench/test_bench_ranks.py",  # 32-33 s
    "tests/delay/test_timeouts.py",  # 30-31 s
    "tests/kernels/test_blend.py",  # 23-37 s
    "tests/trace/test_profiler.py",  # 57 s at load 16-20 on the 2-core VM; one 2-rank job for the module
    "tests/stale/test_limits.py",  # 21-22 s
    "tests/delay/test_delay_ranks.py",  # 21 s
    "tests/stale/test_paths.py",  # 19-21 s
    "tests/stale/test_fsdp.py",  # 17-21 s
    "tests/stale/test_engine.py",  # 19-20 s
    "tests/delay/test_spec.py",  # 19-24 s
    "tests/backend/test_registration.py",  # 14-28 s
    "tests/backend/test_imports.py",  # 13-33 s
    "tests/delay/test_sampler.py",  # 17-19 s
    "tests/delay/test_profile_replay.py",  # 18 s
    "tests/stats/test_stats_file.py",  # 12-22 s
    "tests/sim/test_sim_cli.py",  # 14-18 s
    "tests/stale/test_calibration.py",  # 16-17 s
    "tests/stale/test_owners.py",  # 11-21 s
    "tests/backend/test_api.py",  # 14-15 s
    "tests/experiment/test_experiment_claims.py",  # 12-16 s
    "tests/backend/test_collectives.py",  # 12-13 s
    "tests/delay/test_profile_cli.py",  # 12 s
    "tests/stale/test_engine_waits.py",  # 11 s
)


def _slowest_first(config, items) -> None:
    root = config.rootpath
    gone = [f for f in SLOWEST_FIRST if not (root / f).is_file()]
    if gone:
        raise pytest.UsageError(f"tests/conftest.py: SLOWEST_FIRST names files that are gone: {gone}")
    rank = {str(root / f): i for i, f in enumerate(SLOWEST_FIRST)}
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(str(item.path), len(rank)), order[id(item)]))


def pytest_collection_modifyitems(config, items):
    """The slowest files first (above); a ``gpu`` test must say so in its own file (see the module's docstring):
    the GPU check finds GPU tests by that text."""
    _slowest_first(config, items)
    texts: dict[str, bool] = {}
    hidden = []
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        path = str(item.path)
        if path not in texts:
            with open(path, encoding="utf-8") as f:
                texts[path] = re.search(GPU_MARK_PATTERN, f.read()) is not None
        if not texts[path]:
            hidden.append(item.nodeid)
    if hidden:
        raise pytest.UsageError(
            "tests marked gpu in a file without the text pytest.mark.gpu (bench/gpu_check.sh would not run them): "
            "write the marker as pytest.mark.gpu in the test's file:\n  " + "\n  ".join(hidden)
        )
