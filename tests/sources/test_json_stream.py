"""nccl-tests' ``-J`` JSON read as a stream (sources/nccl_json_stream.py) gives exactly what the whole-document read
gives (the same tables, or the same error), at every chunk boundary, in memory that does not hold the document."""

from __future__ import annotations

import codecs
import gzip
import json
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delaycomm.sources import files, nccl_json_stream
from delaycomm.sources.nccl_json import tables_from_json
from delaycomm.sources.nccl_json_stream import load_json, read_json_tables
from delaycomm.sources.nccl_tables import NcclTestsError
from tests.sources.test_fuzz import HUGE, JSON_VALUES, SETTINGS, _minus_j, _set_somewhere


def _whole(path: str):
    return tables_from_json(load_json(path), path)


def _outcome(read, path: str):
    try:
        return read(path)
    except NcclTestsError as e:
        return f"error: {e}"


def _same(path: str, monkeypatch, chunk: int) -> object:
    """The stream's outcome with chunks of ``chunk`` bytes, asserted equal to the whole read's; returned."""
    whole = _outcome(_whole, path)
    with monkeypatch.context() as m:
        m.setattr(files, "_CHUNK", chunk)
        m.setattr(nccl_json_stream, "_TRIM", min(chunk * 2, 1 << 20))
        streamed = _outcome(read_json_tables, path)
    assert streamed == whole
    return streamed


def _rec(size: int, t: float = 40.0, **more) -> dict:
    bw = size / t / 1e3
    return {"size": size, "count": size // 4, "type": "float", "redop": "sum", "root": -1,
            "out_of_place": {"time": t, "alg_bw": bw, "bus_bw": bw * 1.5, "nwrong": 0},
            "in_place": {"time": t, "alg_bw": bw, "bus_bw": bw * 1.5, "nwrong": 0}, **more}  # fmt: skip


def _dev(*ranks, host="n0"):
    return [{"rank": r, "pid": 10 + r, "hostname": host} for r in ranks]


