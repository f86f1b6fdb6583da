"""Runs every ecosystem recipe (docs/ecosystem.md) on delaycomm and on gloo under torchrun, 2 ranks on CPU, and checks
what matters: the ranks' parameters are equal after training, they are bit for bit those of the same script on
gloo, and delaycomm was used (rank 0's counters show its calls, some of them delayed). It also runs each front
end's own way, which must fail as docs/ecosystem.md says: refused with an error, or (ignite's auto_model,
Lightning's strategy="ddp") caught by these checks. Exits 1 if any check fails.

    python examples/ecosystem/check.py [--only NAME ...] [--keep DIR]

Needs accelerate, transformers, pytorch-ignite, lightning and deepspeed (scripts/ecosystem-check.sh installs them
into a venv of their own). NOTE: delaycomm's leg runs with a delay (DELAYCOMM_DELAY, below): under the default
staleness, bsp, a delay changes when a collective completes, never what it computes, so the parameters must still be
gloo's to the bit; the delayed calls counted prove that delaycomm carried the job's collectives.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DELAY = {"DELAYCOMM_DELAY": "exp:p99=5ms", "DELAYCOMM_DELAY_FRACTION": "0.5"}
TIMEOUT_S = 600
SHARED_STORE_TRIES = 2  # the restart without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 fails only now and then


@dataclasses.dataclass
class Recipe:
    name: str
    script: str
    package: str  # whose version the table shows
    args: tuple[str, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    torchrun: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()  # --way values the front end refuses with an error
    ckpt: bool = False  # takes --ckpt DIR
    wrong: tuple[str, ...] = ()  # --way values that end normally but wrongly: the checks must catch them


RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
RECIPES = (
    Recipe("accelerate", "accelerate_job.py", "accelerate", refused=("kwargs",)),
    Recipe("transformers Trainer", "trainer_job.py", "transformers", refused=("ddp_backend",)),
    Recipe("ignite", "ignite_job.py", "pytorch-ignite", refused=("parallel",), wrong=("auto_model",)),
    Recipe("Lightning", "lightning_job.py", "lightning", wrong=("ddp",)),
    Recipe("DeepSpeed ZeRO-2", "deepspeed_job.py", "deepspeed", args=("--stage", "2"), env={"DS_ACCELERATOR": "cpu"}),
    Recipe("DeepSpeed ZeRO-3", "deepspeed_job.py", "deepspeed", args=("--stage", "3"), env={"DS_ACCELERATOR": "cpu"}),
    Recipe(
        "torchrun restarts", "restart_job.py", "torch", env=RESTART_ENV, torchrun=("--max-restarts", "1"), ckpt=True
    ),
)


@dataclasses.dataclass
class Leg:
    """One torchrun run of a recipe and what it left: each rank's result file, its exit status, its output."""

    rc: int
    seconds: float
    output: str
    ranks: list[dict]

    IGNORED = "ChildFailedError|fails on purpose"  # torchrun's summary; the restart recipe's own failure

    def params_equal_across_ranks(self) -> bool:
        return len(self.ranks) == 2 and self.ranks[0]["params"] == self.ranks[1]["params"]

    def error(self) -> str:
        """The last exception line a rank printed (torchrun's own summary aside): after a restart, the last
        attempt's."""
        for line in reversed(self.output.splitlines()):
            line = re.sub(r"^\[rank\d+\]:\s*", "", line.strip())
            if re.match(r"^[\w.]+(Error|Exception): ", line) and not re.search(self.IGNORED, line):
                return line if len(line) <= 240 else line[:237] + "..."
        return f"exit status {self.rc}, no exception printed"


def run_leg(recipe: Recipe, backend: str, way: str, out: str, env: dict[str, str], args=()) -> Leg:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DELAYCOMM_")}  # only what the leg sets
    base.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    base.update(recipe.env)
    base.update(env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *recipe.torchrun]
    cmd += [os.path.join(HERE, recipe.script), "--backend", backend, "--way", way, "--out", out, *recipe.args, *args]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=base, capture_output=True, text=True, timeout=TIMEOUT_S)
        rc, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        text = [v.decode(errors="replace") if isinstance(v, bytes) else (v or "") for v in (e.stdout, e.stderr)]
        rc, output = 124, f"timed out after {TIMEOUT_S} s\n" + "".join(text)
    seconds = time.monotonic() - start
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "output.txt"), "w") as f:
        f.write(f"$ {' '.join(cmd)}\n{output}")
    ranks = []
    for r in range(2):
        path = os.path.join(out, f"rank{r}.json")
        if rc == 0 and os.path.exists(path):
            with open(path) as f:
                ranks.append(json.load(f))
    return Leg(rc, seconds, output, ranks)


