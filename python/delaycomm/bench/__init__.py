"""``python -m delaycomm.bench``: collective microbenchmarks side by side with the raw backend, and a CI gate.

Modules: :mod:`~delaycomm.bench.cli` (flags), :mod:`~delaycomm.bench.engine` (measuring, inside each rank),
:mod:`~delaycomm.bench.collectives` (one spec per collective), :mod:`~delaycomm.bench.results` (run records and
statistics), :mod:`~delaycomm.bench.report` (the table), :mod:`~delaycomm.bench.gate` (the regression gate),
:mod:`~delaycomm.bench.plot`. Formulas and the gate's rule: ``docs/benchmark.md``.

Importing this package is cheap: torch is imported by the modules that need it, when they need it.
"""

from delaycomm.bench.cli import main

__all__ = ["main"]
