"""``python -m delaycomm.experiment claims``: seed 000's training claims, each a controlled multi-seed comparison
through the real backend on real data that ships with scikit-learn (digits; diabetes, a regression), with a verdict
that comes from the paired 95% intervals only (docs/claims.md).

Every config of a task trains the same model from the same weights on the same batches for a seed; the configs
differ in what the claim is about. Everything that turns a delay into staleness is fixed, so that a run is a pure
function of its seed: ``step_ms`` 2 (a delay d makes a contribution ceil(d / 2 ms) steps late), ``staleness=ssp:4``,
``delay=exp:mean=4ms`` on a fraction 0.3 of the contributions (stale:fresh about 0.43), ``seed`` = the run's seed.

Verdict rules (one per kind of claim; docs/claims.md says which claim uses which):

- **sign** (a claim that A is worse / more / less than B): ``supported`` when the interval of the paired
  difference lies on the claimed side of 0, ``contradicted`` when it lies on the other side, else ``not shown``;
- **size** (a claimed change "about X%" or "a gap of X to Y"): ``contradicted`` when the interval excludes the
  claimed range (the data rule that size out, whatever the sign), ``supported`` when it overlaps the range and
  excludes 0, else ``not shown``;
- **threshold** (stale:fresh above 0.4 converges worse): ``supported`` when every config above 0.4 ends worse than
  BSP and none below does; ``contradicted`` when a config below 0.4 already ends worse, or one above ends better;
  else ``not shown``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from delaycomm._tools import args as argtypes
from delaycomm._tools.output import write_json
from delaycomm.experiment import stats as st
from delaycomm.experiment.configs import CONFIGS, ExperimentConfig
from delaycomm.experiment.runner import Hyper

__all__ = ["main_claims", "claim_configs", "settings", "evaluate", "CLAIMS", "NOT_MEASURABLE"]

DELAY = "exp:mean=4ms"
STEP_MS = 2.0
STALENESS = "ssp:4"
PROG = "python -m delaycomm.experiment claims"


def _stale(name: str, description: str, delay: str | None = None, warmup: int | None = None, **options: Any):
    opts = {"staleness": STALENESS, "stale_policy": "ema", **options}
    return ExperimentConfig(name, "delaycomm", opts, True, description, delay=delay, warmup_steps=warmup)


def claim_configs(task: str, capped_delay: str, warmup: int) -> list[ExperimentConfig]:
    """The configs of a task's claims (``capped_delay``: the trace of the capped tail, written by the caller)."""
    configs = [
        CONFIGS[0],  # gloo: BSP, the reference
        _stale("ema0.1", "ssp:4, late gradients blended by EMA alpha 0.1 (the default)"),
        _stale("ema0.3", "the same with alpha 0.3", ema_alpha=0.3),
        _stale("apply", "the same, late gradients applied as they are (no blend)", stale_policy="apply"),
        _stale("frac0.15", "ema0.1 with 15% of the contributions late (stale:fresh about 0.18)", delay_fraction=0.15),
        _stale("frac0.5", "ema0.1 with 50% of the contributions late (stale:fresh about 1)", delay_fraction=0.5),
        _stale("const", "ema0.1 with a fixed delay of the same mean, const:4ms", delay="const:4ms"),
        _stale("capped", "ema0.1 with exp:mean=4ms capped at its mean (a trace)", delay=capped_delay),
    ]
    if task == "digits":
        configs.append(_stale("warmup", f"ema0.1 with EpochWarmup of {warmup} steps every epoch", warmup=warmup))
    return configs


@dataclasses.dataclass(frozen=True)
class TaskSetting:
    hyper: Hyper
    warmup: int
    score: str  # the task's held-out score metric


