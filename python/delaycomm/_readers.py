"""The readers of delaycomm's input files: one bounded read, then Python's own parsers (``json``; a trace's lines).

Every file delaycomm reads (a trace, a profile, a stats file) goes through :func:`read_file`, once: only a regular
file of at most :data:`MAX_FILE_BYTES` is read (a FIFO, a device or a directory is refused without blocking or
reading it; a file that grows while it is read is refused too). Errors are :class:`FileError`, whose message
names the file the way every delaycomm message does (``trace file 'PATH' line 3: ...``) and says what is wrong and
what is accepted; callers put their own prefix in front (the delay option's, the profile command's).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from typing import Any

__all__ = [
    "MAX_FILE_BYTES",
    "FileError",
    "quote",
    "read_file",
    "file_chunks",
    "read_json",
    "read_trace",
    "TRACE_FORMAT",
]

MAX_FILE_BYTES = 64 << 20  # 64 MiB: a trace of millions of latencies, a profile of every op and size class
TRACE_FORMAT = (
    "expected one latency per line with a unit (ns, us, ms, s) such as 12.5ms; blank lines and lines starting with "
    "# are ignored"
)
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, written by some Windows editors: skipped, as most tools do
# What a text line may not hold: control characters but tab and carriage return (CRLF files).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACE = " \t\n\r\v\f"  # C's isspace: what the duration grammar trims (not Unicode spaces)


class FileError(ValueError):
    """A file delaycomm cannot use; the message names it (``profile file 'p.json' field ...``)."""


def quote(text: str) -> str:
    """``text`` quoted as delaycomm's messages quote user text (the native ``quoted()``: escaped, shortened)."""
    from delaycomm import _C

    return _C.quote(text)


