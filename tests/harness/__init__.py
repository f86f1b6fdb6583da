"""The multi-rank test harness: ranks as threads (:func:`run_threads`) or as real processes (:func:`run_procs`).

Threads are the default: one process, one in-memory store, the real Gloo and the real DelayBackend, well under a
second per test. Real processes (forked from a server that imported torch and delaycomm once) are for what needs
a process of its own: DDP and FSDP, the default group (``init_process_group``), faults that kill a rank,
``TORCH_DISTRIBUTED_DEBUG``. Commands run with :func:`run_cli` (``python [-m module] argv``: torchrun, the
tools' CLIs) or :func:`run_command` (any command: a shell script, a tool on ``PATH``). Every entry point has a timeout
and reports every rank's outcome; tests launch processes through these only (a job's own process inside a rank:
:func:`run_in_child`; a user's script as torchrun runs it: ``tests.harness.user_job``).
"""

from tests.harness.procs import CommandTimeout, free_port, run_cli, run_command, run_in_child, run_procs
from tests.harness.threads import RankContext, run_threads

__all__ = [
    "RankContext",
    "run_threads",
    "run_procs",
    "run_in_child",
    "run_cli",
    "run_command",
    "CommandTimeout",
    "free_port",
]