def settings(quick: bool, timeout_s: float) -> dict[str, TaskSetting]:
    """Per task, the hyper-parameters of its claims (``quick``: a smoke run, no verdict meant)."""
    common = dict(model="mlp", lr=0.05, momentum=0.9, seed=0, nproc=2, delay=DELAY, budget_s=None)
    common.update(timeout_s=timeout_s, step_ms=STEP_MS, measure=True, measure_every=4)
    # digits: 1437 // 2 // 16 = 44 steps per epoch, 23 epochs = 1012 steps; diabetes: 353 // 2 // 16 = 11, 91 = 1001
    return {
        "digits": TaskSetting(
            Hyper(
                epochs=1 if quick else 23,
                batch_size=16,
                task="digits",
                oscillation_steps=40 if quick else 1000,
                **common,
            ),
            5,  # 11% of an epoch: the seed's 500 steps out of an epoch of at least 4500
            "test_accuracy",
        ),
        "diabetes": TaskSetting(
            Hyper(
                epochs=4 if quick else 91,
                batch_size=16,
                task="diabetes",
                oscillation_steps=40 if quick else 1000,
                **common,
            ),
            0,
            "test_loss",
        ),
    }


# ---------------------------------------------------------------------------------------------------------------
# The claims


def _values(records: Sequence[dict], config: str, metric: str) -> dict[int, float]:
    out = {}
    for r in records:
        v = r["metrics"].get(metric) if r["config"] == config and r["status"] == "ok" else None
        if v is not None:
            out[r["seed"]] = v
    return out


def _relative(records: Sequence[dict], a: str, b: str, metric: str) -> dict[str, Any]:
    """The paired relative change of ``metric``, a / b - 1 per seed, with its t interval."""
    va, vb = _values(records, a, metric), _values(records, b, metric)
    seeds = sorted(s for s in set(va) & set(vb) if vb[s] != 0)
    out = st.interval([va[s] / vb[s] - 1.0 for s in seeds])
    out["seeds"] = seeds
    return out


def _difference(records: Sequence[dict], a: str, b: str, metric: str) -> dict[str, Any]:
    return st.paired(_values(records, a, metric), _values(records, b, metric), st.direction(metric))


def sign_verdict(iv: dict, expected: float) -> str:
    """``expected`` > 0: the claim says the difference is positive; < 0: negative (module docstring)."""
    if iv.get("lo") is None:
        return "not shown"
    if iv["lo"] > 0 or iv["hi"] < 0:
        return "supported" if (iv["lo"] > 0) == (expected > 0) else "contradicted"
    return "not shown"


def size_verdict(iv: dict, ranges: Sequence[tuple[float, float]]) -> str:
    if iv.get("lo") is None:
        return "not shown"
    if not any(iv["lo"] <= hi and lo <= iv["hi"] for lo, hi in ranges):
        return "contradicted"
    return "supported" if (iv["lo"] > 0 or iv["hi"] < 0) else "not shown"


def _fmt(iv: dict, percent: bool = False) -> str:
    if iv.get("mean") is None:
        return "no data"
    k, unit = (100.0, "%") if percent else (1.0, "")
    if iv.get("half") is None:
        return f"{iv['mean'] * k:+.3g}{unit} (n = {iv['n']})"
    return f"{iv['mean'] * k:+.3g}{unit} ± {iv['half'] * k:.2g}{unit} (n = {iv['n']})"


@dataclasses.dataclass(frozen=True)
class Claim:
    key: str
    claim: str
    where: str  # seed 000's words
    tasks: tuple[str, ...]
    setting: str
    judge: Callable[[Sequence[dict], TaskSetting], tuple[str, str, dict]]  # (measured, verdict, numbers)


def _ema_variance(records, ts):
    iv = _relative(records, "ema0.1", "apply", "update_noise_ratio")
    base = st.interval(list(_values(records, "ema0.1", "update_noise_ratio").values()))
    bias = _difference(records, "ema0.1", "gloo", "final_train_loss")
    text = (
        f"update noise of ema0.1 vs apply: {_fmt(iv, True)}; ema0.1's noise relative to BSP's: {_fmt(base)}; "
        f"its final training loss minus BSP's: {_fmt(bias)}"
    )
    return text, size_verdict(iv, [(-0.5, -0.3)]), {"relative_noise_vs_apply": iv, "noise_vs_bsp": base, "bias": bias}


def _ema_oscillation(records, ts):
    iv = _difference(records, "ema0.3", "ema0.1", "oscillation")
    k = ts.hyper.oscillation_steps
    return f"oscillation (first {k} steps) of ema0.3 minus ema0.1: {_fmt(iv)}", sign_verdict(iv, +1), {"diff": iv}


