"""JSON records: converted once (numpy scalars and arrays, tuples, non-finite floats) and written atomically.

A record written by a tool is read back by reports and gates (pyperf's "measure, then analyse"), possibly while
a run is still writing the next one: a reader must never see half a file, so the text goes to a temporary file
in the same directory and is renamed over the target.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from typing import Any

__all__ = ["jsonable", "dumps", "write_json"]


def jsonable(value: Any, *, nan: Any = None) -> Any:
    """``value`` with numpy scalars and arrays, tuples and sets turned into JSON types, recursively.

    Args:
        value: any mix of dicts, lists, tuples, numbers, strings, None and numpy values.
        nan: what a non-finite float becomes (default None: JSON has no NaN or infinity).

    Raises:
        TypeError: a value that has no JSON form (named with its type).
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v, nan=nan) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, nan=nan) for v in value]
    if isinstance(value, (set, frozenset)):
        return [jsonable(v, nan=nan) for v in sorted(value)]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else nan
    item = getattr(value, "item", None)  # numpy scalars, 0-d arrays, one-element tensors
    tolist = getattr(value, "tolist", None)  # numpy arrays
    if callable(tolist) and getattr(value, "ndim", 0):
        return jsonable(tolist(), nan=nan)
    if callable(item):
        return jsonable(item(), nan=nan)
    raise TypeError(f"jsonable: a {type(value).__name__} has no JSON form ({value!r:.80})")


def dumps(record: Any) -> str:
    """The record as JSON text: indented, keys in insertion order, strictly JSON (no NaN)."""
    return json.dumps(jsonable(record), indent=1, allow_nan=False)


def write_json(path: str, record: Any) -> str:
    """Write ``record`` as JSON to ``path`` atomically, or to stdout when ``path`` is ``-``.

    Args:
        path: the file (its directory must exist), or ``-``.
        record: the document (converted by :func:`jsonable`).

    Returns:
        The JSON text written.

    Raises:
        OSError: the file cannot be written (the target is left as it was).
    """
    text = dumps(record) + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return text
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return text
