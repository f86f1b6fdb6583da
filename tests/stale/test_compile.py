"""torch.compile under staleness adds no graph break of delaycomm's own (docs/staleness.md, "torch.compile"): an
unmodified compiled DDP job (tests/stale/scripts/compile_job.py) run as torchrun runs it, once on plain Gloo and once
on delaycomm configured only through DELAYCOMM_* (ssp:2, stale_policy=apply, the delay kept), each rank counting
Dynamo's graph breaks (``torch._dynamo.utils.counters["graph_break"]``). The counts, reason by reason, must be the
same; no warning may name one of delaycomm's native functions (pybind11 mangles their names); and the compiled DDP
module's buckets must still go stale.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.harness.user_job import run_user_job

pytestmark = [pytest.mark.multiproc]

JOB = Path(__file__).resolve().parent / "scripts" / "compile_job.py"
USER_ENV = {
    "DELAYCOMM_DELAY": "exp:p99=30ms",
    "DELAYCOMM_DELAY_FRACTION": "0.3",
    "DELAYCOMM_STALENESS": "ssp:2",
    "DELAYCOMM_STALE_POLICY": "apply",
}
STEPS = 30


def _run(backend: str, variants: list[str], tmp_path: Path, timeout: float = 400):
    import torch

    out = tmp_path / backend
    args = ["--backend", backend, "--variants", ",".join(variants), "--steps", str(STEPS), "--out", str(out)]
    env = USER_ENV if backend == "delaycomm" else {}
    proc = run_user_job("forked", JOB, args, env, tmp_path, timeout=timeout)
    results: dict = collections.defaultdict(dict)
    for p in out.glob("*.pt"):
        variant, rank = p.stem.split(".rank")
        results[variant][int(rank)] = torch.load(p, weights_only=False)
    assert sorted(results) == sorted(variants), sorted(results)
    return results, proc


def _check(variants: list[str], tmp_path: Path) -> dict:
    gloo, _ = _run("gloo", variants, tmp_path)
    ours, proc = _run("delaycomm", variants, tmp_path)
    for variant in variants:
        for rank in range(2):
            want, got = gloo[variant][rank]["graph_breaks"], ours[variant][rank]["graph_breaks"]
            print(f"{variant} rank {rank}: gloo {sum(want.values())} breaks, delaycomm {sum(got.values())}")
            assert got == want, f"{variant} rank {rank}: graph breaks on delaycomm {got}, on plain Gloo {want}"
    for text in ("pybind11", "delaycomm._C"):
        assert text not in proc.stderr, f"a warning names {text!r}:\n{proc.stderr[-4000:]}"
    return ours


# NOTE: slow (scripts/test.sh --slow; docs/ci.md): two launches that each compile. The default run compares the
# compiled path's graph breaks under ssp:2 with bsp's, where none of delaycomm's hooks is installed
# (tests/stale/test_paths.py).
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compiled_ddp_adds_no_graph_break_and_goes_stale(tmp_path):
    ours = _check(["compiled"], tmp_path)
    for rank in range(2):
        ar = ours["compiled"][rank]["stats"]["ops"]["allreduce"]
        assert ar["stale_calls"] > 0, f"compiled DDP did not go stale on rank {rank}: {ar}"


# NOTE: slow (scripts/test.sh --slow; docs/ci.md): compiling a backward under compiled autograd costs tens of CPU
# seconds. Its buckets are kept fresh by design (reduced inside a compiled autograd graph; tests/stale/test_owners.py).
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_autograd_adds_no_graph_break(tmp_path):
    _check(["cautograd"], tmp_path)
