"""Reading a source file, plain or gzip (told by gzip's magic bytes, not by the file's name), whole or by lines.

Every source is opened as :func:`delaycomm._readers.read_file` opens a file: only a regular file is read (a FIFO or
a device is refused without blocking on it), and its size is bounded, both as stored and as decompressed (a
profiler trace is larger than a profile, so the bound is :data:`MAX_SOURCE_BYTES`). Decompression runs in chunks
against that bound, so a gzip bomb is refused after the limit, not after it has been inflated whole; a text log is
read line by line (:func:`iter_lines`), so its rows are never all in memory at once.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from delaycomm._readers import file_chunks

__all__ = ["MAX_SOURCE_BYTES", "read_bytes", "read_head", "iter_lines", "iter_chunks"]

MAX_SOURCE_BYTES = 512 << 20  # 512 MiB, stored or decompressed: a day of nccl-tests logs, a long Kineto trace
_CHUNK = 1 << 20


def _gunzip_chunks(chunks: Iterator[bytes], name: str, error: type[Exception], limit: int) -> Iterator[bytes]:
    """The decompressed bytes of gzip members (one after another, as ``cat a.gz b.gz`` makes them), in chunks of
    at most :data:`_CHUNK`, refusing as soon as more than ``limit`` bytes came out."""
    got = 0
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    begun = False  # some of the current member was fed to d
    padding = False  # after the last member: zero bytes only (block padding, which gzip itself ignores)
    for chunk in chunks:
        pending = chunk
        while pending:
            if padding or (not begun and pending[:1] == b"\0"):
                if pending.strip(b"\0"):
                    raise error(f"{name} is not valid gzip (bytes after its last member)")
                padding = True
                break
            begun = True
            try:
                out = d.decompress(pending, _CHUNK)
            except zlib.error as e:
                raise error(f"{name} is not valid gzip ({e})") from None
            got += len(out)
            if got > limit:
                raise error(f"{name} decompresses to more than the limit of {limit >> 20} MiB")
            if out:
                yield out
            if d.eof:
                pending, begun = d.unused_data, False
                if pending[:1] not in (b"", b"\0", b"\x1f"):  # another member, zero padding, or nothing
                    raise error(f"{name} is not valid gzip (bytes after its last member)")
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            else:
                pending = d.unconsumed_tail
    if begun:
        raise error(f"{name} is not valid gzip (it ends before its last member does)")


def _chunks(path: str, name: str, error: type[Exception]) -> Iterator[bytes]:
    raw = file_chunks(path, name, MAX_SOURCE_BYTES, error, _CHUNK)
    first = next(raw, b"")
    while len(first) < 2:
        more = next(raw, None)
        if more is None:
            break
        first += more

    def again() -> Iterator[bytes]:
        if first:
            yield first
        yield from raw

    if first[:2] == b"\x1f\x8b":
        return _gunzip_chunks(again(), name, error, MAX_SOURCE_BYTES)
    return again()


def read_bytes(path: str, what: str, error: type[Exception]) -> bytes:
    """The content of ``path``, decompressed when it is gzip.

    Args:
        path: the file.
        what: how messages name it (``"trace"``, ``"nccl-tests log"``).
        error: the exception raised, its message naming the file and what is wrong.
    """
    name = f"{what} {path!r}"
    out = bytearray()
    for chunk in _chunks(path, name, error):
        out += chunk
    return out  # type: ignore[return-value]  # bytes-like: not copied once more


def iter_chunks(path: str, what: str, error: type[Exception]) -> Iterator[bytes]:
    """The content of ``path`` (decompressed when gzip) in chunks of at most 1 MiB, as they are read: memory does
    not grow with the file (nccl-tests' ``-J`` JSON is parsed from them as a stream)."""
    return _chunks(path, f"{what} {path!r}", error)


def read_head(path: str, what: str, error: type[Exception], size: int = 1 << 16) -> bytes:
    """The first ``size`` bytes of the content of ``path`` (decompressed when it is gzip)."""
    name = f"{what} {path!r}"
    out = bytearray()
    chunks = _chunks(path, name, error)
    try:
        for chunk in chunks:
            out += chunk
            if len(out) >= size:
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return bytes(out[:size])


def iter_lines(path: str, what: str, error: type[Exception]) -> Iterator[str]:
    """The lines of the text at ``path`` (decompressed when gzip), without their ends, undecodable bytes replaced;
    read in chunks, so that memory does not grow with the file."""
    name = f"{what} {path!r}"
    rest = b""
    for chunk in _chunks(path, name, error):
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) > 64 * _CHUNK:
                raise error(f"{name} has a line longer than {64 * _CHUNK >> 20} MiB (it is not a text log)")
            rest = data
            continue
        yield from data[:cut].decode("utf-8", errors="replace").splitlines()
        rest = data[cut:]
    if rest:
        yield from rest.decode("utf-8", errors="replace").splitlines()
