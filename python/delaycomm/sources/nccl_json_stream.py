"""nccl-tests' ``-J`` JSON read as a stream: memory that grows with the records' rows, not with the document.

The document's text is decoded in chunks (gzip decompressed against the source limit by :mod:`.files`) into a
sliding window, and its containers are walked without recursion: each element of an array that is an object (a
record of a ``results`` list) is decoded alone (``json.JSONDecoder.raw_decode`` at its offset in the window), handed
to the row parser and dropped, so the parsed document is never held. The small fields (``devices``, ``iterations``,
the top-level ``args`` and ``nccl_version``) are kept as values; everything else is skipped as it is read.

The result is exactly that of :func:`.nccl_json.tables_from_json` on the whole document: the values of the keys it
looks for are ordered as its breadth-first walk finds them (by depth, then by place in the document), a record's
error is raised only where that walk would have raised it (after the devices', for a list that is a results list),
and every input the stream does not read the same way is read whole instead (:class:`_WholeRead`): JSON that is
not valid (the parser's own message, line and column), text that is not UTF-8, an object with a repeated key (the
whole read keeps the last value), values nested deeper than :data:`_MAX_DEPTH`, a number too long to convert.
"""

from __future__ import annotations

import codecs
import json
from collections import deque
from collections.abc import Iterator

from delaycomm.sources.files import iter_chunks, read_bytes
from delaycomm.sources.nccl_json import _KEYS, _PLACES, _devices, _row, _tables, tables_from_json
from delaycomm.sources.nccl_tables import NcclTestsError, Row, Table

__all__ = ["read_json_tables", "load_json"]

_MARGIN = 16  # a value decoded this close to the window's end may be cut short (a number, a literal): read more
_MAX_STREAM_DEPTH = 64  # containers walked by the stream; deeper documents are read whole
_MAX_DEPTH = 512  # any value nested deeper is read whole (where json's own limit decides, as before)
_TRIM = 1 << 20  # the window drops the text before its position once this much is behind it
_DECODER = json.JSONDecoder()  # as json.loads decodes (no hooks)


class _WholeRead(Exception):
    """This input is read whole, as before streaming (its result or error is the whole read's)."""


