"""bench/gpu_check.sh's bookkeeping: the environment record, then one JSON and a short summary of the whole check.

    python bench/gpu_check_report.py environment OUT.json     # GPU, driver, torch, CUDA, NCCL, Python, host
    python bench/gpu_check_report.py report OUT MODE DRY      # OUT/gpu_check.json + OUT/summary.txt

The report reads what the steps left in OUT: steps.tsv (name, exit, seconds, limit), environment.json, the pytest
JUnit files, evidence/*.json (what each GPU test measured), percall.json, kernels.json, precision.json, gate*.json
and baseline.json, and the logs of failed steps. It never fails the check itself; gpu_check.sh's exit status does.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import platform
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": None,
        "gpu_count": 0,
        "driver": None,
        "nccl": None,
        "commit": None,
    }
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        env["cpu"] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = torch.cuda.device_count()
        env["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        v = torch.cuda.nccl.version()
        env["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    try:
        env["driver"] = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        env["commit"] = (
            subprocess.run(
                ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        pass
    return env


def _load(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _junit(path: str) -> dict[str, Any] | None:
    """Counts and the failing tests of a pytest JUnit file."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed, skipped = [], {}
    for case in root.iter("testcase"):
        counts["tests"] += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for tag in ("failure", "error"):
            el = case.find(tag)
            if el is not None:
                counts["failures" if tag == "failure" else "errors"] += 1
                failed.append({"test": name, "message": (el.get("message") or "")[:500]})
        el = case.find("skipped")
        if el is not None:
            counts["skipped"] += 1
            why = (el.get("message") or "")[:120]
            skipped[why] = skipped.get(why, 0) + 1
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {**counts, "failed": failed, "skipped_why": skipped}


def _steps(out: str) -> dict[str, dict[str, Any]]:
    steps = {}
    try:
        with open(os.path.join(out, "steps.tsv")) as f:
            for line in f:
                name, rc, secs, limit = line.rstrip("\n").split("\t")
                steps[name] = {
                    "exit": int(rc) if rc.lstrip("-").isdigit() else rc,
                    "seconds": int(secs),
                    "limit_s": int(limit),
                }
    except OSError:
        pass
    return steps


def _percall_rows(rec: dict | None) -> list[dict]:
    if not rec:
        return []
    from delaycomm.bench.percall_results import rows

    return rows(rec)


def report(out: str, mode: str, dry: str) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "format": "delaycomm-gpu-check/1",
        "mode": mode,
        "dry_run": dry == "1",
        "environment": _load(os.path.join(out, "environment.json")),
        "steps": _steps(out),
    }
    rec["ok"] = all(s["exit"] == 0 or str(s["exit"]).startswith("skipped") for s in rec["steps"].values())
    rec["tests"] = {name: _junit(os.path.join(out, f"{name}.xml")) for name in ("gpu_tests", "kernel_bad_input")}
    rec["evidence"] = {
        os.path.basename(p)[:-5]: _load(p) for p in sorted(glob.glob(os.path.join(out, "evidence", "*.json")))
    }
    for name in ("percall", "kernels", "precision", "baseline", "gate", "gate_injected"):
        data = _load(os.path.join(out, f"{name}.json"))
        if data is not None:
            rec[name] = data
    rec["failed_step_logs"] = {}
    for name, s in rec["steps"].items():
        if s["exit"] != 0 and not str(s["exit"]).startswith("skipped"):
            try:
                with open(os.path.join(out, "logs", f"{name}.log")) as f:
                    rec["failed_step_logs"][name] = f.read()[-4000:]
            except OSError:
                pass
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(rec, f, indent=1, default=str)
    text = summary(rec)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    return rec


