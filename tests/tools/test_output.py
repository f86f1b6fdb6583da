"""The tools' JSON: numpy and tuples converted, no NaN, written atomically."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from delaycomm._tools.output import check_writable, jsonable, write_json


def test_jsonable_converts_numpy_tuples_sets_and_non_finite_floats():
    doc = {
        "a": np.float32(1.5),
        "b": np.int64(3),
        "c": (1, 2),
        "d": np.arange(3),
        "e": {2, 1},
        "f": math.inf,
        "g": [np.bool_(True)],
        7: None,
    }
    assert jsonable(doc) == {
        "a": 1.5,
        "b": 3,
        "c": [1, 2],
        "d": [0, 1, 2],
        "e": [1, 2],
        "f": None,
        "g": [True],
        "7": None,
    }


def test_jsonable_names_what_has_no_json_form():
    with pytest.raises(TypeError, match="jsonable: a object has no JSON form"):
        jsonable({"x": object()})


def test_write_json_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    write_json(str(path), {"x": np.float64(2.0)})
    assert json.loads(path.read_text()) == {"x": 2.0}
    assert os.listdir(tmp_path) == ["r.json"]


def test_the_file_gets_the_mode_open_gives_not_a_private_one(tmp_path):
    old = os.umask(0o027)
    try:
        write_json(str(tmp_path / "r.json"), {})
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o640  # 0666 less the umask (mkstemp's would be 0600)


def test_check_writable_leaves_nothing_and_raises_where_no_file_can_be_made(tmp_path):
    check_writable(str(tmp_path / "r.json"))
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        check_writable(str(tmp_path / "missing" / "r.json"))


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    with pytest.raises(TypeError):
        write_json(str(path), {"x": object()})
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["r.json"]


def test_dash_is_stdout(capsys):
    write_json("-", {"a": (1,)})
    assert json.loads(capsys.readouterr().out) == {"a": [1]}