def _warmup(records, ts):
    iv = _difference(records, "warmup", "ema0.1", "oscillation_2epochs")
    loss = _difference(records, "warmup", "ema0.1", "full_loss_2epochs")
    text = (
        f"oscillation over the first 2 epochs with warmup minus without: {_fmt(iv)}; training loss after 2 epochs, "
        f"with minus without: {_fmt(loss)}"
    )
    return text, sign_verdict(iv, -1), {"oscillation_diff": iv, "loss_diff": loss}


def _threshold(records, ts):
    rows, above, below = [], [], []
    for c in ("frac0.15", "ema0.1", "frac0.5"):
        ratios = [
            r["delaycomm"]["staleness"]["stale_fresh_ratio"]
            for r in records
            if r["config"] == c and r["status"] == "ok" and r.get("delaycomm")
        ]
        ratio = st.interval(ratios)
        diff = _difference(records, c, "gloo", "final_train_loss")
        (above if (ratio["mean"] or 0) > 0.4 else below).append(diff["verdict"])
        rows.append({"config": c, "stale_fresh_ratio": ratio, "final_loss_vs_bsp": diff})
    if any(v == "worse" for v in below) or any(v == "better" for v in above):
        verdict = "contradicted"
    elif above and all(v == "worse" for v in above) and not any(v == "worse" for v in below):
        verdict = "supported"
    else:
        verdict = "not shown"
    text = "; ".join(
        f"{r['config']} (stale:fresh {r['stale_fresh_ratio']['mean']:.2f}): final training loss minus BSP's "
        f"{_fmt(r['final_loss_vs_bsp'])}, {r['final_loss_vs_bsp']['verdict']}"
        for r in rows
        if r["stale_fresh_ratio"]["mean"] is not None
    )
    return text, verdict, {"rows": rows}


def _family(config: str):
    def judge(records, ts):
        iv = _difference(records, config, "ema0.1", ts.score)
        worse = -1 if st.direction(ts.score) == st.HIGHER else +1
        return (
            f"{ts.score} of {config} minus the uncapped exp (ema0.1): {_fmt(iv)}",
            sign_verdict(iv, worse),
            {"diff": iv},
        )

    return judge


def _tail_gap(records, ts):
    iv = _difference(records, "ema0.1", "gloo", "test_accuracy")
    verdict = size_verdict(iv, [(-0.05, -0.02), (0.02, 0.05)])
    return f"test accuracy trained with delay (ema0.1) minus without (BSP): {_fmt(iv, True)}", verdict, {"diff": iv}


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "ema-variance",
        "EMA with alpha 0.1 cuts the effective variance by about 40% without too much bias",
        'Procedure, 2nd paragraph: "alpha of 0.1, which usually cuts the effective variance by about 40% without '
        'introducing too much bias"',
        ("digits", "diabetes"),
        "ema0.1 vs apply (late gradients unblended), update_noise_ratio; size rule, -50%..-30%",
        _ema_variance,
    ),
    Claim(
        "ema-oscillation",
        "alpha 0.3 oscillates during the first 1000 steps",
        'Procedure, 2nd paragraph: "a higher alpha like 0.3 caused oscillation during the first 1000 steps"',
        ("digits", "diabetes"),
        "ema0.3 vs ema0.1, oscillation over the first 1000 steps; sign rule",
        _ema_oscillation,
    ),
    Claim(
        "warmup",
        "a 500-step warmup at each epoch stabilizes the loss within 2 epochs",
        'The Edge Case: "a small learning rate warmup of 500 steps at the beginning of each epoch ... stabilizes '
        'the loss curve within 2 epochs"',
        ("digits",),
        "EpochWarmup (11% of an epoch) vs none, both ema0.1; oscillation over 2 epochs; sign rule",
        _warmup,
    ),
    Claim(
        "ratio-0.4",
        "a stale:fresh ratio above 0.4 converges to a suboptimal point",
        'Common Pitfalls: "ensure it stays below 0.4 ... If it goes higher ... the model will converge to a '
        'suboptimal point"',
        ("digits", "diabetes"),
        "delay_fraction 0.15 / 0.3 / 0.5 (ema0.1), final training loss vs BSP; threshold rule",
        _threshold,
    ),
    Claim(
        "fixed-delay",
        "a fixed delay instead of a stochastic one trains a worse model",
        'Common Pitfalls: "they use a fixed delay instead of a stochastic one, which causes the model to learn a '
        'shortcut"',
        ("digits", "diabetes"),
        "const:4ms vs exp:mean=4ms (ema0.1), held-out score; sign rule",
        _family("const"),
    ),
    Claim(
        "capped-tail",
        "capping the delay at the mean trains a worse model",
        'Procedure, 2nd paragraph: "Do not cap the delay at the mean ... capping it at any point leaves a '
        'systematic gap"',
        ("digits", "diabetes"),
        "exp:mean=4ms capped at 4 ms vs uncapped (ema0.1), held-out score; sign rule",
        _family("capped"),
    ),
    Claim(
        "tail-gap",
        "a model trained with delay differs by 2-5% accuracy from one trained without",
        'Metrics to Track: "usually reveals a 2-5% accuracy gap on the tail scenarios"',
        ("digits",),
        "ema0.1 vs BSP, test accuracy; size rule, 2..5 points either way",
        _tail_gap,
    ),
)

