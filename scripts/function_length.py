#!/usr/bin/env python3
"""No function longer than the limit in csrc/ and python/ (docs/ci.md, "Lint").

    scripts/function_length.py [--limit N] [--list] [PATH ...]

Python functions are measured with ``ast`` (first line of the ``def`` to its last line, decorators excluded). C++ and
CUDA function bodies are found with a small brace scanner: comments, string and character literals are blanked,
then every ``{`` whose enclosing scopes are only namespaces, classes, structs or ``extern`` blocks, and whose header
ends in a parameter list (``)``, optionally followed by qualifiers, a trailing return type or a constructor's
initialiser list), opens a function; a macro such as ``PYBIND11_MODULE(...) {`` counts too. A lambda is part of the
function that holds it.

Exempt by design: argparse parser builders (a Python function whose name starts with ``build_parser`` or
``add_arguments``, or ends with ``_parser``) and grammars listed in ``GRAMMARS`` below (a parser of a spec string is
easier to read as one function that follows the grammar than as pieces). Exits 1 and lists each offender as
``path:line: name is N lines (limit L)``.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

LIMIT = 110
ROOTS = ("csrc", "python", "bench")
# (path suffix, function name): grammars read best as one function.
GRAMMARS = {("csrc/delay/DelaySpec.cpp", "parseDelaySpec")}
PARSER_NAME = re.compile(r"^(build_parser|add_arguments)|_parser$")
CXX_SUFFIXES = (".cpp", ".hpp", ".h", ".cu", ".cuh")
SCOPE_KEYWORDS = re.compile(r"\b(namespace|class|struct|union|enum|extern)\b")
HEADER_TAIL = re.compile(
    r"\)\s*(const|noexcept(\s*\([^)]*\))?|override|final|mutable|&|&&|\s)*"
    r"(->\s*[\w:<>,\s*&]+)?\s*(:\s*[\w:]+\s*[({][^{}]*[)}]\s*(,\s*[\w:]+\s*[({][^{}]*[)}]\s*)*)?$",
    re.S,
)
TYPE_HEADER = re.compile(r"\b(class|struct|union|enum)\s+[\w:]*\s*(final\s*)?(:[^()]*)?$")
CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else|try)\s*(\(|$)")


def python_functions(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if PARSER_NAME.search(node.name):
                continue
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def _blank(text: str) -> str:
    """The source with comments and string/char literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator (1'000'000)
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _name(header: str) -> str:
    """The function's name in its header: the first name followed by a parameter list, attributes such as
    ``__launch_bounds__(256)`` aside."""
    for m in re.finditer(r"([~\w:]+)\s*\(", header):
        if m.group(1) not in ("__launch_bounds__", "__attribute__", "alignas", "decltype"):
            return m.group(1)
    return "?"


def cxx_functions(path: Path):
    text = _blank(path.read_text())
    stack: list[tuple[str, int, str]] = []  # (kind, line, name) of each open brace
    last = 0  # where the current statement's header begins
    for m in re.finditer(r"[{};]", text):
        ch, pos = m.group(), m.start()
        if ch == ";":
            last = pos + 1
            continue
        if ch == "}":
            if stack:
                kind, line, name = stack.pop()
                if kind == "function":
                    end = text.count("\n", 0, pos) + 1
                    yield name, line, end - line + 1
            last = pos + 1
            continue
        header = text[last:pos].strip()
        last = pos + 1
        if any(kind != "scope" for kind, _, _ in stack):
            stack.append(("block", 0, ""))
            continue
        # a header's own lines only (a preprocessor line before it is not part of it)
        header = "\n".join(ln for ln in header.splitlines() if not ln.lstrip().startswith("#")).strip()
        if SCOPE_KEYWORDS.match(header) or TYPE_HEADER.search(header):
            stack.append(("scope", 0, ""))
        elif "(" in header and HEADER_TAIL.search(header) and not CONTROL.search(header.split("(")[0]):
            start = text.count("\n", 0, text.rfind(header, 0, pos)) + 1
            stack.append(("function", start, _name(header)))
        elif header.endswith("=") or header == "" or header.endswith(","):  # an initialiser, an aggregate
            stack.append(("block", 0, ""))
        else:
            stack.append(("scope", 0, ""))


def files(args_paths):
    if args_paths:
        return [Path(p) for p in args_paths]
    listed = subprocess.run(["git", "ls-files", *ROOTS], capture_output=True, text=True, check=True).stdout.split()
    return [Path(p) for p in listed if p.endswith(".py") or p.endswith(CXX_SUFFIXES)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="files to check (default: git ls-files csrc python)")
    ap.add_argument("--limit", type=int, default=LIMIT, help=f"the most lines a function may have (default {LIMIT})")
    ap.add_argument("--list", type=int, metavar="N", help="print the N longest functions and exit 0")
    args = ap.parse_args(argv)
    found = []
    for path in files(args.paths):
        measure = python_functions if path.suffix == ".py" else cxx_functions
        for name, line, length in measure(path):
            if any(str(path).endswith(suffix) and name.split("::")[-1] == fn for suffix, fn in GRAMMARS):
                continue
            found.append((length, str(path), line, name))
    found.sort(reverse=True)
    if args.list:
        for length, path, line, name in found[: args.list]:
            print(f"{length:5d}  {path}:{line}: {name}")
        return 0
    over = [f for f in found if f[0] > args.limit]
    for length, path, line, name in over:
        print(f"{path}:{line}: {name} is {length} lines (limit {args.limit})")
    if over:
        print(f"{len(over)} function(s) over {args.limit} lines: split them (docs/ci.md, 'Lint')", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
