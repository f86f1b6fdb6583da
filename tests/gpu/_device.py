"""Where the GPU tests run, and where they leave their evidence for bench/gpu_check.sh.

- On a machine with CUDA they run on ``cuda`` (NCCL under delaycomm, world size 1: one GPU).
- ``GPU_CHECK_DEVICE=cpu`` runs the tests that have a CPU analogue on ``cpu`` (Gloo under delaycomm): the rehearsal
  ``bench/gpu_check.sh --dry-run`` does on a machine without a GPU, so that the scripts, their checks and the
  evidence they write are exercised before GPU time is spent. Tests of what only NCCL does skip there.
- ``GPU_CHECK_OUT=DIR``: each test writes what it measured to ``DIR/<name>.json`` (gpu_check.sh folds them into
  its one JSON).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
import torch

from tests.harness import run_cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_forced = os.environ.get("GPU_CHECK_DEVICE")
if _forced not in (None, "", "cpu", "cuda"):
    raise ValueError(f"GPU_CHECK_DEVICE={_forced!r}: expected cpu or cuda (or unset: cuda when present)")
DEVICE = _forced or ("cuda" if torch.cuda.is_available() else None)

needs_device = pytest.mark.skipif(DEVICE is None, reason="needs a CUDA device (GPU_CHECK_DEVICE=cpu rehearses on CPU)")
needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="NCCL itself: needs a CUDA device")


def save_evidence(name: str, data: Any) -> None:
    """Write ``data`` to ``$GPU_CHECK_OUT/<name>.json`` when gpu_check.sh asked for it."""
    out = os.environ.get("GPU_CHECK_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(data, f, indent=1, default=str)


def child_env(**extra: str | None) -> dict[str, str]:
    """This environment as a clean user's (no DELAYCOMM_*, NCCL_* or TORCH_DEVICE_BACKEND_AUTOLOAD: torch loads the
    delaycomm backend through its entry point), plus ``extra`` (None removes a key)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DELAYCOMM_", "NCCL_")) and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run_python(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run this Python with ``args`` in the repository root; fail the test with its output unless it exits 0."""
    proc = run_cli(args, timeout=timeout, env=env, cwd=REPO)
    assert proc.returncode == 0, (
        f"{' '.join(proc.args)} exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc


def json_line(text: str, tag: str = "JSON") -> dict[str, Any]:
    """The JSON object printed on the last line starting with ``tag``."""
    lines = [ln for ln in text.splitlines() if ln.startswith(tag)]
    assert lines, f"no {tag} line in the output:\n{text[-3000:]}"
    return json.loads(lines[-1][len(tag) :])
