"""Tests launch processes through the harness only (tests/harness: run_procs, run_in_child, run_cli,
run_command), so that every
process a test starts has a timeout, is killed with what it started, and reports its outcome.

Read from the source (the syntax tree, so comments and strings don't count): a call of a process-launching function
anywhere under tests/ outside tests/harness fails this test, listed by file and line. The programs that tests run
(rank scripts, the GPU check's scripts, the delay tests' workers) are held to it too: they run inside a process the
harness started and bounds, and a process they started would outlive it. The library's own launchers
(delaycomm._tools.launch, the bench's --nproc) are code under test: tests may drive them.
"""

from __future__ import annotations

import ast
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(TESTS, "harness")

# module -> functions of it that start a process
LAUNCHERS = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"},
    "pty": {"spawn", "fork"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
    "multiprocessing": {"Process", "Pool", "Manager"},
    "torch.multiprocessing": {"Process", "Pool", "spawn", "start_processes"},
    "concurrent.futures": {"ProcessPoolExecutor"},
}
PREFIXES = {"os": ("exec", "spawn")}  # os.execv..., os.spawnl...
# Any object's .Process(...) / .Pool(...): a multiprocessing context's (get_context("spawn").Process).
CONTEXT_METHODS = {"Process", "Pool"}


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> what it names (``sp`` -> ``subprocess``, ``run`` -> ``subprocess.run``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else f"?.{node.attr}"
    if isinstance(node, ast.Call):  # get_context("spawn").Process
        return "?"
    return None


def _launches(name: str) -> bool:
    module, _, func = name.rpartition(".")
    if func in LAUNCHERS.get(module, ()) or func.startswith(PREFIXES.get(module, ("\0",))):
        return True
    return module != "" and module not in LAUNCHERS and func in CONTEXT_METHODS


def offenders(path: str) -> list[tuple[int, str]]:
    """(line, call) of each process-launching call in the file at ``path``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name is None:
            continue
        head, _, rest = name.partition(".")
        resolved = aliases.get(head, head) + (f".{rest}" if rest else "")
        if _launches(resolved):
            found.append((node.lineno, resolved))
    return found


# Launches a test needs for what it checks, each with the reason; anything else is refused.
ALLOWED = {
    # The rank starts a child of its own on purpose: the test checks that Ctrl-C of `experiment run` stops it too.
    ("tests/experiment/scripts/edge_job.py", "subprocess.Popen"),
}


def _test_sources() -> list[str]:
    paths = []
    for root, dirs, files in os.walk(TESTS):
        dirs[:] = [d for d in dirs if d != "__pycache__" and os.path.join(root, d) != HARNESS]
        paths += [os.path.join(root, f) for f in files if f.endswith(".py")]
    return sorted(paths)


def test_no_test_launches_a_process_outside_the_harness():
    found = []
    for path in _test_sources():
        rel = os.path.relpath(path, TESTS)
        found += [
            f"tests/{rel}:{line}: {call}" for line, call in offenders(path) if (f"tests/{rel}", call) not in ALLOWED
        ]
    assert not found, (
        "launch processes through tests/harness (run_procs, run_in_child, run_cli, run_command: each is bounded and "
        "reports its outcome), not directly:\n" + "\n".join(found)
    )


def test_the_check_finds_every_way_of_launching(tmp_path):
    src = tmp_path / "t.py"
    src.write_text(
        "import os, subprocess as sp, multiprocessing\n"
        "from subprocess import check_output\n"
        "import torch.multiprocessing as mp\n"
        "# subprocess.run(['in a comment'])\n"
        "def f():\n"
        "    '''subprocess.Popen in a docstring'''\n"
        "    sp.run(['true'])\n"
        "    check_output(['true'])\n"
        "    os.system('true')\n"
        "    os.execv('/bin/true', ['true'])\n"
        "    mp.spawn(f)\n"
        "    multiprocessing.get_context('spawn').Process(target=f)\n"
        "    ctx = multiprocessing.get_context('spawn')\n"
        "    ctx.Process(target=f)\n"
        "    multiprocessing.active_children()\n"
        "    os.getpid()\n"
    )
    assert offenders(str(src)) == [
        (7, "subprocess.run"),
        (8, "subprocess.check_output"),
        (9, "os.system"),
        (10, "os.execv"),
        (11, "torch.multiprocessing.spawn"),
        (12, "?.Process"),
        (14, "ctx.Process"),
    ]