def summary(rec: dict[str, Any]) -> str:
    env = rec.get("environment") or {}
    lines = [
        f"# delaycomm GPU check ({rec['mode']}{', DRY RUN on CPU' if rec['dry_run'] else ''}): "
        f"{'OK' if rec['ok'] else 'FAILED'}",
        f"# {env.get('gpu') or 'no GPU'}, driver {env.get('driver')}, torch {env.get('torch')}, CUDA "
        f"{env.get('cuda')}, NCCL {env.get('nccl')}, Python {env.get('python')}; {env.get('host')} "
        f"({env.get('cpu_count')} cores); commit {env.get('commit')}; {env.get('date_utc')}",
        f"# {'step':<18}{'exit':>8}{'time':>8}{'limit':>8}",
    ]
    for name, s in rec["steps"].items():
        code, note = str(s["exit"]), ""
        if not code.lstrip("-").isdigit():
            code, note = code.split(":", 1)[0], "  " + code.split(":", 1)[-1].strip()
        lines.append(f"  {name:<18}{code:>8}{s['seconds']:>7}s{s['limit_s']:>7}s{note}")
    total = sum(s["seconds"] for s in rec["steps"].values())
    lines.append(f"  {'total':<18}{'':>8}{total:>7}s")
    for name, t in rec["tests"].items():
        if t:
            failed = "".join(
                f"\n#   FAILED {x['test']}: {x['message'].splitlines()[0][:160] if x['message'] else ''}"
                for x in t["failed"]
            )
            lines.append(
                f"# {name}: {t['passed']} passed, {t['failures'] + t['errors']} failed, {t['skipped']} skipped" + failed
            )
    ev = rec["evidence"]
    for key in ("nccl_default_settings", "nccl_user_settings"):
        if ev.get(key):
            n = ev[key]["nccl"]
            lines.append(
                f"# {key}: NCCL {n.get('version')} says set by environment: "
                + (", ".join(f"{k}={'/'.join(v)}" for k, v in n["set_by_environment"].items()) or "nothing")
                + f"; environment at NCCL start: {ev[key]['script'].get('env_after')}"
            )
    for key, data in ev.items():
        if key.startswith("ddp_") and data:
            ar = data["bsp"]["stats"]["ops"]["allreduce"]
            st = data["ssp2_ema"]["stats"]["staleness"]
            lines.append(
                f"# {key}: bsp+delay: {ar['calls']} all_reduce calls, {ar['delayed_calls']} delayed, latency "
                f"p50 {ar['latency']['p50_us']:.0f} us, max {ar['latency']['max_us']:.0f} us; ssp:2+ema: "
                f"fresh {st['fresh']} stale {st['stale']} dropped {st['dropped']}; wall s raw "
                f"{data['raw']['elapsed_s']:.2f} bsp {data['bsp']['run']['elapsed_s']:.2f} ssp "
                f"{data['ssp2_ema']['run']['elapsed_s']:.2f}"
            )
        if key.startswith("collectives_ws1_") and data:
            ok = sum(1 for v in data["cases"].values() if v)
            lines.append(
                f"# {key}: {ok} of {len(data['cases'])} cases exact, uncounted calls: {data['uncounted'] or 'none'}"
            )
    rows = _percall_rows(rec.get("percall"))
    shown = {min(r["size_bytes"] for r in rows), max(r["size_bytes"] for r in rows)} if rows else set()
    for r in rows:
        if r["size_bytes"] in shown:
            lines.append(
                f"# percall {r['size_bytes']} B {r['path']}: {r['added_cpu_us']:+.2f} us CPU/call "
                f"(ratio {r['ratio_cpu']:.3f}), {r['added_wall_us']:+.2f} us wall (raw "
                f"{r['raw_cpu_us']:.2f} us CPU)"
            )
    for row in (rec.get("kernels") or {}).get("rows", []):
        lines.append(
            f"# kernels {row['size_bytes']} B {row['dtype']}: fused/copy {row['fused_over_copy']:.2f}, "
            f"unfused/fused {row['unfused_over_fused']:.2f}, unfused_acc/fused "
            f"{row['unfused_acc_over_fused']:.2f}"
        )
    p = (rec.get("precision") or {}).get("gpu_precision") or {}
    for key in ("1ms", "10ms", "100ms"):
        if key in p:
            lines.append(
                f"# GPU sleep kernel {key}: p99 |error| {p[key]['corrected']['p99_us']:.1f} us after the "
                f"{p['launch_overhead_us']:.1f} us launch ({p[key]['raw']['p99_us']:.1f} us raw)"
            )
    for name in ("gate", "gate_injected"):
        s = rec["steps"].get(name)
        if s:
            lines.append(f"# {name}: {'as expected' if s['exit'] == 0 else 'NOT as expected'} (log: logs/{name}.log)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["environment"] and len(argv) == 2:
        env = environment()
        with open(argv[1], "w") as f:
            json.dump(env, f, indent=1)
        print(json.dumps(env))
        return 0
    if argv[:1] == ["report"] and len(argv) == 4:
        report(*argv[1:])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
