"""JSON records: converted once (numpy scalars and arrays, tuples, non-finite floats) and written atomically.

A record written by a tool is read back by reports and gates (pyperf's "measure, then analyse"), possibly while
a run is still writing the next one: a reader must never see half a file, so the text goes to a temporary file
in the same directory and is renamed over the target. The file gets the mode a plain ``open(path, "w")`` gives
(0666 less the umask), as users expect of a file a tool writes (``tempfile.mkstemp`` would make it private).
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import sys
from typing import Any

__all__ = ["jsonable", "dumps", "write_json", "read_json", "check_writable"]


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
    fd, tmp = _create_temporary(path)
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


def read_json(path: str, error: type[Exception] = ValueError) -> Any:
    """Read a JSON record a tool wrote; every failure is ``error`` with a message that starts with ``path``.

    Raises:
        error: ``<path>: no such file``, ``<path>: cannot be read: ...`` or ``<path>: not valid JSON (<what> at line
            L column C)``.
    """
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path}: cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def check_writable(path: str) -> None:
    """Create and remove a temporary file as :func:`write_json` would to write ``path``.

    A check made ahead of a write (a stats file is checked when its group is created and written when it is
    destroyed): the directory exists and this process may create a file in it.

    Raises:
        OSError: the temporary file cannot be created.
    """
    fd, tmp = _create_temporary(path)
    os.close(fd)
    os.remove(tmp)


def _create_temporary(path: str) -> tuple[int, str]:
    """A new file beside ``path`` (the same directory, so that ``os.replace`` is atomic), open for writing.

    Its name is hidden and unused (``.NAME.PID.RANDOM.tmp``, created exclusively); its mode is 0666 less the umask,
    applied by the kernel (NOTE: not ``tempfile.mkstemp``, whose 0600 the renamed file would keep).
    """
    directory, name = os.path.split(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name after 100 tries", os.path.join(directory, f".{name}"))
