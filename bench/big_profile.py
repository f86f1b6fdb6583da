"""What a big latency profile costs: loading it, creating a group that replays it, showing it.

Generates a valid profile (docs/profile.md, schema version 1) of about --mib MiB: every op of the op table, every
size class, as many histogram buckets per class as the size needs, deterministic counts, indented as the
``profile`` command writes it. Then, each in a fresh
interpreter (so that one measurement's memory is not another's):

- ``load``: the replay's loader alone, ``delaycomm._C.DelaySampler("profile:FILE")``;
- ``group``: ``init_process_group("delaycomm")`` of 2 ranks with ``DELAYCOMM_DELAY=profile:FILE`` (file://
  rendezvous), per rank;
- ``show``: ``python -m delaycomm profile --show FILE``.

Each reports its wall time, its peak resident memory above what the process held before it (VmHWM after minus
VmRSS before), and the bytes it read (``rchar`` of /proc/self/io) divided by the file's size: how many times the
file was read. Runs with whichever delaycomm the interpreter imports, so the same script measures two builds.

  python bench/big_profile.py --mib 63 --json out.json
  python bench/big_profile.py --mib 63 --shape metadata --json out.json
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

_PROBE = r"""
import json, os, sys, time
def rchar():
    with open('/proc/self/io') as f:
        return int(next(l for l in f if l.startswith('rchar')).split()[1])
def kib(field):
    with open('/proc/self/status') as f:
        return int(next(l for l in f if l.startswith(field)).split()[1])
import torch, torch.distributed as dist, delaycomm
from delaycomm import _C
what, path = sys.argv[1], sys.argv[2]
rss, io, t = kib('VmRSS:'), rchar(), time.perf_counter()
if what == 'load':
    _C.DelaySampler('profile:' + path).quantile(0.5)
elif what == 'group':
    from datetime import timedelta
    dist.init_process_group('delaycomm', init_method='file://' + sys.argv[3], rank=int(sys.argv[4]),
                            world_size=2, timeout=timedelta(seconds=600))
else:
    from delaycomm.__main__ import main
    import contextlib, io as _io
    with contextlib.redirect_stdout(_io.StringIO()):
        assert main(['profile', '--show', path]) == 0
wall = time.perf_counter() - t
out = {'wall_s': wall, 'peak_mib': (kib('VmHWM:') - rss) / 1024, 'read_bytes': rchar() - io}
if what == 'group':
    dist.destroy_process_group()
print('RESULT ' + json.dumps(out))
"""


def make_profile(path: str, mib: float, shape: str = "buckets") -> int:
    """Writes a valid profile of about ``mib`` MiB to ``path``; returns its size in bytes.

    shape ``buckets``: the size is histogram buckets (every op and size class, as the profile command writes them);
    ``metadata``: one size class per op, and the rest a metadata array of small numbers (metadata is free-form, so
    a valid profile's size is not bounded by its classes: the most JSON values per byte a valid file can hold).
    """
    from delaycomm import _ops

    ops = [o.name for o in _ops.OPS]
    classes = [0] + [1 << k for k in range(63)]

    def entry(i: int, j: int, n: int) -> dict:
        pairs = [[b, 1 + (i * 7919 + j * 104729 + b * 31) % 999_999] for b in range(n)]
        return {"bytes": classes[j], "count": sum(c for _, c in pairs), "zeros": 0, "min_ns": 1.0,
                "max_ns": 1.02**n, "buckets": pairs}  # fmt: skip

    # Written as `python -m delaycomm profile` writes (delaycomm._tools.output.write_json: indent=1), so the bytes
    # per bucket are those of a real profile's.
    def size_of(n: int) -> int:
        return len(json.dumps({"ops": {"x": [entry(0, 1, n)]}}, indent=1))

    per_bucket = (size_of(200) - size_of(100)) / 100
    target = int(mib * (1 << 20))
    filler: list[int] = []
    if shape == "buckets":
        buckets = max(1, min(1700, int(target / (len(ops) * len(classes) * per_bucket))))
        doc_ops = {op: [entry(i, j, buckets) for j in range(len(classes))] for i, op in enumerate(ops)}
    else:
        doc_ops = {op: [entry(i, 1, 10)] for i, op in enumerate(ops)}
        filler = [i % 10 for i in range(target // 2)]  # "0,1,2,...": two bytes per value
    doc = {
        "format": "delaycomm-profile",
        "version": 1,
        "histogram": {"base": 1.02, "unit": "ns"},
        "metadata": {"world_size": 2, "generated_by": "bench/big_profile.py", "filler": filler},
        "ops": doc_ops,
    }
    with open(path, "w") as f:
        if shape == "buckets":
            json.dump(doc, f, indent=1)
        else:
            json.dump(doc, f, separators=(",", ":"))
    return os.path.getsize(path)


def _probe(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _PROBE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _result(proc: subprocess.Popen, timeout: float) -> dict:
    out, err = proc.communicate(timeout=timeout)
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"probe failed (exit {proc.returncode}):\n{err[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def measure(path: str, size: int, timeout: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DELAYCOMM_DELAY", None)
    out = {}
    out["load"] = _result(_probe(["load", path], env), timeout)
    with tempfile.TemporaryDirectory() as d:
        genv = {**env, "DELAYCOMM_DELAY": f"profile:{path}"}
        procs = [_probe(["group", path, os.path.join(d, "rdzv"), str(r)], genv) for r in range(2)]
        out["group"] = [_result(p, timeout) for p in procs]
    out["show"] = _result(_probe(["show", path], env), timeout)
    for rows in out.values():
        for r in rows if isinstance(rows, list) else [rows]:
            r["reads"] = r["read_bytes"] / size
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, default=63.0, help="size of the generated profile (MiB, below 64)")
    p.add_argument("--shape", choices=("buckets", "metadata"), default="buckets", help="what fills the profile")
    p.add_argument("--profile", help="measure this profile instead of generating one")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    p.add_argument("--json", help="write the record here")
    args = p.parse_args(argv)
    import delaycomm

    with tempfile.TemporaryDirectory() as d:
        path = args.profile or os.path.join(d, "big.json")
        t = time.perf_counter()
        size = os.path.getsize(path) if args.profile else make_profile(path, args.mib, args.shape)
        made_s = time.perf_counter() - t
        with open("/proc/loadavg") as f:
            load_before = f.read().split()[:3]
        result = measure(path, size, args.timeout)
        with open("/proc/loadavg") as f:
            load_after = f.read().split()[:3]
    record = {
        "argv": sys.argv,
        "delaycomm": delaycomm.__version__,
        "delaycomm_path": os.path.dirname(delaycomm.__file__),
        "python": platform.python_version(),
        "machine": {"host": platform.node(), "cpu_count": os.cpu_count(), "platform": platform.platform()},
        "load_before": load_before,
        "load_after": load_after,
        "profile_bytes": size,
        "shape": None if args.profile else args.shape,
        "generate_s": made_s,
        "result": result,
    }
    loads = f"{' '.join(load_before)} -> {' '.join(load_after)}"
    print(f"# profile of {size / (1 << 20):.1f} MiB ({record['shape']}); load average {loads}")
    print(f"# {'what':<14} {'wall (s)':>10} {'peak (MiB)':>11} {'reads':>7}")
    rows = [("load", result["load"]), *((f"group rank {i}", r) for i, r in enumerate(result["group"]))]
    for name, r in [*rows, ("show", result["show"])]:
        print(f"  {name:<14} {r['wall_s']:>10.2f} {r['peak_mib']:>11.0f} {r['reads']:>7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
