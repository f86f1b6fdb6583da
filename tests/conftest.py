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


def pytest_collection_modifyitems(config, items):
    """A ``gpu`` test must say so in its own file (see above): the GPU check finds GPU tests by that text."""
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
