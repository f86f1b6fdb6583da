"""The cost model measured on the public nccl-tests tables (docs/costmodel.md): in-sample, held out, and its choices.

Reads the tables of ``<repo>/../shared/data/nccl-tests`` through the profile builder's own reader and reports busbw
error (predicted busbw / measured busbw - 1, the same as measured time / predicted time - 1):

  insample     fitted on tables 15 and 16 (one H100 cluster: 8 ranks on 1 node, 10 ranks on 10 nodes), their rows
  loso         leave one scale out: fitted on one table, predicting the other. The model refuses (neither table shows
               the other's links); with the missing terms set from NCCL's defaults and a stated NIC line rate
               (CostModel.with_defaults) it predicts, and this is that error
  loo          each row >= 256 MiB of 15 and 16 predicted by the 15+16 fit without that row
  extrapolate  every public table fitted on its rows <= 64 MiB, predicting its larger rows (where the fit is
               determined; else the refusal)
  choice       the (algorithm, protocol) the 15+16 fit picks per size at other scales, and the busbw it predicts
  seed000      1 - tree / ring latency of all_reduce, with NCCL's own constants (per protocol) and with the fit

  python bench/costmodel_validate.py --out bench/results/2026-12-06-vm2core-costmodel

Writes OUT/costmodel.json and OUT/README.md (its tables generated from the JSON). Pure NumPy, a few seconds.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from delaycomm import costmodel  # noqa: E402  (the installed package: scripts/setup.sh builds it into .venv)
from delaycomm._tools.units import format_size  # noqa: E402
from delaycomm.costmodel import nccl  # noqa: E402
from delaycomm.sources import build  # noqa: E402

DATA = os.path.join(ROOT, "..", "shared", "data", "nccl-tests")
BIG = 256 << 20
SMALL = 64 << 20
PAIR = ("15-h100-cluster01-5coll-8r-1n.txt", "16-h100-cluster01-5coll-10r-10n.txt")
NIC_400G = 50e9  # bytes/s: a 400 Gb/s NIC's line rate, the one stated input of the held-out prediction of 16
T = costmodel.Topology


def observations(path: str) -> list[costmodel.Observation]:
    return build.read_source(path, build.Options()).observations


def errors(model: costmodel.CostModel, obs: list[costmodel.Observation]) -> dict:
    """Per collective: the error of every row, and the largest at >= 256 MiB."""
    out: dict[str, dict] = {}
    for o in obs:
        e = out.setdefault(o.collective, {"by_size": {}, "max_abs_at_or_above_256MiB": 0.0})
        try:
            err = o.seconds / model.seconds(o.collective, o.size, o.topology) - 1.0
        except costmodel.ModelError as x:
            e["refused"] = str(x)
            continue
        e["by_size"][str(o.size)] = round(err, 4)
        if o.size >= BIG:
            e["max_abs_at_or_above_256MiB"] = max(e["max_abs_at_or_above_256MiB"], abs(err))
    return out


def section_loso(a: list, b: list) -> dict:
    out = {}
    for name, src, dst in (("fit 15, predict 16", a, b), ("fit 16, predict 15", b, a)):
        m = costmodel.fit(src)
        try:
            m.seconds("all_reduce", 1 << 30, dst[0].topology)
            refusal = None
        except costmodel.ModelError as e:
            refusal = str(e)
        filled = m.with_defaults(bw_net=NIC_400G)
        out[name] = {
            "refused": refusal,
            "assumed": {k: f.assumed for k, f in filled.fits.items()},
            "errors": errors(filled, dst),
            "in_sample": errors(m, src),
        }
    return out


def section_loo(obs: list) -> dict:
    out: dict[str, dict] = {}
    for o in obs:
        if o.size < BIG:
            continue
        m = costmodel.fit([p for p in obs if p is not o])
        e = o.seconds / m.seconds(o.collective, o.size, o.topology) - 1.0
        d = out.setdefault(f"{o.collective} {o.topology.ranks}r", {"max_abs": 0.0})
        d["max_abs"] = max(d["max_abs"], abs(e))
    return out


def section_extrapolate(files: dict[str, list]) -> dict:
    out = {}
    for f, obs in files.items():
        small = [o for o in obs if o.size <= SMALL]
        try:
            m = costmodel.fit(small)
        except costmodel.ModelError as e:
            out[f] = {"refused": str(e)}
            continue
        big = [o for o in obs if o.size > SMALL]
        out[f] = {"errors": errors(m, big), "rows_fitted": len(small)}
    return out


def section_choice(model: costmodel.CostModel) -> dict:
    out = {}
    for ranks, nodes in ((16, 2), (32, 4), (64, 8), (80, 10), (256, 32)):
        t = T(ranks, nodes)
        rows = {}
        for name in ("all_reduce", "all_gather", "reduce_scatter"):
            for k in range(3, 35, 2):
                s = 1 << k
                a, p = model.choice(name, s, t)
                rows.setdefault(name, {})[str(s)] = [a, p, round(model.busbw(name, s, t) * 1e-9, 2)]
        out[t.describe()] = rows
    return out


ALGO_SETTINGS = (None, "^NVLSTree", "Ring")


def section_algo(obs: list) -> dict:
    """all_reduce at 80 ranks on 10 nodes under the cluster's NCCL_ALGO: unset (NCCL's choice), NVLSTree disabled,
    ring forced; the same fit otherwise."""
    out = {}
    t = T(80, 10)
    for algo in ALGO_SETTINGS:
        m = costmodel.fit(obs, tuning=nccl.Tuning(algo=algo))
        out[algo or "unset"] = {
            str(1 << k): [*m.choice("all_reduce", 1 << k, t), round(m.busbw("all_reduce", 1 << k, t) * 1e-9, 2)]
            for k in range(20, 35)
        }
    return out


def _nccl_latency_us(algo: str, p: int, ranks: int, nodes: int) -> float:
    """NCCL's own latency of an all_reduce (tuning.cc's constants, no measurement)."""
    g = ranks // nodes
    if algo == "ring":
        steps, inter = nccl.ring_steps("all_reduce", ranks, nodes)
        net = "tree" if g == 1 else "ring"
        return (
            nccl.BASE_US["ring"][p]
            + (steps - inter) * nccl.HW_US["nvlink"]["ring"][p]
            + inter * nccl.HW_US["net"][net][p]
        )
    return nccl.BASE_US["tree"][p] + 2 * (
        (g - 1) * nccl.HW_US["nvlink"]["tree"][p] + nccl.log2i(nodes) * nccl.HW_US["net"]["tree"][p]
    )


def section_seed000(model: costmodel.CostModel) -> dict:
    out = {}
    for ranks, nodes in ((16, 2), (32, 4), (64, 8), (256, 32), (1024, 128)):
        t = T(ranks, nodes)
        row = {}
        for p, proto in enumerate(nccl.PROTOCOLS):
            ring = _nccl_latency_us("ring", p, ranks, nodes)
            row[f"nccl {proto}"] = round(1 - _nccl_latency_us("tree", p, ranks, nodes) / ring, 3)
        for s in (4096, 1 << 20, 16 << 20, 256 << 20, 1 << 30):
            ring = min(model.seconds("all_reduce", s, t, algorithm="ring", protocol=q) for q in nccl.PROTOCOLS)
            tree = min(model.seconds("all_reduce", s, t, algorithm="tree", protocol=q) for q in nccl.PROTOCOLS)
            row[f"fit {s}"] = round(1 - tree / ring, 3)
        out[t.describe()] = row
    return out


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def markdown(rec: dict) -> str:
    cols = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")
    lines = [
        "# The cost model on the public nccl-tests tables",
        "",
        f"`{rec['command']}` ({rec['machine']}; arithmetic on the tables, no GPU). Error: predicted busbw over "
        "measured, minus one; the largest at sizes >= 256 MiB.",
        "",
        "## In-sample and held out, side by side",
        "",
        "| check | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]

    def row(title, errs):
        cells = [_pct(errs.get(c, {}).get("max_abs_at_or_above_256MiB")) for c in cols]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")

    row("in-sample, 15+16 fit, on 15", rec["insample"]["15"])
    row("in-sample, 15+16 fit, on 16", rec["insample"]["16"])
    for name, d in rec["loso"].items():
        row(f"{name}: in-sample", d["in_sample"])
        row(f"{name}: held out (NCCL defaults + 400 Gb/s NIC)", d["errors"])
    lines += ["", "Refusals without the stated defaults:", ""]
    lines += [f"- {name}: {d['refused']}" for name, d in rec["loso"].items()]
    lines += ["", "## Leave one row out (>= 256 MiB, 15+16 fit)", "", "| collective | max error |", "|---|---|"]
    lines += [f"| {k} | {_pct(v['max_abs'])} |" for k, v in rec["loo"].items()]
    lines += ["", "## Fitted on rows <= 64 MiB, predicting the larger", ""]
    for f, d in rec["extrapolate"].items():
        if "refused" in d:
            lines.append(f"- {f}: refused: {d['refused']}")
        else:
            worst = {c: _pct(e["max_abs_at_or_above_256MiB"]) for c, e in d["errors"].items()}
            lines.append(f"- {f}: {worst}")
    lines += ["", "## Seed 000: 1 - tree / ring latency of all_reduce", ""]
    keys = list(next(iter(rec["seed000"].values())))
    lines += ["| scale | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for scale, r in rec["seed000"].items():
        lines.append(f"| {scale} | " + " | ".join(_pct(r[k]) for k in keys) + " |")
    lines += ["", "## NCCL's choice under the 15+16 fit (algorithm/protocol, predicted busbw GB/s)", ""]
    for scale, by in rec["choice"].items():
        sizes = list(next(iter(by.values())))
        lines += [f"### {scale}", "", "| size | " + " | ".join(by) + " |", "|---|" + "---|" * len(by)]
        for s in sizes:
            lines.append(
                f"| {format_size(int(s))} | " + " | ".join(f"{v[s][0]}/{v[s][1]} {v[s][2]}" for v in by.values()) + " |"
            )
        lines.append("")
    by = rec["algo_80"]
    lines += [
        "## all_reduce at 80 ranks on 10 nodes under the cluster's NCCL_ALGO (15+16 fit; predicted busbw GB/s)",
        "",
        "| size | " + " | ".join(f"NCCL_ALGO {k}" for k in by) + " |",
        "|---|" + "---|" * len(by),
    ]
    for s in next(iter(by.values())):
        lines.append(
            f"| {format_size(int(s))} | " + " | ".join(f"{v[s][0]}/{v[s][1]} {v[s][2]}" for v in by.values()) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the result folder (created)")
    p.add_argument("--data", default=DATA, help="the folder of nccl-tests tables (default ../shared/data/nccl-tests)")
    args = p.parse_args(argv)
    files = {os.path.basename(f): observations(f) for f in sorted(glob.glob(os.path.join(args.data, "*.txt")))}
    a, b = files[PAIR[0]], files[PAIR[1]]
    model = costmodel.fit(a + b)
    rec = {
        "command": "python bench/costmodel_validate.py --out " + os.path.relpath(args.out, ROOT),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other work",
        "model": model.as_dict(),
        "insample": {"15": errors(model, a), "16": errors(model, b)},
        "loso": section_loso(a, b),
        "loo": section_loo(a + b),
        "extrapolate": section_extrapolate(files),
        "choice": section_choice(model),
        "seed000": section_seed000(model),
        "algo_80": section_algo(a + b),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "costmodel.json"), "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(markdown(rec))
    print(f"wrote {args.out}/costmodel.json and README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