def load_json(path: str) -> object:
    """The whole parsed document (read when the stream cannot read an input the same way)."""
    data = read_bytes(path, "nccl-tests JSON", NcclTestsError)
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise NcclTestsError(f"nccl-tests JSON {path!r} is not JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise NcclTestsError(f"nccl-tests JSON {path!r} is not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise NcclTestsError(
            f"nccl-tests JSON {path!r} nests its values too deep (not nccl-tests' -J output)"
        ) from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise NcclTestsError(f"nccl-tests JSON {path!r} is not JSON that delaycomm reads ({e})") from None


class _Window:
    """The document's text, decoded chunk by chunk; ``buf[pos:]`` is what is not read yet."""

    def __init__(self, chunks: Iterator[bytes]):
        self.chunks = chunks
        self.buf = ""
        self.pos = 0
        self.base = 0  # the offset in the text of buf[0]
        self.eof = False
        head = b""
        while len(head) < 4:
            more = next(chunks, None)
            if more is None:
                break
            head += more
        encoding = json.detect_encoding(head)
        if encoding not in ("utf-8", "utf-8-sig"):
            raise _WholeRead  # UTF-16/32, which json.loads also reads
        self.decoder = codecs.getincrementaldecoder(encoding)("surrogatepass")  # as json.loads decodes bytes
        self._add(head)

    def _add(self, data: bytes | None) -> None:
        try:
            text = self.decoder.decode(data or b"", final=data is None)
        except UnicodeDecodeError:
            raise _WholeRead from None  # the whole read names the byte
        if self.pos >= _TRIM and self.pos * 2 >= len(self.buf):
            self.buf, self.base, self.pos = self.buf[self.pos :], self.base + self.pos, 0
        self.buf += text
        if data is None:
            self.eof = True

    def read_more(self, at_least: int = 1) -> None:
        """At least ``at_least`` more characters in the window, or the end of the text."""
        want = len(self.buf) - self.pos + at_least
        while not self.eof and len(self.buf) - self.pos < want:
            self._add(next(self.chunks, None))

    def peek(self) -> str:
        """The next character that is not JSON whitespace (the window moved to it), or "" at the end."""
        while True:
            buf, pos, n = self.buf, self.pos, len(self.buf)
            while pos < n and buf[pos] in " \t\n\r":
                pos += 1
            self.pos = pos
            if pos < n:
                return buf[pos]
            if self.eof:
                return ""
            self.read_more()

    def value(self) -> object:
        """The JSON value at the window's position, decoded whole; the window moves past it."""
        decoder = _DECODER
        while True:
            try:
                obj, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if not self.eof and (e.msg.startswith("Unterminated string") or e.pos >= len(self.buf) - _MARGIN):
                    self.read_more(max(_TRIM, len(self.buf) - self.pos))  # doubling: linear in the value's size
                    continue
                raise _WholeRead from None  # the whole read gives json's message, line and column
            except (RecursionError, ValueError):
                raise _WholeRead from None
            if not self.eof and end >= len(self.buf) - _MARGIN:  # a number or literal may go on after the window
                self.read_more(max(_TRIM, len(self.buf) - self.pos))
                continue
            self.pos = end
            return obj

    def take(self, c: str) -> None:
        if self.peek() != c:
            raise _WholeRead
        self.pos += 1


class _List:
    """A ``results`` value that is a list, its records made rows as they come (kept while they may be needed)."""

    def __init__(self, order: tuple):
        self.order = order
        self.n = 0
        self.sized = True  # every element so far an object with a size (else it is not a results list)
        self.placed = False  # some record has out_of_place or in_place timings
        self.rows: list[Row] | None = []
        self.error: NcclTestsError | None = None  # its first record that fails, raised only if it is a results list

    def add(self, r: object, path: str) -> None:
        i = self.n
        self.n += 1
        if not (isinstance(r, dict) and "size" in r):
            self.sized, self.rows = False, None
            return
        self.placed = self.placed or any(p in r for p, _ in _PLACES)
        if self.rows is None or not self.sized:
            return
        try:
            self.rows.append(_row(r, i, path))
        except NcclTestsError as e:
            self.error, self.rows = e, None


class _Found:
    """What the breadth-first walk of :func:`.nccl_json._find` finds, with the order it would find it in."""

    def __init__(self, path: str):
        self.path = path
        self.values: dict[str, list[tuple[tuple, object]]] = {k: [] for k in _KEYS}
        self.lists: list[_List] = []
        self.top: dict = {}

    def key(self, key: str, order: tuple, value: object) -> _List | None:
        """The value of one of :data:`_KEYS` in an object at ``order`` (depth, place in the document)."""
        if key != "results":
            self.values[key].append((order, value))
            return None
        lst = _List(order)
        self.lists.append(lst)
        return lst

    def inside(self, v: object, depth: int, at: int) -> None:
        """The keys inside a value decoded whole (at depth ``depth``, offset ``at``), in breadth-first order."""
        todo = deque([(v, depth)])
        i = 0
        while todo:
            d, k = todo.popleft()
            i += 1
            if k > _MAX_DEPTH:
                raise _WholeRead
            if isinstance(d, dict):
                for key in _KEYS:
                    if key in d:
                        lst = self.key(key, (k, at, i), d[key])
                        if lst is not None and isinstance(d[key], list):
                            for r in d[key]:
                                lst.add(r, self.path)
                        elif lst is not None:
                            lst.sized = False
                todo.extend((x, k + 1) for x in d.values() if isinstance(x, (dict, list)))
            elif isinstance(d, list):
                todo.extend((x, k + 1) for x in d if isinstance(x, (dict, list)))

    def tables(self) -> list[Table]:
        lists = sorted((lst for lst in self.lists if lst.n and lst.sized), key=lambda lst: lst.order)
        if not any(lst.placed for lst in lists):
            raise NcclTestsError(f"nccl-tests JSON {self.path!r} has no results list of nccl-tests records")
        found = {k: [v for _, v in sorted(vs, key=lambda x: x[0])] for k, vs in self.values.items()}
        ranks = _devices(found, self.path)
        for lst in lists:
            if lst.error is not None:
                raise lst.error
        return _tables(self.top, found, ranks, [lst.rows or [] for lst in lists], self.path)


def _walk(w: _Window, f: _Found) -> None:
    """The document, its containers walked with a stack (no recursion), its records decoded one at a time."""
    if w.peek() != "{":
        raise _WholeRead  # not an object: the whole read refuses it as before
    # a frame: [is an object, depth, offset, keys seen, the results list it is, values read]
    stack: list[list] = []

    def push(obj: bool, depth: int, lst: _List | None) -> None:
        if depth > _MAX_STREAM_DEPTH:
            raise _WholeRead
        stack.append([obj, depth, w.base + w.pos, set() if obj else None, lst, 0])
        w.pos += 1

    push(True, 0, None)
    while stack:
        fr = stack[-1]
        obj, depth, at, keys, lst, n = fr
        c = w.peek()
        if c == ("}" if obj else "]"):
            w.pos += 1
            stack.pop()
            continue
        if n:
            w.take(",")
            c = w.peek()
        fr[5] = n + 1
        if obj:
            if c != '"':
                raise _WholeRead
            key = w.value()
            if key in keys:
                raise _WholeRead  # json.loads keeps the last of a repeated key
            keys.add(key)
            w.take(":")
            c = w.peek()
            if key in ("devices", "iterations") or (depth == 0 and key in ("args", "nccl_version")):
                pos = w.base + w.pos
                v = w.value()
                if key in _KEYS:
                    f.key(key, (depth, at, 0), v)
                else:
                    f.top[key] = v
                if isinstance(v, (dict, list)):
                    f.inside(v, depth + 1, pos)
                continue
            new = f.key(key, (depth, at, 0), None) if key == "results" else None
            if new is not None and c != "[":
                new.sized = False
            if c in "{[" and c:
                push(c == "{", depth + 1, new if c == "[" else None)
            else:
                w.value()
            continue
        # an element of an array
        if c == "{":
            pos = w.base + w.pos
            r = w.value()
            f.inside(r, depth + 1, pos)
            if lst is not None:
                lst.add(r, f.path)
            continue
        if lst is not None:
            lst.add(None, f.path)  # not a record: the list is not a results list
        if c == "[":
            push(False, depth + 1, None)
        else:
            w.value()
    if w.peek() != "":
        raise _WholeRead  # more after the document: the whole read says "Extra data"


def read_json_tables(path: str) -> list[Table]:
    """The tables of the nccl-tests ``-J`` document at ``path``, as :func:`.nccl_json.tables_from_json` makes them
    from the whole document, read as a stream (the whole document only for the inputs :class:`_WholeRead` lists).

    Raises:
        NcclTestsError: the file cannot be read, is not JSON, or has no results list, or a record does not have
            nccl-tests' fields (naming the file and the record).
    """
    chunks = iter_chunks(path, "nccl-tests JSON", NcclTestsError)
    try:
        f = _Found(path)
        try:
            _walk(_Window(chunks), f)
        except _WholeRead:
            pass
        else:
            return f.tables()
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return tables_from_json(load_json(path), path)
