import os

# Rank processes of the multi-process tests use few threads: the CI machine has 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

_fork_server_started = False


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
