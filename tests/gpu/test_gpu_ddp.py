"""DDP on the GPU through delaycomm as a user runs it: an unmodified script under torchrun, configured only by
DELAYCOMM_* variables; bsp vs ssp:2 + ema, with a delay. World size 1 (one GPU).

At world size 1 "the same losses as raw NCCL" proves little (a wrapper that reduced nothing would pass), so these
tests check what can fail there: the injected delay shows in delaycomm's CUDA-event latency of exactly the delayed
calls, staleness engages under ssp:2 (stale contributions counted), and the stats count every call.
GPU_CHECK_DEVICE=cpu rehearses the same script and checks over Gloo.
"""

from __future__ import annotations

import json

import pytest

from tests.gpu._device import DEVICE, child_env, json_line, needs_device, run_python, save_evidence

pytestmark = [pytest.mark.gpu, needs_device]

STEPS = 60
DELAY_MS = 20.0  # const: every delayed call is held back exactly this long


def _train(tmp_path, name: str, backend: str = "delaycomm", **delaycomm_env: str) -> tuple[dict, dict | None]:
    stats = tmp_path / f"{name}.stats.json"
    env = child_env(**delaycomm_env)
    if backend == "delaycomm":
        env["DELAYCOMM_STATS"] = str(stats)
    proc = run_python(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "1",
            "tests/gpu/ddp_train.py",
            "--backend",
            backend,
            "--device",
            DEVICE,
            "--steps",
            str(STEPS),
        ],
        env,
        timeout=280,
    )
    out = json_line(proc.stdout)
    st = json.loads(stats.read_text()) if backend == "delaycomm" else None
    return out, st


@pytest.mark.timeout(600)
def test_ddp_bsp_and_ssp2_ema_with_delay(tmp_path):
    raw_backend = "nccl" if DEVICE == "cuda" else "gloo"
    raw, _ = _train(tmp_path, "raw", backend=raw_backend)
    bsp, bsp_st = _train(tmp_path, "bsp", DELAYCOMM_DELAY=f"const:{DELAY_MS:g}ms")
    ssp, ssp_st = _train(
        tmp_path,
        "ssp2",
        DELAYCOMM_DELAY=f"const:{DELAY_MS:g}ms",
        DELAYCOMM_STALENESS="ssp:2",
        DELAYCOMM_STALE_POLICY="ema",
    )
    save_evidence(
        f"ddp_{DEVICE}", {"raw": raw, "bsp": {"run": bsp, "stats": bsp_st}, "ssp2_ema": {"run": ssp, "stats": ssp_st}}
    )

    # bsp: a delay changes time, never the arithmetic
    assert bsp["losses"] == raw["losses"] and bsp["param_sum"] == raw["param_sum"]
    ar = bsp_st["ops"]["allreduce"]
    # every call counted: one bucket (the model is small), one all_reduce per step; each timed or counted untimed
    assert ar["calls"] == STEPS, ar
    assert ar["latency"]["count"] + ar["untimed"] == ar["calls"], ar
    # the default delay_fraction (0.3) delays some calls, not all
    assert 0 < ar["delayed_calls"] < ar["calls"], ar
    # the delay shows in the latency delaycomm measured: the slowest calls took at least the delay, the median call
    # (undelayed) did not (histogram buckets are 2% wide)
    assert ar["delay"]["p50_us"] >= 0.98 * DELAY_MS * 1e3, ar["delay"]
    assert ar["latency"]["max_us"] >= 0.98 * DELAY_MS * 1e3, ar["latency"]
    assert ar["latency"]["p50_us"] < DELAY_MS * 1e3, ar["latency"]

    # ssp:2 + ema: the same script, late contributions counted as stale instead of waited for
    ar2, stale = ssp_st["ops"]["allreduce"], ssp_st["staleness"]
    assert ar2["calls"] == STEPS, ar2
    assert stale["steps"] == STEPS, stale
    assert stale["stale"] > 0, stale
    assert stale["staleness"]["max"] <= 2, stale
    assert all(v == v and abs(v) < 1e3 for v in ssp["losses"]), ssp["losses"]  # finite
    assert ssp["losses"] != raw["losses"]  # stale blending changed the arithmetic
