"""The layers of the native core: each folder of csrc/ includes its own headers and those of the folders below it,
never one above (docs/core.md, "The C++ layers"). Read from the sources' ``#include "..."`` lines, so that a cycle
such as backend/ <-> delay/ cannot come back unnoticed.
"""

from __future__ import annotations

import pathlib
import re

CSRC = pathlib.Path(__file__).resolve().parents[2] / "csrc"

# From the bottom; folders on one line do not include each other.
LAYERS = [("ops",), ("kernels", "stats"), ("delay",), ("stale",), ("backend",), ("bindings",)]
RANK = {folder: i for i, line in enumerate(LAYERS) for folder in line}

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _includes() -> list[tuple[str, str, str]]:
    """(including folder, including file, included path) of every quoted include in csrc/."""
    out = []
    for path in sorted(CSRC.rglob("*")):
        if path.suffix not in {".hpp", ".cpp", ".cu", ".cuh", ".h"}:
            continue
        rel = path.relative_to(CSRC)
        for included in _INCLUDE.findall(path.read_text()):
            out.append((rel.parts[0], str(rel), included))
    return out


def _upward(edges: list[tuple[str, str, str]]) -> list[str]:
    """The includes that name a folder on the same line or above their own, as 'file -> included'."""
    bad = []
    for folder, source, included in edges:
        target = included.split("/")[0]
        if target != folder and RANK[target] >= RANK[folder]:
            bad.append(f"{source} -> {included}")
    return bad


def test_the_include_reader_sees_the_includes():
    # what it must find, so that an empty reading cannot pass; and an upward include is caught
    edges = _includes()
    assert ("backend", "backend/DelayBackend.hpp", "delay/DelayInjector.hpp") in edges
    assert ("bindings", "bindings/Module.cpp", "bindings/Bindings.hpp") in edges
    assert _upward([("delay", "delay/X.cpp", "backend/DelayWork.hpp")]) == ["delay/X.cpp -> backend/DelayWork.hpp"]
    assert _upward([("kernels", "kernels/X.cpp", "stats/OpStats.hpp")]) == ["kernels/X.cpp -> stats/OpStats.hpp"]


def test_every_folder_has_a_layer_and_every_include_exists():
    folders = {p.name for p in CSRC.iterdir() if p.is_dir()}
    assert folders == set(RANK), "place a new csrc/ folder in LAYERS (and in docs/core.md, 'The C++ layers')"
    missing = [f"{source} -> {included}" for _, source, included in _includes() if not (CSRC / included).is_file()]
    assert not missing, "includes that name no file of csrc/: " + ", ".join(missing)


def test_no_include_goes_up_a_layer():
    bad = _upward(_includes())
    assert not bad, "includes that go up a layer (docs/core.md, 'The C++ layers'): " + ", ".join(bad)