NOT_MEASURABLE = (
    (
        "tree all-reduce cuts the synchronization latency by about 60%",
        'The Edge Case: "switch to a tree-based all-reduce ... cuts the synchronization latency by about 60%"',
    ),
    (
        "a 2 MB NCCL buffer cuts the memory peak by about 30%",
        'Metrics to Track: "set the NCCL buffer size to 2MB explicitly, which usually cuts the memory peak by about '
        '30%"',
    ),
)
NOT_MEASURABLE_WHY = (
    "needs NCCL on several GPUs: this machine has no GPU. bench/gpu_check.sh measures tree vs ring vs auto and the "
    "buffer size on a GPU machine; the collective cost model (docs/costmodel.md) predicts both from measured latencies"
)


def evaluate(records_by_task: dict[str, list[dict]], task_settings: dict[str, TaskSetting]) -> list[dict]:
    """One row per claim and task: claim, where, task, setting, measured, verdict, numbers."""
    rows = []
    for claim in CLAIMS:
        for task in claim.tasks:
            if task not in records_by_task:
                continue
            measured, verdict, numbers = claim.judge(records_by_task[task], task_settings[task])
            rows.append(
                {
                    "key": claim.key,
                    "claim": claim.claim,
                    "where": claim.where,
                    "task": task,
                    "setting": claim.setting,
                    "measured": measured,
                    "verdict": verdict,
                    "numbers": numbers,
                }
            )
    for text, where in NOT_MEASURABLE:
        rows.append(
            {
                "key": text.split()[0],
                "claim": text,
                "where": where,
                "task": "-",
                "setting": "-",
                "measured": NOT_MEASURABLE_WHY,
                "verdict": "not measurable here",
                "numbers": {},
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------------------------
# The command


def build_claims_parser() -> argparse.ArgumentParser:
    class _Parser(argparse.ArgumentParser):
        def error(self, message: str):
            raise ValueError(message)

    p = _Parser(
        prog=PROG,
        description="Seed 000's training claims, each a controlled multi-seed comparison "
        "(docs/claims.md). About 15 minutes on a 2-core machine; --quick is CI's smoke run (no verdict meant).",
    )
    p.add_argument("--seeds", type=argtypes.integer(2, 100), default=5, help="seeds 0..N-1 (default 5; --quick 2)")
    p.add_argument(
        "--tasks", type=argtypes.choices_list(("digits", "diabetes"), "task"), default=("digits", "diabetes")
    )
    p.add_argument("--quick", action="store_true", help="1 epoch of digits, 4 of diabetes, 2 seeds: a smoke run")
    p.add_argument(
        "--configs",
        metavar="NAMES",
        help="run only these configs (gloo always; a claim whose configs did not run says 'no data')",
    )
    p.add_argument("--out", default="delaycomm-claims", metavar="DIR", help="results folder, resumable")
    p.add_argument("--timeout", type=argtypes.number(0.0, lo_open=True), default=600.0, metavar="SECONDS")
    p.add_argument("--json", type=argtypes.output_path(), metavar="FILE", help="the claims and per-config statistics")
    p.add_argument("--plot", type=argtypes.output_path((".png", ".pdf", ".svg")), metavar="FILE")
    p.add_argument(
        "--markdown", type=argtypes.output_path((".md",)), metavar="FILE", help="the claims table as Markdown"
    )
    p.add_argument("--fresh", action="store_true", help="run everything again, ignoring the results in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _run_task(task: str, ts: TaskSetting, ns: argparse.Namespace, out: Path) -> tuple[list, list, float]:
    from delaycomm.experiment.builtin import BuiltinJob
    from delaycomm.experiment.families import capped_trace
    from delaycomm.experiment.study import run_study

    os.makedirs(out / "delays", exist_ok=True)
    configs = claim_configs(task, capped_trace(DELAY, "mean", str(out / "delays")), ts.warmup)
    if ns.configs:
        wanted = {n.strip() for n in ns.configs.split(",")} | {"gloo"}
        known = {c.name for c in claim_configs("digits", "", 1)}
        if wanted - known:
            raise ValueError(
                f"argument --configs: unknown {', '.join(sorted(wanted - known))}; accepted: {', '.join(sorted(known))}"
            )
        configs = [c for c in configs if c.name in wanted]
    job = BuiltinJob(ts.hyper)
    seeds = list(range(2 if ns.quick else ns.seeds))
    records, _ = run_study(job, configs, seeds, out / task, fresh=ns.fresh, progress=False if ns.no_progress else None)
    cpu = sum((r["detail"].get("metrics") or {}).get("cpu_s", 0.0) for r in records)
    return configs, records, cpu


def main_claims(argv: list[str]) -> int:
    """Exit 0 when every run was ok, 1 when one failed, 2 for bad arguments or a missing extra."""
    from delaycomm._tools.machine import machine_info, versions
    from delaycomm.experiment.analysis import analyze
    from delaycomm.experiment.claims_report import (
        SEED_DOC,
        format_claims,
        format_context,
        markdown_claims,
        plot_claims,
        slim,
    )
    from delaycomm.experiment.configs import command_line
    from delaycomm.experiment.study import StudyError
    from delaycomm.experiment.tasks import MissingExtra, require_matplotlib, require_sklearn

    started, load0 = time.monotonic(), os.getloadavg()
    try:
        ns = build_claims_parser().parse_args(argv)
        require_sklearn()
        if ns.plot:
            require_matplotlib()
        task_settings = settings(ns.quick, ns.timeout)
        results = {t: _run_task(t, task_settings[t], ns, Path(ns.out)) for t in ns.tasks}
    except (ValueError, StudyError, MissingExtra) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    records = {t: r[1] for t, r in results.items()}
    analyses = {t: analyze(r[1], [c.name for c in r[0]], "gloo") for t, r in results.items()}
    rows = evaluate(records, task_settings)
    duration = time.monotonic() - started
    cpu = time.process_time() + sum(r[2] for r in results.values())
    doc = {
        "tool": "delaycomm.experiment claims",
        "seed_document": SEED_DOC,
        "argv": command_line(),
        "machine": {**machine_info(), "loadavg_start": list(load0)},
        "versions": versions(("torch", "numpy", "scikit-learn")),
        "quick": ns.quick,
        "settings": {
            t: {**dataclasses.asdict(s.hyper), "warmup": s.warmup, "score": s.score}
            for t, s in task_settings.items()
            if t in ns.tasks
        },
        "configs": {t: [{"name": c.name, "description": c.description} for c in r[0]] for t, r in results.items()},
        "claims": rows,
        "analysis": {t: slim(a) for t, a in analyses.items()},
        "duration_s": duration,
        "cpu_s": cpu,
    }
    print(format_claims(rows))
    for t, a in analyses.items():
        print(format_context(t, a))
    failed = [r for rs in records.values() for r in rs if r["status"] != "ok"]
    for r in failed:
        print(f"# {r['config']} seed {r['seed']}: {r['status']}: {r['message']}")
    print(
        f"# duration {duration:.1f} s, CPU {cpu:.1f} s (this process and every rank), load {load0} at the start, "
        f"{list(os.getloadavg())} at the end"
    )
    if ns.json:
        write_json(ns.json, doc)
        print(f"# wrote {ns.json}")
    if ns.plot:
        plot_claims(analyses, rows, ns.plot)
        print(f"# wrote {ns.plot}")
    if ns.markdown:
        with open(ns.markdown, "w", encoding="utf-8") as f:
            f.write(markdown_claims(rows) + "\n")
        print(f"# wrote {ns.markdown}")
    return 1 if failed else 0
