"""The package's import structure: no import cycles inside delaycomm, and every module importable on its own.

The graph is read from the sources (ast), with every import a module makes, at module level or inside a function:
an import deferred into a function hides a cycle from the interpreter but not from a reader (the layers are
config -> registry / NCCL -> stats -> backend; docs/core.md).
"""

from __future__ import annotations

import ast
import json
import pathlib
import textwrap

import pytest

from tests.harness import run_cli

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[2] / "python"


def _modules() -> dict[str, pathlib.Path]:
    """Dotted name -> source file of every module of delaycomm (a package by its ``__init__``)."""
    out = {}
    for path in sorted((PACKAGE_ROOT / "delaycomm").rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str, path: pathlib.Path, module_level_only: bool) -> set[str]:
    """The delaycomm modules that ``name`` imports.

    ``from P import X`` names the module P.X when X is one, else P itself. An import of one of the module's own
    parent packages is left out: the interpreter runs a package's ``__init__`` before any of its modules, so such
    an edge is never a cycle that can bite.
    """
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    if module_level_only:  # statements nested in module-level if/try blocks still run at import
        nodes = [
            n
            for top in tree.body
            for n in ast.walk(top)
            if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
    package = name if _is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:  # `import delaycomm._C` (compiled) or a name inside a module
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):
                found.add(t)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same module, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_graph_reader_sees_imports_and_cycles():
    # the reader on this package's own modules: what it must find, so that an empty graph cannot pass
    backend = _imports("delaycomm._backend", MODULES["delaycomm._backend"], module_level_only=True)
    assert {"delaycomm._config", "delaycomm._registry", "delaycomm._stats.file", "delaycomm._nccl"} <= backend
    assert "delaycomm" not in backend  # `from delaycomm import _C`: the parent package, not an edge
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) is None


@pytest.mark.parametrize("module_level_only", [True, False], ids=["module-level", "with-function-level"])
def test_no_import_cycle_inside_delaycomm(module_level_only):
    graph = {name: _imports(name, path, module_level_only) for name, path in MODULES.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# Each module imported first, in an interpreter where nothing of delaycomm is loaded yet (torch and the compiled
# module stay loaded: importing torch once is what makes this one process instead of one per module).
_IMPORT_EACH = textwrap.dedent("""
    import importlib, json, sys, traceback
    import torch, torch.distributed
    import delaycomm._C  # the compiled module cannot be initialised twice in a process
    failures = {}
    for name in sys.argv[1:]:
        for loaded in [m for m in sys.modules if m == "delaycomm" or m.startswith("delaycomm.")]:
            if loaded != "delaycomm._C":
                del sys.modules[loaded]
        try:
            importlib.import_module(name)
        except BaseException:
            failures[name] = traceback.format_exc(limit=-3)
    print(json.dumps(failures))
""")


@pytest.mark.timeout(180)
def test_every_module_imports_on_its_own():
    proc = run_cli(["-c", _IMPORT_EACH, *MODULES], timeout=170)
    assert proc.returncode == 0, proc.stderr
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failures == {}, "\n".join(f"{k}:\n{v}" for k, v in failures.items())