def ckpt_args(recipe: Recipe, out: str) -> tuple[str, ...]:
    return ("--ckpt", os.path.join(out, "ckpt")) if recipe.ckpt else ()


def max_abs_diff(a: list[str], b: list[str]) -> float:
    return max((abs(float.fromhex(x) - float.fromhex(y)) for x, y in zip(a, b)), default=0.0)


@dataclasses.dataclass
class Row:
    front_end: str
    versions: str
    calls: str
    ranks_equal: str
    gloo_equal: str
    verdict: str
    ok: bool
    notes: list[str] = dataclasses.field(default_factory=list)


def counters(leg: Leg) -> tuple[int, int, str]:
    """Rank 0's delaycomm calls, delayed calls and backend (0, 0 when delaycomm counted nothing)."""
    if not leg.ranks:
        return 0, 0, "?"
    d = leg.ranks[0].get("delaycomm") or {}
    return d.get("calls", 0), d.get("delayed_calls", 0), leg.ranks[0]["backend"]


def check_recipe(recipe: Recipe, root: str, version: str) -> list[Row]:
    """The recipe on delaycomm (with a delay) and on gloo, then the front end's wrong ways."""
    rows = []
    legs = {}
    for backend, env in (("delaycomm", DELAY), ("gloo", {})):
        out = os.path.join(root, recipe.script, *recipe.args[1:], backend)
        legs[backend] = run_leg(recipe, backend, "recipe", out, env, ckpt_args(recipe, out))
    dc, gl = legs["delaycomm"], legs["gloo"]
    calls, delayed, backend = counters(dc)
    notes = []
    for name, leg in legs.items():
        if leg.rc != 0 or len(leg.ranks) != 2:
            notes.append(f"{name} leg failed (rc {leg.rc}): {leg.error()}")
    ranks_equal = dc.params_equal_across_ranks() and gl.params_equal_across_ranks()
    gloo_equal = bool(dc.ranks and gl.ranks) and dc.ranks[0]["params"] == gl.ranks[0]["params"]
    engaged = backend == "delaycomm" and calls > 0 and delayed > 0
    if dc.ranks and gl.ranks and not gloo_equal:
        notes.append(f"max |delaycomm - gloo| = {max_abs_diff(dc.ranks[0]['params'], gl.ranks[0]['params']):.3g}")
    ok = not notes and ranks_equal and gloo_equal and engaged
    if recipe.ckpt:
        ok &= restart_checks(recipe, root, legs, notes)
    nparams = len(dc.ranks[0]["params"]) if dc.ranks else 0
    rows.append(
        Row(
            recipe.name,
            version,
            f"{calls} ({delayed} delayed)" if engaged else f"{calls} ({delayed} delayed), backend {backend}",
            "yes" if ranks_equal else "NO",
            f"yes, {nparams} bit-equal" if gloo_equal else "NO",
            "pass" if ok else "FAIL",
            ok,
            notes + [f"{n}: {leg.seconds:.0f} s" for n, leg in legs.items()],
        )
    )
    for way in recipe.wrong:
        rows.append(check_wrong_way(recipe, root, version, way, gl))
    for way in recipe.refused:
        leg = run_leg(recipe, "delaycomm", way, os.path.join(root, recipe.script, way), DELAY)
        refused = leg.rc != 0
        rows.append(
            Row(
                f"  {recipe.name}, --way {way}",
                version,
                "-",
                "-",
                "-",
                "refused, as documented" if refused else "NOT REFUSED: docs/ecosystem.md is out of date",
                refused,
                [leg.error() if refused else "ran to the end"],
            )
        )
    return rows