DOCS = {
    "nccl-tests": json.dumps(_minus_j(), indent=2),
    "compact": json.dumps(_minus_j(), separators=(",", ":")),
    "nested runs": json.dumps(
        {
            "runs": [
                {"results": [_rec(8), _rec(1 << 20)], "devices": _dev(0, 1)},
                {"results": [_rec(64, 30.0)], "devices": _dev(1, host="n1")},
            ],
            "iterations": True,
            "config": {"iterations": 5, "x": {"iterations": 7}},
        }
    ),
    "devices after and inside records": json.dumps(
        {"results": [_rec(8, devices=_dev(3)), _rec(16)], "devices": _dev(3, host="late"), "args": ["x/reduce_perf"]}
    ),
    "a list that is not results": json.dumps({"results": [_rec(8), 3], "more": {"results": [_rec(16)]}}),
    "not placed": json.dumps({"results": [{"size": 8}], "x": {"results": [{"size": 8, "out_of_place": 1}]}}),
    "record errors, first list first": json.dumps(
        {"a": {"results": [_rec(8), {"size": -1, "in_place": {}}]}, "results": [{"size": 8, "in_place": {"time": "x"}}]}
    ),
    "devices error before a record's": json.dumps(
        {"results": [{"size": "x", "in_place": {}}], "devices": [{"rank": -1}]}
    ),
    "repeated key": '{"results": [' + json.dumps(_rec(8)) + '], "results": [' + json.dumps(_rec(64)) + "]}",
    "repeated key inside": '{"x": {"devices": 1, "devices": '
    + json.dumps(_dev(0))
    + '}, "results": ['
    + json.dumps(_rec(8))
    + "]}",
    "numbers at every boundary": json.dumps({"results": [_rec(8 << k, 1.0 + k / 7) for k in range(40)]}),
    "strings and escapes": json.dumps({"results": [_rec(8, type='\u00e9\\"\U0001f600' * 3)], 'a"': "\n" * 50}),
    "extra data": json.dumps({"results": [_rec(8)]}) + " {}",
    "cut": json.dumps({"results": [_rec(8), _rec(16)]})[:-20],
    "trailing comma": '{"results": [' + json.dumps(_rec(8)) + ",]}",
    "not an object": json.dumps([{"results": [_rec(8)]}]),
    "empty": "",
    "deep": '{"results": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "deep in a record": '{"results": [{"size": 8, "in_place": ' + "[" * 100_000 + "]" * 100_000 + "}]}",
    "deep streamed": '{"a": ' + '{"a": ' * 100 + "1" + "}" * 101,
    "huge integer": '{"results": [{"size": ' + "9" * 5000 + ', "in_place": {}}]}',
    "huge integer outside": '{"x": ' + "9" * 5000 + ', "results": [' + json.dumps(_rec(8)) + "]}",
    "NaN": '{"results": [{"size": 8, "in_place": {"time": NaN}}]}',
}


@pytest.mark.parametrize("name", sorted(DOCS))
def test_the_stream_reads_as_the_whole_document_at_every_chunk_size(tmp_path, monkeypatch, name):
    p = tmp_path / "doc.json"
    p.write_text(DOCS[name])
    for chunk in (1, 3, 7, 64, 1 << 20):
        _same(str(p), monkeypatch, chunk)


def test_gzip_bom_other_encodings_and_bad_utf8_read_as_before(tmp_path, monkeypatch):
    text = DOCS["nested runs"]
    cases = {
        "doc.json.gz": gzip.compress(text.encode()),
        "bom.json": codecs.BOM_UTF8 + text.encode(),
        "utf16.json": text.encode("utf-16-le"),  # read whole (json.loads reads it)
        "bad.json": text.encode()[:100] + b"\xff\xfe" + text.encode()[100:],
        "surrogate.json": text.replace('"n1"', '"\\ud800"').encode(),
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        for chunk in (1, 5, 1 << 20):
            _same(str(p), monkeypatch, chunk)
    assert _outcome(read_json_tables, str(tmp_path / "bad.json")).startswith("error:")


def test_what_the_stream_refuses_is_named_as_before(tmp_path, monkeypatch):
    p = tmp_path / "deep.json"
    p.write_text(DOCS["deep"])
    assert "nests its values too deep" in _same(str(p), monkeypatch, 1 << 20)
    p.write_text(DOCS["record errors, first list first"])  # the outermost list first, as the whole walk finds it
    assert "results[0]: field in_place.time is 'x'" in _same(str(p), monkeypatch, 1 << 20)
    p.write_text(DOCS["devices error before a record's"])
    assert "devices[0].rank is -1" in _same(str(p), monkeypatch, 1 << 20)


@SETTINGS
@given(data=st.data())
def test_mutated_documents_read_by_the_stream_as_by_the_whole_read(tmp_path_factory, monkeypatch, data):
    doc = _minus_j()
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        _set_somewhere(doc, data, data.draw(JSON_VALUES, label="value"))
    indent = data.draw(st.sampled_from([None, 0, 2]), label="indent")
    text = json.dumps(doc, indent=indent).replace(json.dumps(HUGE), "9" * 5000)
    if data.draw(st.booleans(), label="cut"):
        text = text[: data.draw(st.integers(0, len(text)), label="at")]
    p = tmp_path_factory.mktemp("doc") / "doc.json"
    p.write_text(text)
    _same(str(p), monkeypatch, data.draw(st.sampled_from([1, 7, 1 << 20]), label="chunk"))


def test_the_stream_does_not_hold_the_document(tmp_path, monkeypatch):
    """Python memory (tracemalloc: the machine's load does not change it) above what each read returns (the table's
    rows, the same for both), in one process: the whole read holds the document, the stream a window of chunks."""
    p = tmp_path / "big.json"
    p.write_text(json.dumps({"devices": _dev(*range(8)), "results": [_rec(8 << (i % 30)) for i in range(5000)]}))
    monkeypatch.setattr(files, "_CHUNK", 64 << 10)
    monkeypatch.setattr(nccl_json_stream, "_TRIM", 64 << 10)
    above = []
    for read in (_whole, read_json_tables):
        tracemalloc.start()
        tables = read(str(p))
        kept, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(tables[0].rows) == 5000
        above.append(peak - kept)
    whole, streamed = above
    assert whole > 2 * p.stat().st_size, (streamed, whole)  # the document: its bytes, text and parsed records
    assert streamed < 8 * (64 << 10), (streamed, whole)  # a few chunks: the bytes read, their text, one record
