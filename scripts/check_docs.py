#!/usr/bin/env python3
"""Checks of the documentation (docs/ci.md, "Lint"); standard library only, about a second.

  python3 scripts/check_docs.py [--no-code] [--no-paths]

- links: every relative link in README.md, docs/*.md and the READMEs of bench/results/ resolves: the file or
  folder exists, and a `#anchor` is a heading of the target (GitHub's rules for heading anchors) or an explicit HTML
  anchor;
- results: a code span in those files that names a path under bench/results/, bench/baselines/ or docs/bench/
  names one that exists, so a figure's pointer to its result file cannot go stale (`--no-paths` skips it);
- length: README.md has at most 300 lines;
- tracker references: no reference to an issue tracker ("issue", "defect", "bug" or "ticket" with a number, or a
  bare "#" and a number used as an issue number) and no pointer into a README section by its name (the README is
  a front door and its sections move; cite docs/ pages) in those Markdown files, and, with --code (the
  default), in the code's comments and strings (csrc/, python/, bench/, tests/, scripts/, examples/, .ci/,
  .github/). An upstream reference in GitHub's owner/repo form ("pytorch/pytorch" then "#" and the number) is a
  citation, not a tracker reference.

Prints `path:line: message` for each finding; exits 1 when there is any, 0 otherwise.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

README_MAX_LINES = 300
CODE_DIRS = ("csrc", "python", "bench", "tests", "scripts", "examples", ".ci", ".github")
CODE_SUFFIXES = {".py", ".pyi", ".cpp", ".hpp", ".h", ".cu", ".cuh", ".sh", ".yml", ".yaml", ".toml", ".cmake", ""}
# Where measured results live: a code span naming a path under these must name one that exists.
RESULT_ROOTS = ("bench/results/", "bench/baselines/", "docs/bench/")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"""<a\s+(?:name|id)\s*=\s*["']([^"']+)["']""", re.I)
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), with an optional "title"; the text may hold one level of brackets.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)

TRACKER_WORD = re.compile(r"\b(issues?|defects?|bugs?|tickets?)\s*#?\s*(\d+)\b", re.I)
# A bare "#N" is an issue number after these words, or standing alone in brackets, or right after a comment
# marker; "bucket #0" or "all-reduce #6" (an ordinal in program output) is not.
HASH_NUMBER = re.compile(r"(?<![\w/.\-#])#(\d+)\b")
HASH_CONTEXT = re.compile(
    r"(?:\b(?:see|in|per|fixes|fixed|fix|closes|closed|resolves|resolved|cf\.?|from|after|by|and|also|tracked|"
    r"PR|PRs)|//|#|\(|\[|,)\s*$",
    re.I,
)
README_SECTION = re.compile(
    r"README(?:'s|\.md)?\s*[,:]?\s+(?:section\s+)?[\"“][A-Z]|README(?:\.md)?,\s+(?:section\s+)?[A-Z][a-z]"
    r"|\bsee the README\b|\bthe README advises\b"
)


def slug(text: str) -> str:
    """GitHub's anchor of a heading: the rendered text, lower-cased, punctuation removed, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(2), text)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    kept = []
    for ch in text:
        if ch in " -_" or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def prose_lines(text: str):
    """(line number, line, inside a fenced block) for every line of a Markdown file."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            yield number, line, True
            continue
        yield number, line, fenced


def anchors_of(path: Path, cache: dict[Path, set[str]]) -> set[str]:
    if path not in cache:
        found: set[str] = set()
        counts: dict[str, int] = {}
        for _, line, fenced in prose_lines(path.read_text(encoding="utf-8")):
            if fenced:
                continue
            found.update(HTML_ANCHOR.findall(line))
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                n = counts.get(base, 0)
                counts[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def check_links(root: Path, md: Path, text: str, cache: dict[Path, set[str]], out: list[str]) -> None:
    rel = md.relative_to(root)
    for number, line, fenced in prose_lines(text):
        if fenced:
            continue
        bare = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)
        targets = [m.group(1) for m in LINK.finditer(bare)]
        ref = REF_DEF.match(bare)
        if ref:
            targets.append(ref.group(1))
        for target in targets:
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (md.parent / file_part).resolve() if file_part else md
            try:
                dest.relative_to(root)
            except ValueError:
                out.append(f"{rel}:{number}: link '{target}' leaves the repository")
                continue
            if not dest.exists():
                out.append(f"{rel}:{number}: link '{target}': no file {dest.relative_to(root)}")
                continue
            if anchor and dest.suffix == ".md" and anchor.lower() not in anchors_of(dest, cache):
                out.append(
                    f"{rel}:{number}: link '{target}': no heading with the anchor #{anchor} in {dest.relative_to(root)}"
                )


def check_paths(root: Path, md: Path, text: str, out: list[str]) -> None:
    rel = md.relative_to(root)
    for number, line, fenced in prose_lines(text):
        if fenced:
            continue
        for m in INLINE_CODE.finditer(line):
            span = m.group(2).strip()
            if not span.startswith(RESULT_ROOTS) or re.search(r"[\s*?<>{}$\[\]|]|\.\.\.", span):
                continue
            path = re.sub(r"(:\d+(-\d+)?|#.*)$", "", span)
            if not (root / path).exists():
                out.append(f"{rel}:{number}: `{span}` names no committed result file or folder")


def tracker_findings(line: str) -> list[str]:
    found = []
    for m in TRACKER_WORD.finditer(line):
        found.append(f"tracker reference '{m.group(0)}': cite the docs/ page that says it instead")
    for m in HASH_NUMBER.finditer(line):
        before = line[: m.start()]
        if HASH_CONTEXT.search(before) and not TRACKER_WORD.search(before[-12:] + m.group(0)):
            found.append(f"tracker reference '#{m.group(1)}': cite the docs/ page that says it instead")
    for m in README_SECTION.finditer(line):
        found.append(f"points into a README section ('{m.group(0)}...'): cite the docs/ page that holds it instead")
    return found


def check_tracker(root: Path, path: Path, text: str, out: list[str]) -> None:
    rel = path.relative_to(root)
    for number, line in enumerate(text.splitlines(), 1):
        for message in tracker_findings(line):
            out.append(f"{rel}:{number}: {message}")


def code_files(root: Path) -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *CODE_DIRS],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        paths = [root / p for p in listed]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for d in CODE_DIRS if (root / d).is_dir() for p in (root / d).rglob("*") if p.is_file()]
    this = Path(__file__).resolve()
    keep = []
    for p in paths:
        rel = p.relative_to(root).as_posix()
        if rel.startswith("bench/results/") or rel.startswith("bench/baselines/") or p.resolve() == this:
            continue
        if p.suffix in CODE_SUFFIXES and p.is_file():
            keep.append(p)
    return sorted(keep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--code",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also look for tracker references in the code (default: on)",
    )
    parser.add_argument(
        "--paths",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check that code spans naming result files exist (default: on)",
    )
    parser.add_argument(
        "--root", type=Path, default=Path(__file__).resolve().parent.parent, help="the repository's root"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    out: list[str] = []
    docs = [
        root / "README.md",
        *sorted((root / "docs").glob("*.md")),
        *sorted((root / "bench/results").rglob("README.md")),
    ]
    cache: dict[Path, set[str]] = {}
    for md in docs:
        if not md.exists():
            out.append(f"{md.relative_to(root)}:1: missing")
            continue
        text = md.read_text(encoding="utf-8")
        check_links(root, md, text, cache, out)
        if args.paths:
            check_paths(root, md, text, out)
        check_tracker(root, md, text, out)
    lines = len((root / "README.md").read_text(encoding="utf-8").splitlines()) if (root / "README.md").exists() else 0
    if lines > README_MAX_LINES:
        out.append(f"README.md:{lines}: {lines} lines, more than {README_MAX_LINES}: move detail to docs/")
    if args.code:
        for path in code_files(root):
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            check_tracker(root, path, text, out)
    for finding in out:
        print(finding)
    return 1 if out else 0


if __name__ == "__main__":
    sys.exit(main())
