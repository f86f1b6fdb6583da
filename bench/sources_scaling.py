"""How ``python -m delaycomm profile`` scales with its source's size: seconds and peak memory against
rows, for an nccl-tests text log and nccl-tests' ``-J`` JSON.

Each input is made here from one real-format run (tests/sources/logs.py: nccl-tests' own layout, all_reduce on 8
ranks, 50 sizes) appended run after run, as a sweep's log is, in two variants: ``same`` (every run prints the same
times: a log of one test repeated, the issue's case) and ``varied`` (every run's times differ: every row a distinct
draw, the worst case for the reader's pooling of repeated rows). Each point is one ``profile`` process: its wall
time, the profile command's own time (after the imports), its peak RSS and its peak RSS after the imports (VmHWM).
The machine is shared: the seconds are noisy.

  python bench/sources_scaling.py --out bench/results/DATE-vm2core-sources-scaling
  python bench/sources_scaling.py --rows 1000,10000 --out /tmp/scale   # a quick look
  PYTHONPATH=/tmp/old python bench/sources_scaling.py ...   # another delaycomm's reader (a copy of the package)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.sources.logs import run

SIZES = [8 << k for k in range(50)]  # 8 B ... 4 PiB: 50 rows per run


def _text_log(path: str, rows: int, varied: bool) -> None:
    base = run("all_reduce", 8, SIZES[:50])
    runs = max(1, rows // 50)
    with open(path, "w") as f:
        for k in range(runs):
            if varied:  # every time 0.001% x (k mod 2000) slower, algbw unchanged (within nccl-tests' rounding check)
                lines = []
                for line in base:
                    tokens = line.split()
                    if len(tokens) >= 13 and tokens[0].isdigit():
                        for i in (5, 9):
                            tokens[i] = f"{float(tokens[i]) * (1 + 1e-5 * (k % 2000)):.2f}"
                        line = "  ".join(tokens)
                    lines.append(line)
            else:
                lines = base
            f.write("\n".join(lines) + "\n")


def _json_log(path: str, rows: int, varied: bool) -> None:
    recs = []
    for i in range(rows):
        size = SIZES[i % 40]
        t = (20.0 + size / 100e3) * (1 + (1e-6 * i if varied else 0.0))
        bw = size / t / 1e3
        recs.append({"size": size, "count": size // 4, "type": "float", "redop": "sum", "root": -1,
                     "out_of_place": {"time": t, "alg_bw": bw, "bus_bw": bw * 1.75, "nwrong": 0},
                     "in_place": {"time": t, "alg_bw": bw, "bus_bw": bw * 1.75, "nwrong": 0}})  # fmt: skip
    devices = [{"rank": r, "pid": 100 + r, "hostname": "n0"} for r in range(8)]
    with open(path, "w") as f:
        json.dump({"version": 3, "args": ["all_reduce_perf"], "config": {"devices": devices}, "results": recs}, f)


def _measure(src: str, out: str) -> dict:
    t0 = time.perf_counter()
    # one process per point, which reports its own time and peak RSS
    # VmHWM: the peak RSS of this process's own address space (getrusage's ru_maxrss would carry the parent's
    # size over the exec: this script holds a -J document's records while it writes them)
    code = (
        "import sys, time\n"
        "def hwm():\n"
        "    return next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM'))\n"
        "from delaycomm.__main__ import main\n"
        "base = hwm(); t = time.perf_counter(); rc = main(sys.argv[1:])\n"
        "print(time.perf_counter() - t, base, hwm(), file=sys.stderr); sys.exit(rc)\n"
    )
    p = subprocess.run([sys.executable, "-c", code, "profile", src, "-o", out], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"profile of {src} failed:\n{p.stderr}")
    read_s, base_kib, peak_kib = p.stderr.strip().splitlines()[-1].split()
    return {
        "seconds": round(seconds, 2),  # the process: Python, torch and delaycomm imported, then the profile
        "profile_seconds": round(float(read_s), 2),  # the profile command alone (read, build, write)
        "peak_mib": round(int(peak_kib) / 1024, 1),  # the process's peak RSS
        "imports_mib": round(int(base_kib) / 1024, 1),  # its peak RSS after the imports, before reading
        "input_mib": os.path.getsize(src) / 2**20,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1000,10000,100000,1000000", help="text log rows (comma-separated)")
    ap.add_argument("--json-rows", default="1000,10000,100000,200000", help="-J records (comma-separated)")
    ap.add_argument("--variants", default="same,varied")
    ap.add_argument("--out", required=True, help="directory for result.json")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, rows_arg, make in (("text", a.rows, _text_log), ("json", a.json_rows, _json_log)):
            for variant in a.variants.split(","):
                for rows in [int(x) for x in rows_arg.split(",") if x]:
                    src = os.path.join(tmp, f"{kind}-{variant}-{rows}.{'txt' if kind == 'text' else 'json'}")
                    make(src, rows, variant == "varied")
                    m = _measure(src, os.path.join(tmp, "p.json"))
                    point = {"kind": kind, "variant": variant, "rows": rows, **m}
                    point["input_mib"] = round(point["input_mib"], 2)
                    points.append(point)
                    print(json.dumps(point), flush=True)
                    os.remove(src)
    result = {
        "command": "python bench/sources_scaling.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()} (shared with other work: noisy)",
        "python": sys.version.split()[0],
        "pythonpath": os.environ.get("PYTHONPATH"),  # where the delaycomm measured came from, when not the venv
        "points": points,
    }
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
