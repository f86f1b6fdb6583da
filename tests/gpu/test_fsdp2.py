"""FSDP2 on the GPU through delaycomm: an FSDP2 training loop, and the stale reduce-scatter as FSDP2 issues it (in
its reduction scope, a new input every step) on the device, under torchrun with DELAYCOMM_* only. World size 1
(one GPU): FSDP2 itself issues no collective there, so the stream is issued by the script (tests/gpu/fsdp2_ws1.py);
what can fail is the device path: the fused CUDA blend over the full input, one reduce-scatter of the original size,
flush by reduce-scatter, and conservation under apply. GPU_CHECK_DEVICE=cpu rehearses it over Gloo.
"""

from __future__ import annotations

import pytest

from tests.gpu._device import DEVICE, child_env, json_line, needs_device, run_python, save_evidence

pytestmark = [pytest.mark.gpu, needs_device]

STEPS = 40


@pytest.mark.timeout(300)
def test_fsdp2_trains_and_its_reduce_scatter_goes_stale_on_the_device():
    # step_ms pinned (10 ms, a 20 ms delay is 2 steps late): this checks the device path, not calibration.
    env = child_env(
        DELAYCOMM_DELAY="const:20ms",
        DELAYCOMM_DELAY_FRACTION="0.3",
        DELAYCOMM_STALENESS="ssp:2",
        DELAYCOMM_STALE_POLICY="apply",
        DELAYCOMM_STEP_MS="10",
    )
    proc = run_python(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "1",
            "tests/gpu/fsdp2_ws1.py",
            "--device",
            DEVICE,
            "--steps",
            str(STEPS),
        ],
        env,
        timeout=280,
    )
    out = json_line(proc.stdout)
    save_evidence(f"fsdp2_{DEVICE}", out)

    losses = out["losses"]
    assert all(v == v for v in losses) and sum(losses[-5:]) < sum(losses[:5]), losses  # finite, and it learns
    st = out["stats"]
    rs, stale = st["ops"]["_reduce_scatter_base"], st["staleness"]
    # one reduce-scatter of the original size per step, plus one per stream left pending for flush
    assert rs["calls"] == STEPS + out["flushed"], rs
    assert stale["steps"] == STEPS and stale["stale"] > 0 and stale["staleness"]["max"] <= 2, stale
    assert stale["keys"] == 1, stale  # a new input every step, one stream: keyed by FSDP2's scope
    assert out["conservation_error"] == 0.0, out["conservation_error"]
