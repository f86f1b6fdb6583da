"""`python -m delaycomm profile` keeps its promise for bad input (docs/profile.md): a file that is not stats, or an
-o that cannot take the profile, exits 2 with `error:` and the file's name, no traceback, and nothing left behind.

Table-driven: every case is generated (truncated, empty, binary, not UTF-8, NaN, huge numbers, deep nesting, a
wrong type at every field a profile is built from, files that are not regular files, bad outputs). The CLI runs
in-process (its main()); the cases that could block or read without end (a FIFO, /dev/zero) run in a child
process with a timeout and a memory limit, so a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import math
import os

import pytest

BASE = 1.02


def _stats(ns: float = 1e6) -> dict:
    """A valid stats file of one rank: allreduce of 1 KiB, 3 calls of ~ns."""
    b = math.floor(math.log(ns) / math.log(BASE))
    h = {"base": BASE, "unit": "ns", "count": 3, "zeros": 0, "sum_ns": 3 * ns, "min_ns": ns, "max_ns": ns,
         "buckets": [[b, 3]]}  # fmt: skip
    return {"group": "0", "rank": 0, "world_size": 2, "host": "h", "backends": ["gloo"], "machine": {"cpus": 2},
            "ops": {"allreduce": {"calls": 3, "by_size": [{"bytes": 1024, "calls": 3, "histogram": h}]}}}  # fmt: skip


HIST = ("ops", "allreduce", "by_size", 0, "histogram")
# (field, bad values): a wrong type, or a value out of range, at every field a profile is built from.
WRONG = [
    (("world_size",), ["2", None, [], 0, 1.5, True, 1e999]),
    (("rank",), ["0", [], -1, 1.5, True]),
    (("group",), [None, [], {}, True]),
    (("backends",), ["gloo", [1], {}, None]),
    (("host",), [5, [], {}]),
    (("machine",), ["m", [], 5]),
    (("ops",), [None, [], "x", 5]),
    (("ops", "allreduce"), [None, [], "x", 5]),
    (("ops", "allreduce", "by_size"), [None, {}, "x"]),
    (("ops", "allreduce", "by_size", 0), [None, [], "x"]),
    (("ops", "allreduce", "by_size", 0, "bytes"), ["1024", None, -1, 1000, 1.5, True, 1e999, 2**70]),
    (HIST, [None, [], "x"]),
    (HIST + ("base",), [1.1, "1.02", None]),
    (HIST + ("unit",), ["us", None, 5]),
    (HIST + ("count",), ["3", None, -1, 1.5, True, 4, 2**60]),
    (HIST + ("zeros",), ["0", None, -1, 1.5]),
    (HIST + ("sum_ns",), ["x", None, -1, 1e999]),
    (HIST + ("min_ns",), ["x", None, -1, 1e999]),
    (HIST + ("max_ns",), ["x", None, -1, 1e999, 1.0]),
    (HIST + ("buckets",), [None, {}, "x", []]),
    (HIST + ("buckets", 0), [None, 5, [1], [1, 2, 3], {}]),
    (HIST + ("buckets", 0, 0), ["1", -1, 1700, 1.5, None, True]),
    (HIST + ("buckets", 0, 1), ["3", 0, -1, 1.5, None, True]),
]


def _mutated(where: tuple, value) -> str:
    doc = _stats()
    *head, last = where
    target = doc
    for k in head:
        target = target[k]
    target[last] = value
    return json.dumps(doc)


def _texts() -> list[tuple[str, bytes]]:
    """(case id, the content of a bad stats file)."""
    good = json.dumps(_stats())
    out = [
        ("truncated", good[: len(good) // 2].encode()),
        ("empty", b""),
        ("blank", b" \n\t\n"),
        ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"),
        ("not-utf8", good.replace('"h"', '"h\xff"').encode("latin-1")),
        ("nan", good.replace('"min_ns": 1000000.0', '"min_ns": NaN').encode()),
        ("infinity", good.replace('"sum_ns": 3000000.0', '"sum_ns": -Infinity').encode()),
        ("huge-int", good.replace('"world_size": 2', '"world_size": ' + "9" * 5000).encode()),
        ("deep", ('{"ops": {}, "x": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()),
        ("duplicate-key", good.replace('"rank": 0', '"rank": 0, "rank": 1').encode()),
        ("array", b"[1, 2]"),
        ("string", b'"stats"'),
        ("null", b"null"),
        ("unknown-op", good.replace('"allreduce"', '"bogus"').encode()),
        ("nul-in-op", good.replace('"allreduce"', '"all\\u0000reduce"').encode()),
        ("groups-not-groups", json.dumps({"groups": {"0": 5}}).encode()),
        ("old-stats", json.dumps(dict(_stats(), ops={"allreduce": {"calls": 3}})).encode()),
    ]
    for where, values in WRONG:
        for i, value in enumerate(values):
            out.append((f"{'.'.join(map(str, where))}={i}", _mutated(where, value).encode()))
    return out


TEXTS = _texts()


def _expect_refusal(rc, err: str, names: list[str], out_dir) -> None:
    assert rc == 2, err
    assert err.startswith("error: "), err
    assert "Traceback" not in err, err
    assert any(n in err for n in names), (names, err)  # names the file at fault
    assert "\x00" not in err and len(err) < 4000, err  # readable, never the whole input
    assert not (out_dir / "out.json").exists()  # nothing left behind, temporary files included
    assert not [p for p in os.listdir(out_dir) if p.endswith(".tmp")]


@pytest.mark.parametrize("case, data", TEXTS, ids=[c for c, _ in TEXTS])
def test_a_bad_stats_file_exits_2_naming_it_and_leaves_nothing(tmp_path, capsys, case, data):
    from delaycomm.__main__ import main

    good = tmp_path / "good.json"
    good.write_text(json.dumps(_stats()))
    # NOTE: a short name: messages keep a long path's first and last 38 characters (the file's name is at its end).
    bad = tmp_path / f"bad{next(i for i, (c, _) in enumerate(TEXTS) if c == case)}.json"
    bad.write_bytes(data)
    rc = main(["profile", str(good), str(bad), "-o", str(tmp_path / "out.json")])
    _expect_refusal(rc, capsys.readouterr().err, [bad.name], tmp_path)


def _not_files(tmp_path) -> list[tuple[str, str]]:
    d = tmp_path / "a-directory"
    d.mkdir()
    return [("missing", str(tmp_path / "missing.json")), ("directory", str(d)), ("unreadable", "/proc/self/mem")]


@pytest.mark.parametrize("kind", ["missing", "directory", "unreadable"])
def test_an_input_that_is_no_readable_regular_file_exits_2(tmp_path, capsys, kind):
    from delaycomm.__main__ import main

    path = dict(_not_files(tmp_path))[kind]
    rc = main(["profile", path, "-o", str(tmp_path / "out.json")])
    _expect_refusal(rc, capsys.readouterr().err, [os.path.basename(path)], tmp_path)


def _outputs(tmp_path, good: str) -> list[tuple[str, list[str], str]]:
    """(case, argv after 'profile', the name the error must give)."""
    os.mkdir(tmp_path / "out-dir")
    os.symlink(good, tmp_path / "link.json")
    os.link(good, tmp_path / "hard.json")
    os.mkfifo(tmp_path / "fifo.json")
    return [
        ("missing-directory", [good, "-o", str(tmp_path / "nope" / "p.json")], "nope"),
        ("directory", [good, "-o", str(tmp_path / "out-dir")], "out-dir"),
        ("the-input", [good, "-o", good], "good.json"),
        ("the-input-by-a-link", [good, "-o", str(tmp_path / "link.json")], "link.json"),
        ("the-input-by-a-hard-link", [good, "-o", str(tmp_path / "hard.json")], "hard.json"),
        ("a-fifo", [good, "-o", str(tmp_path / "fifo.json")], "fifo.json"),
        ("png-is-the-input", [good, "-o", str(tmp_path / "out.json"), "--png", good], "good.json"),
        ("png-directory", [good, "-o", str(tmp_path / "out.json"), "--png", str(tmp_path / "out-dir")], "out-dir"),
        ("nul-in-output", [good, "-o", str(tmp_path / "o\0ut.json")], "ut.json"),
    ]


@pytest.mark.parametrize(
    "case",
    ["missing-directory", "directory", "the-input", "the-input-by-a-link", "the-input-by-a-hard-link", "a-fifo",
     "png-is-the-input", "png-directory", "nul-in-output"],
)  # fmt: skip
def test_a_bad_output_exits_2_before_anything_is_read_and_the_input_stays(tmp_path, capsys, case):
    from delaycomm.__main__ import main

    good = tmp_path / "good.json"
    text = json.dumps(_stats())
    good.write_text(text)
    argv, name = next((a, n) for c, a, n in _outputs(tmp_path, str(good)) if c == case)
    rc = main(["profile", *argv])
    _expect_refusal(rc, capsys.readouterr().err, [name], tmp_path)
    assert good.read_text() == text  # never overwritten


@pytest.mark.parametrize(
    "metadata",
    [{"jobs": 5, "backends": "gloo", "world_size": [1], "created": {"a": 1}}, {"jobs": [{"ranks": 3}, 7]}, {}],
)
def test_show_prints_every_profile_the_loader_accepts(tmp_path, capsys, metadata):
    from delaycomm.__main__ import main

    good = tmp_path / "good.json"
    good.write_text(json.dumps(_stats()))
    out = tmp_path / "p.json"
    assert main(["profile", str(good), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    doc["metadata"] = metadata  # free-form: the loader accepts any object there
    out.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["profile", "--show", str(out)]) == 0, capsys.readouterr().err
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert [r[:3] for r in rows] == [["allreduce", "1024", "3"]]


def test_show_of_a_file_that_is_not_a_profile_names_it_and_the_field(tmp_path, capsys):
    from delaycomm.__main__ import main

    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(_stats()))
    assert main(["profile", "--show", str(stats)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: delaycomm: profile: profile file ") and "stats.json' field format is missing" in err
    head = {"format": "delaycomm-profile", "version": 1, "histogram": {"base": 1.02, "unit": "ns"}, "metadata": {}}
    (tmp_path / "nul.json").write_text(json.dumps({**head, "ops": {"all\0reduce": 1}}))
    assert main(["profile", "--show", str(tmp_path / "nul.json")]) == 2
    err = capsys.readouterr().err
    assert "nul.json' field ops.'all\\x00reduce' is not an op delaycomm knows" in err, err  # escaped, not cut


_IN_CHILD = """
import contextlib, io, resource, sys
with open("/proc/self/status") as f:
    vm = int(next(line for line in f if line.startswith("VmSize:")).split()[1]) << 10
limit = vm + (4 << 30)  # 4 GiB more than it has: a reader that reads /dev/zero without end fails here, not the host
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from delaycomm.__main__ import main
for path in sys.argv[1:]:
    print(main(["profile", path, "-o", "out.json"]), flush=True)
"""


@pytest.mark.timeout(180)
def test_a_fifo_or_an_endless_input_is_refused_without_blocking_or_reading_it(tmp_path, monkeypatch):
    # In a process of its own, with a timeout and an address-space limit: a reader that blocked on the FIFO or read
    # /dev/zero without end fails the test instead of hanging it or exhausting the machine.
    from tests.harness import run_cli

    monkeypatch.chdir(tmp_path)  # the child runs here too
    os.mkfifo("fifo.json")
    proc = run_cli(["-c", _IN_CHILD, "fifo.json", "/dev/zero"], timeout=120)
    assert proc.stdout.split() == ["2", "2"], proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert "error: delaycomm: profile: file 'fifo.json' is a FIFO (expected a regular file)" in lines
    assert "error: delaycomm: profile: file '/dev/zero' is a character device (expected a regular file)" in lines
    assert "Traceback" not in proc.stderr
    assert not os.path.exists("out.json")
