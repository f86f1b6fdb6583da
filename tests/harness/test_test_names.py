"""Every test file under tests/ and bench/ has a name of its own (the basename), so a name in a log, a
``--durations`` line or a ``-k``/path selection points at one file."""

from __future__ import annotations

import collections
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_test_file_has_a_name_of_its_own():
    where = collections.defaultdict(list)
    for top in ("tests", "bench"):
        for folder, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d not in ("results", "__pycache__")]
            for name in files:
                if name.startswith("test_") and name.endswith(".py"):
                    where[name].append(os.path.relpath(os.path.join(folder, name), REPO))
    assert not {name: paths for name, paths in where.items() if len(paths) > 1}