def _kind(mode: int) -> str:
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def read_file(path: str, name: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, read once (:func:`file_chunks`' checks).

    Args:
        path: the file.
        name: how messages name it (``"trace file 'PATH'"``).
        limit: the largest size accepted, in bytes.

    Raises:
        FileError: not a readable regular file of at most ``limit`` bytes.
    """
    return b"".join(file_chunks(path, name, limit))


def file_chunks(
    path: str, name: str, limit: int, error: type[Exception] = FileError, chunk: int = 1 << 20
) -> Iterator[bytes]:
    """The bytes of the regular file at ``path`` in chunks of at most ``chunk`` bytes, streamed.

    Opened non-blocking (a FIFO without a writer would block ``open()``) and checked with ``fstat`` before anything
    is read; at most ``limit`` + 1 bytes are read, so ``/dev/zero``-like input and a file that grows are refused.

    Raises:
        error: (``FileError`` unless given) not a readable regular file of at most ``limit`` bytes.
    """
    if not isinstance(path, str) or not path:
        raise error(f"{name} is not a file path (expected a path to a regular file)")
    if "\0" in path:
        raise error(f"{name} has a NUL byte in its path")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise error(f"{name} cannot be opened: {e.strerror} (expected a readable regular file)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{name} is {_kind(st.st_mode)} (expected a regular file)")
        shown = f"the limit of {limit >> 20} MiB" if limit >= 1 << 20 else f"the limit of {limit} bytes"
        if st.st_size > limit:
            raise error(f"{name} has {st.st_size} bytes, more than {shown}")
        got = 0
        while got <= limit:
            try:
                data = os.read(fd, min(chunk, limit + 1 - got))
            except InterruptedError:
                continue
            except OSError as e:
                raise error(f"{name} cannot be read: {e.strerror}") from None
            if not data:
                return
            got += len(data)
            if got > limit:
                break
            yield data
        raise error(f"{name} has more than {shown} (it grew while being read)")
    finally:
        os.close(fd)


def _position(data: bytes, offset: int) -> str:
    line = data.count(b"\n", 0, offset) + 1
    column = offset - data.rfind(b"\n", 0, offset)
    return f"line {line} column {column}"


def _text(data: bytes, name: str) -> str:
    """``data`` as UTF-8 text (a byte order mark skipped), or a FileError naming the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = e.start + (3 if data.startswith(_BOM) else 0)
        raise FileError(
            f"{name} is not UTF-8 text: byte 0x{data[start]:02x} at {_position(data, start)} (a binary file?)"
        ) from None


# Python's json messages in delaycomm's words (what the native reader said before it; pinned by tests).
_JSON_WHY = {
    "Expecting value": "expected a value (a number, a string, an array, an object, true, false or null)",
    "Expecting property name enclosed in double quotes": "expected a quoted key",
    "Expecting ':' delimiter": "expected ':' after a key",
    "Expecting ',' delimiter": "expected ',' between the values of an array or an object, or its end",
    "Extra data": "unexpected text after the JSON value",
    "Unterminated string starting at": "a string is not closed",
    "Invalid control character at": "a control character in a string",
    "Invalid \\escape": "an unknown escape in a string",
    "Invalid \\uXXXX escape": "expected four hex digits after \\u",
}


class _NotJson(Exception):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _NotJson(f"the key {quote(key)} is given twice in one object")
    return out


def _constant(word: str) -> float:
    raise _NotJson(f"{word} is not a JSON number (expected finite numbers)")


def read_json(path: str, name: str, expected: str) -> Any:
    """The JSON document in the file at ``path``, read once by :func:`read_file` and Python's ``json``.

    Strict JSON: NaN and infinities and keys given twice in one object are errors, as is text that is not UTF-8 (a
    byte order mark is skipped); a number past a double's range reads as an infinity (``json``'s way), which a
    schema then refuses where it matters.

    Args:
        path: the file.
        name: how messages name it (``"profile file 'PATH'"``).
        expected: what the file should be, for messages (``"a profile written by python -m delaycomm profile"``).

    Raises:
        FileError: the file cannot be read, is empty, is not UTF-8 or is not JSON (with the line and column where
            ``json`` says so).
    """
    data = read_file(path, name)
    text = _text(data, name)
    if not text.strip():
        raise FileError(f"{name} is empty (expected {expected})")
    try:
        # NOTE: no parse_int/parse_float hooks (a Python call per number doubled the time of a big profile): a
        # number past a double's range (1e999) becomes inf, which the schemas refuse where a number matters.
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except json.JSONDecodeError as e:
        why = _JSON_WHY.get(e.msg, e.msg)
        raise FileError(f"{name} is not JSON: line {e.lineno} column {e.colno}: {why} (expected {expected})") from None
    except _NotJson as e:
        raise FileError(f"{name} is not JSON: {e} (expected {expected})") from None
    except ValueError as e:  # an integer of more digits than Python converts (4300 by default)
        raise FileError(f"{name} is not JSON that delaycomm reads: {e} (expected {expected})") from None
    except RecursionError:
        raise FileError(
            f"{name} is not JSON that delaycomm reads: it is nested too deeply (expected {expected})"
        ) from None


def _not_text(raw: bytes) -> str:
    """Why a trace line is not text (a control byte, bytes that are not UTF-8), or ``""``."""
    try:
        line, bad = raw.decode("utf-8"), -1
    except UnicodeDecodeError as e:
        line, bad = raw[: e.start].decode("utf-8"), e.start
    m = _CONTROL.search(line)
    if m:
        bad = len(line[: m.start()].encode("utf-8"))
    if bad < 0:
        return ""
    return f"is not text: byte 0x{raw[bad]:02x} at column {bad + 1} (a binary file?)"


def read_trace(path: str):
    """The latencies of the trace file at ``path`` in seconds (file order), read once.

    The format (docs/delay.md): one latency per line with a unit (``12.5ms``); blank lines and lines starting with
    ``#`` are ignored; a UTF-8 byte order mark at the start is skipped; at least one latency. Each latency is
    parsed by the native duration grammar (the one of the delay specs: 0, or 1 ns to 24 h).

    Returns:
        A float64 NumPy array.

    Raises:
        FileError: ``trace file 'PATH' ...``, naming the first bad line by number and what is wrong with it.
    """
    from delaycomm import _C

    name = f"trace file {quote(path)}"
    data = read_file(path, name)
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    lines = data.split(b"\n")
    try:
        text = data.decode("utf-8")
        clean = _CONTROL.search(text) is None
    except UnicodeDecodeError:
        clean = False
    if clean:
        first_bad = len(lines)
        texts = text.split("\n")
    else:  # the first line that is not text; the lines before it are
        first_bad = next(i for i, raw in enumerate(lines) if _not_text(raw))
        texts = [raw.decode("utf-8") for raw in lines[:first_bad]]
    numbers, kept = [], []
    for i, line in enumerate(texts):
        s = line.strip(_SPACE)
        if s and s[0] != "#":
            numbers.append(i)
            kept.append(s)
    values, bad, why = _C.parse_durations(kept)
    if bad >= 0:
        raise FileError(f"{name} line {numbers[bad] + 1}: {quote(kept[bad])} {why}; {TRACE_FORMAT}")
    if first_bad < len(lines):
        raise FileError(f"{name} line {first_bad + 1} {_not_text(lines[first_bad])}; {TRACE_FORMAT}")
    if not len(values):
        raise FileError(
            f"{name} has no latencies (expected at least one line such as 12.5ms; blank lines and lines starting "
            "with # are ignored)"
        )
    return values
