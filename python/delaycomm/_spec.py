"""The delay spec, parsed once: text in, the native handle (``delaycomm._C.DelaySpec``) out (docs/core.md, "Options").

The grammar is the native one (``csrc/delay/DelaySpec.cpp``: families, percentiles, durations); a file the spec
names is read here, once, by Python's readers: a trace by :func:`delaycomm._readers.read_trace`, a profile by
``json`` and checked by the one schema check (:mod:`delaycomm._schema`). The handle holds the data, its content
digest and the solved distribution; the option check (``delaycomm._config``), the ranks' agreement, the
backend, the samplers and the tools all read it, and never the file again.
"""

from __future__ import annotations

from delaycomm import _C, _readers, _schema

__all__ = ["parse", "parse_with_metadata"]


def parse(text: str):
    """The parsed spec of ``text``: :func:`parse_with_metadata`'s spec."""
    return parse_with_metadata(text)[0]


def parse_with_metadata(text: str):
    """The parsed spec of ``text`` (``exp:p99=400ms``, ``trace:FILE``, ``profile:FILE``, ``none``...).

    Returns:
        ``(spec, metadata)``: an immutable ``delaycomm._C.DelaySpec``, and a profile's ``metadata`` object (the
        job it was recorded in: ``world_size``, ``retargeted``...; docs/profile.md) or None for other specs.

    Raises:
        ValueError: ``delaycomm: invalid delay spec 'TEXT': WHY`` (the native grammar's, or the file's: ``trace file
            'PATH' line 3: ...``, ``profile file 'PATH' field ops.allreduce[0].count ...``).
    """
    source = _C.delay_spec_file(text)
    if source is None:
        return _C.DelaySpec.parse(text), None
    family, path = source
    try:
        if family == "trace":
            return _C.DelaySpec.of_trace(text, _readers.read_trace(path)), None
        doc, profile = _schema.read_profile(path)
        return _C.DelaySpec.of_profile(text, profile), doc["metadata"]
    except _readers.FileError as e:
        raise ValueError(_C.delay_spec_error(text, str(e))) from None
