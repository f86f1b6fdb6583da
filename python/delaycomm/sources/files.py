"""Reading a source file whole, plain or gzip (told by gzip's magic bytes, not by the file's name).

The bytes come through :func:`delaycomm._readers.read_file`, as every file delaycomm reads does: only a regular file
is read (a FIFO or a device is refused without blocking on it), and its size is bounded, both as stored and as
decompressed (a profiler trace is larger than a profile, so the bound is :data:`MAX_SOURCE_BYTES`)."""

from __future__ import annotations

import zlib

from delaycomm._readers import FileError, read_file

__all__ = ["MAX_SOURCE_BYTES", "read_bytes"]

MAX_SOURCE_BYTES = 512 << 20  # 512 MiB, stored or decompressed: a day of nccl-tests logs, a long Kineto trace


def _gunzip(data: bytes, name: str, error: type[Exception]) -> bytes:
    out, rest = [], data
    got = 0
    while rest[:2] == b"\x1f\x8b":  # gzip allows members one after another (cat a.gz b.gz)
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = d.decompress(rest, MAX_SOURCE_BYTES + 1 - got)
        except zlib.error as e:
            raise error(f"{name} is not valid gzip ({e})") from None
        got += len(chunk)
        out.append(chunk)
        if got > MAX_SOURCE_BYTES or d.unconsumed_tail:
            raise error(f"{name} decompresses to more than the limit of {MAX_SOURCE_BYTES >> 20} MiB")
        if not d.eof:
            raise error(f"{name} is not valid gzip (it ends before its last member does)")
        rest = d.unused_data
    return b"".join(out)


def read_bytes(path: str, what: str, error: type[Exception]) -> bytes:
    """The content of ``path``, decompressed when it is gzip.

    Args:
        path: the file.
        what: how messages name it (``"trace"``, ``"nccl-tests log"``).
        error: the exception raised, its message naming the file and what is wrong.
    """
    name = f"{what} {path!r}"
    try:
        data = read_file(path, name, MAX_SOURCE_BYTES)
    except FileError as e:
        raise error(str(e)) from None
    return _gunzip(data, name, error) if data[:2] == b"\x1f\x8b" else data
