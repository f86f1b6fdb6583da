"""Reading a source file whole, plain or gzip (told by gzip's magic bytes, not by the file's name)."""

from __future__ import annotations

import gzip

__all__ = ["read_bytes"]


def read_bytes(path: str, what: str, error: type[Exception]) -> bytes:
    """The content of ``path``, decompressed when it is gzip.

    Args:
        path: the file.
        what: how messages name it (``"trace"``, ``"nccl-tests log"``).
        error: the exception raised, its message naming the file and what is wrong.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise error(f"{what} {path!r} cannot be read ({e.strerror})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise error(f"{what} {path!r} is not valid gzip ({e})") from None
    return data
