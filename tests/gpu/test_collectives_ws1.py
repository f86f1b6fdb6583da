"""Every collective that exists at world size 1, through delaycomm over NCCL (GPU) — sync and async — with exact
results and every call counted. The table is tests/gpu/collectives_ws1.py; GPU_CHECK_DEVICE=cpu rehearses it over
Gloo."""

from __future__ import annotations

import pytest

from tests.gpu._device import DEVICE, child_env, json_line, needs_device, run_python, save_evidence

pytestmark = [pytest.mark.gpu, needs_device]


@pytest.mark.timeout(300)
def test_every_collective_at_world_size_1_sync_and_async():
    proc = run_python(["tests/gpu/collectives_ws1.py", "--device", DEVICE], child_env(), timeout=280)
    out = json_line(proc.stdout)
    save_evidence(f"collectives_ws1_{DEVICE}", out)
    assert out["backend"] == "DelayBackend"
    failed = {k: out["errors"].get(k, "wrong result") for k, ok in out["cases"].items() if not ok}
    assert not failed, failed
    assert not out["uncounted"], f"telemetry missed calls (op: [made, counted]): {out['uncounted']}"
    # both forms of every case ran (future.then exists only with async_op=True)
    assert len(out["cases"]) == 41