def check_wrong_way(recipe: Recipe, root: str, version: str, way: str, gloo: Leg) -> Row:
    """A way that ends normally but wrongly: the checks must fail on it (ranks apart, or delaycomm unused)."""
    leg = run_leg(recipe, "delaycomm", way, os.path.join(root, recipe.script, way), DELAY)
    calls, delayed, backend = counters(leg)
    ranks_equal = leg.params_equal_across_ranks()
    gloo_equal = bool(leg.ranks and gloo.ranks) and leg.ranks[0]["params"] == gloo.ranks[0]["params"]
    engaged = backend == "delaycomm" and calls > 0 and delayed > 0
    caught = leg.rc == 0 and not (ranks_equal and gloo_equal and engaged)
    notes = [f"ran to the end (rc {leg.rc}) in {leg.seconds:.0f} s"]
    if leg.ranks and not ranks_equal:
        diff = max_abs_diff(leg.ranks[0]["params"], leg.ranks[1]["params"])
        notes.append(f"the ranks trained apart: max |rank0 - rank1| = {diff:.3g}")
    if leg.ranks and "wrapped" in leg.ranks[0]:
        notes.append(f"model wrapped in DDP: {leg.ranks[0]['wrapped']}")
    if not engaged:
        notes.append(f"delaycomm carried no collective: {calls} calls counted (the default group's backend: {backend})")
    return Row(
        f"  {recipe.name}, --way {way}",
        version,
        f"{calls} ({delayed} delayed)" + ("" if engaged else f", backend {backend}"),
        "yes" if ranks_equal else "NO",
        "yes" if gloo_equal else "NO",
        "caught (the checks fail on it)" if caught else "NOT CAUGHT",
        caught,
        notes,
    )


def restart_checks(recipe: Recipe, root: str, legs: dict[str, Leg], notes: list[str]) -> bool:
    """Both legs restarted once and resumed from the checkpoint; their result is an uninterrupted run's; and
    without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 the restart fails on both backends."""
    ok = True
    for name, leg in legs.items():
        got = [(r["restarts"], r["resumed_from"]) for r in leg.ranks]
        notes.append(f"{name}: (restarts, resumed from step) per rank {got}")
        ok &= bool(got) and all(n == 1 and s > 0 for n, s in got)
    out = os.path.join(root, recipe.script, "uninterrupted")
    whole = run_leg(recipe, "gloo", "recipe", out, {}, (*ckpt_args(recipe, out), "--fail-at", "0"))
    same = (
        bool(whole.ranks and legs["delaycomm"].ranks)
        and whole.ranks[0]["params"] == legs["delaycomm"].ranks[0]["params"]
    )
    notes.append(f"equal to an uninterrupted gloo run: {'yes' if same else 'NO'}")
    ok &= same
    for backend, env in (("delaycomm", DELAY), ("gloo", {})):
        failed = []
        for i in range(SHARED_STORE_TRIES):
            out = os.path.join(root, recipe.script, f"shared-store-{backend}-{i}")
            env = {**env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}
            leg = run_leg(recipe, backend, "recipe", out, env, ckpt_args(recipe, out))
            if leg.rc != 0:
                failed.append(leg.error())
        notes.append(
            f"without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, {backend}: the restart failed in {len(failed)} of "
            f"{SHARED_STORE_TRIES} runs" + "".join(f"; {e}" for e in sorted(set(failed)))
        )
    return ok


def version_of(package: str) -> str:
    try:
        return f"{package} {importlib.metadata.version(package)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{package} missing"


def print_table(rows: list[Row]) -> None:
    head = ("front end", "version", "delaycomm calls (rank 0)", "ranks equal", "= gloo", "verdict")
    cells = [head] + [(r.front_end, r.versions, r.calls, r.ranks_equal, r.gloo_equal, r.verdict) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    for i, c in enumerate(cells):
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    for r in rows:
        for n in r.notes:
            print(f"# {r.front_end.strip()}: {n}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="recipes whose name starts with NAME")
    parser.add_argument("--keep", metavar="DIR", help="keep the result files in DIR (default: a temporary folder)")
    args = parser.parse_args()
    import torch

    import delaycomm

    recipes = [r for r in RECIPES if not args.only or any(r.name.startswith(o) for o in args.only)]
    print("# delaycomm ecosystem recipes: 2 ranks on CPU under torchrun, each on delaycomm and on gloo")
    python = sys.version.split()[0]
    print(f"# torch {torch.__version__}, delaycomm {delaycomm.__version__}, python {python}, {os.cpu_count()} cores")
    print("# delaycomm legs: " + " ".join(f"{k}={v}" for k, v in DELAY.items()) + " (staleness: the default, bsp)")
    root = args.keep or tempfile.mkdtemp(prefix="delaycomm-ecosystem-")
    rows = []
    try:
        for recipe in recipes:
            rows += check_recipe(recipe, root, version_of(recipe.package))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print_table(rows)
    failed = [r.front_end.strip() for r in rows if not r.ok]
    print(
        f"# {len(rows) - len(failed)} of {len(rows)} checks pass" + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
