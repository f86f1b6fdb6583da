"""The cost model measured on the public nccl-tests tables (docs/costmodel.md): how well it fits, how far it carries.

Reads the tables of ``<repo>/../shared/data/nccl-tests`` (docs/profile.md has their sources) through the profile
builder's own reader, and measures the model's error as busbw error (predicted busbw / measured - 1; nccl-tests'
busbw, so the same as measured time / predicted time - 1):

  fit          the model fitted on tables 15 and 16 (one H100 cluster: 8 ranks on 1 node, 10 ranks on 10 nodes),
               its error on their own rows
  cross        fitted on one of the two, predicting the other (what it refuses, and why)
  bus_factor   a collective priced with another collective's fitted terms, at the same scale (the bus factors)
  loo          each row >= 256 MiB of tables 15 and 16 predicted by the model fitted without it
  extrapolate  every public table: fitted on its rows <= 64 MiB, predicting its larger rows
  seed000      ring against tree all-reduce under the 15+16 fit (seed 000's "tree cuts sync latency ~60%")
  predictions  the 15+16 fit at other scales of the same cluster (predictions: no measurement checks them here)

  python bench/costmodel_validate.py --out bench/results/2026-12-03-vm2core-costmodel

Writes OUT/costmodel.json and OUT/README.md (tables generated from the JSON). Pure NumPy; a few seconds, most
of them importing delaycomm.
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
sys.path.insert(0, os.path.join(ROOT, "python"))

from delaycomm import costmodel  # noqa: E402
from delaycomm.sources import build  # noqa: E402
from delaycomm.sources.ops import COLLECTIVES  # noqa: E402

DATA = os.path.join(ROOT, "..", "shared", "data", "nccl-tests")
BIG = 256 << 20
SMALL = 64 << 20
PAIR = ("15-h100-cluster01-5coll-8r-1n.txt", "16-h100-cluster01-5coll-10r-10n.txt")


def observations(path: str) -> list[costmodel.Observation]:
    return build.read_source(path, build.Options()).observations


def err(model: costmodel.CostModel, o: costmodel.Observation, **kw) -> float:
    """busbw error of the model on one measured row: predicted busbw / measured busbw - 1."""
    return o.seconds / model.seconds(o.collective, o.size, o.topology, **kw) - 1.0


def summarise(errors: list[tuple[int, float]]) -> dict:
    big = [e for s, e in errors if s >= BIG]
    return {
        "max_abs_at_or_above_256MiB": max((abs(e) for e in big), default=None),
        "mean_abs_at_or_above_256MiB": sum(abs(e) for e in big) / len(big) if big else None,
        "by_size": {str(s): round(e, 4) for s, e in errors},
    }


def by_table(obs: list[costmodel.Observation]) -> dict[tuple[str, str], list[costmodel.Observation]]:
    out: dict[tuple[str, str], list[costmodel.Observation]] = {}
    for o in obs:
        out.setdefault((os.path.basename(o.where.rsplit(":", 1)[0]), o.collective), []).append(o)
    return out


def section_fit(pair_obs: list[costmodel.Observation]) -> tuple[costmodel.CostModel, dict]:
    model = costmodel.fit(pair_obs)
    res = {}
    for (f, c), rows in sorted(by_table(pair_obs).items()):
        res[f"{f} {c}"] = summarise([(o.size, err(model, o)) for o in rows])
    return model, {"terms": model.as_dict()["collectives"], "errors": res}


def section_cross(obs_by_file: dict[str, list]) -> dict:
    out = {}
    for a, b in (PAIR, PAIR[::-1]):
        key = f"fit {a[:2]} -> predict {b[:2]}"
        model = costmodel.fit(obs_by_file[a])
        res = {}
        for (_f, c), rows in sorted(by_table(obs_by_file[b]).items()):
            try:
                res[c] = summarise([(o.size, err(model, o)) for o in rows])
            except costmodel.ModelError as e:
                res[c] = {"refused": str(e)}
        out[key] = res
    return out


def section_bus_factor(obs_by_file: dict[str, list]) -> dict:
    """At one scale: price collective X with collective Y's fitted terms (same links, X's steps and bus factor)."""
    out = {}
    pairs = [
        ("reduce_scatter", "all_gather"),
        ("all_gather", "reduce_scatter"),
        ("all_reduce", "reduce_scatter"),
        ("all_reduce", "all_gather"),
    ]
    for f in PAIR:
        model = costmodel.fit(obs_by_file[f])
        tables = by_table(obs_by_file[f])
        for x, y in pairs:
            rows = tables.get((f, x), [])
            out[f"{f[:2]} {x} priced with {y}'s terms"] = summarise(
                [(o.size, err(model, o, params_of=y)) for o in rows]
            )
    return out


def section_loo(pair_obs: list[costmodel.Observation]) -> dict:
    out = {}
    for i, o in enumerate(pair_obs):
        if o.size < BIG:
            continue
        rest = [p for j, p in enumerate(pair_obs) if j != i and p.collective == o.collective]
        model = costmodel.fit(rest)
        key = f"{os.path.basename(o.where.rsplit(':', 1)[0])[:2]} {o.collective}"
        out.setdefault(key, []).append((o.size, err(model, o)))
    return {k: summarise(v) for k, v in sorted(out.items())}


def section_extrapolate(obs_by_file: dict[str, list]) -> dict:
    out = {}
    for f, obs in sorted(obs_by_file.items()):
        for (_, c), rows in sorted(by_table(obs).items()):
            fit_rows = [o for o in rows if o.size <= SMALL]
            test = [o for o in rows if o.size > SMALL]
            key = f"{f} {c}"
            if len(fit_rows) < 2 or not test:
                out[key] = {"skipped": f"{len(fit_rows)} row(s) <= 64 MiB, {len(test)} above"}
                continue
            model = costmodel.fit(fit_rows)
            s = summarise([(o.size, err(model, o)) for o in test])
            s["fit_rows"] = len(fit_rows)
            s["busbw_at_64MiB_over_largest"] = _saturation(rows)
            out[key] = s
    return out


def _saturation(rows: list[costmodel.Observation]) -> float | None:
    """How close a table is to its top bandwidth at 64 MiB: busbw(64 MiB) / busbw(largest size)."""
    at = [o for o in rows if o.size <= SMALL]
    if not at:
        return None
    a, z = max(at, key=lambda o: o.size), max(rows, key=lambda o: o.size)
    return round((a.size / a.seconds) / (z.size / z.seconds), 3)


def section_seed000(model: costmodel.CostModel) -> dict:
    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]
    topologies = [(16, 2), (64, 8), (256, 32), (1024, 128), (8, 8), (64, 64)]
    rows = []
    for n, nn in topologies:
        t = costmodel.Topology(n, nn)
        for s in sizes:
            ring = model.seconds("all_reduce", s, t, algorithm="ring")
            tree = model.seconds("all_reduce", s, t, algorithm="tree")
            rows.append(
                {
                    "ranks": n,
                    "nodes": nn,
                    "bytes": s,
                    "ring_us": ring * 1e6,
                    "tree_us": tree * 1e6,
                    "tree_cut": 1.0 - tree / ring,
                    "nccl_picks": "tree" if tree < ring else "ring",
                }
            )
    return {"rows": rows}


def section_predictions(model: costmodel.CostModel) -> dict:
    out = {}
    for n, nn in [(2, 1), (4, 1), (8, 1), (2, 2), (4, 4), (10, 10), (16, 2), (32, 4), (80, 10)]:
        t = costmodel.Topology(n, nn)
        out[f"{n}r/{nn}n"] = {
            c: {str(s): round(model.busbw(c, s, t) * 1e-9, 1) for s in (BIG, 1 << 30, 16 << 30)} for c in model.fits
        }
    return out


def markdown(rec: dict) -> str:
    lines = [
        "# The cost model on the public nccl-tests tables (docs/costmodel.md)",
        "",
        f"Generated by `python bench/costmodel_validate.py --out {rec['out']}` from `costmodel.json` beside this "
        f"file. Machine: {rec['machine']} (the numbers are arithmetic on the tables: no timing on this machine). "
        "Error = predicted busbw / measured busbw - 1 (nccl-tests' busbw: the same as measured time / predicted "
        "time - 1).",
        "",
        "## Fitted on tables 15 and 16 (one H100 cluster: 8 ranks / 1 node, 10 ranks / 10 nodes)",
        "",
        "| collective | lat_intra (us/step) | lat_inter (us/step) | bw_intra (GB/s) | bw_net (GB/s) | rms error |",
        "|---|---|---|---|---|---|",
    ]
    for c, t in rec["fit"]["terms"].items():
        lines.append(
            f"| {c} | {_f(t['lat_intra_us'])} | {_f(t['lat_inter_us'])} | {_f(t['bw_intra_GBps'])} | "
            f"{_f(t['bw_net_GBps'])} | {t['rms_relative_error']:.1%} |"
        )
    lines += ["", _errors_table("In-sample error at >= 256 MiB", rec["fit"]["errors"])]
    lines += ["", "## Cross-scale: fitted on one table, predicting the other", ""]
    for k, v in rec["cross"].items():
        for c, s in v.items():
            lines.append(f"- {k}, {c}: " + (s["refused"] if "refused" in s else _max(s)))
    lines += [
        "",
        _errors_table(
            "Bus factors: a collective priced with another's terms, same scale, >= 256 MiB", rec["bus_factor"]
        ),
    ]
    lines += ["", _errors_table("Leave one size out (tables 15 and 16, rows >= 256 MiB)", rec["loo"])]
    lines += [
        "",
        "## Extrapolation: fitted on a table's rows <= 64 MiB, predicting its rows >= 256 MiB",
        "",
        "| table | collective | rows fitted | busbw(64 MiB) / busbw(largest) | max error | mean error |",
        "|---|---|---|---|---|---|",
    ]
    for k, s in rec["extrapolate"].items():
        f, c = k.rsplit(" ", 1)
        if "skipped" in s:
            lines.append(f"| {f} | {c} | skipped: {s['skipped']} | | | |")
        else:
            lines.append(
                f"| {f} | {c} | {s['fit_rows']} | {s['busbw_at_64MiB_over_largest']} | "
                f"{_p(s['max_abs_at_or_above_256MiB'])} | {_p(s['mean_abs_at_or_above_256MiB'])} |"
            )
    lines += [
        "",
        "## Seed 000: tree against ring all-reduce (the 15+16 fit; cut = 1 - tree / ring)",
        "",
        "| ranks | nodes | " + " | ".join(_size(r) for r in _sizes(rec)) + " |",
        "|---|---|" + "---|" * len(_sizes(rec)),
    ]
    topo: dict[tuple[int, int], list] = {}
    for r in rec["seed000"]["rows"]:
        topo.setdefault((r["ranks"], r["nodes"]), []).append(r)
    for (n, nn), rs in topo.items():
        lines.append(f"| {n} | {nn} | " + " | ".join(f"{r['tree_cut']:+.0%}" for r in rs) + " |")
    lines += [
        "",
        "## Predictions at other scales of that cluster (busbw GB/s at 256 MiB / 1 GiB / 16 GiB; unchecked here)",
        "",
        "| scale | " + " | ".join(rec["fit"]["terms"]) + " |",
        "|---|" + "---|" * len(rec["fit"]["terms"]),
    ]
    for k, v in rec["predictions"].items():
        lines.append(f"| {k} | " + " | ".join(" / ".join(str(x) for x in v[c].values()) for c in v) + " |")
    return "\n".join(lines) + "\n"


def _sizes(rec):
    seen = []
    for r in rec["seed000"]["rows"]:
        if r["bytes"] not in seen:
            seen.append(r["bytes"])
    return seen


def _size(b: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b >> k} {unit}"
    return f"{b} B"


def _f(v) -> str:
    return "unknown" if v is None else f"{v:.1f}"


def _p(v) -> str:
    return "" if v is None else f"{v:.1%}"


def _max(s: dict) -> str:
    return f"max error {_p(s['max_abs_at_or_above_256MiB'])} at >= 256 MiB"


def _errors_table(title: str, res: dict) -> str:
    lines = [f"### {title}", "", "| table / collective | max error | mean error |", "|---|---|---|"]
    for k, s in res.items():
        lines.append(f"| {k} | {_p(s['max_abs_at_or_above_256MiB'])} | {_p(s['mean_abs_at_or_above_256MiB'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the result folder (created)")
    p.add_argument("--data", default=DATA, help="the folder of nccl-tests tables (default ../shared/data/nccl-tests)")
    args = p.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.data, "*.txt")))
    if not all(os.path.exists(os.path.join(args.data, f)) for f in PAIR):
        print(f"error: {args.data} lacks tables {PAIR}", file=sys.stderr)
        return 2
    obs_by_file = {os.path.basename(f): observations(f) for f in files}
    pair_obs = obs_by_file[PAIR[0]] + obs_by_file[PAIR[1]]
    model, fit_rec = section_fit(pair_obs)
    rec = {
        "out": os.path.relpath(args.out, ROOT) if os.path.isabs(args.out) else args.out,
        "machine": f"{platform.node() or 'unknown host'}, Python {platform.python_version()}",
        "data": sorted(obs_by_file),
        "fit": fit_rec,
        "cross": section_cross(obs_by_file),
        "bus_factor": section_bus_factor(obs_by_file),
        "loo": section_loo(pair_obs),
        "extrapolate": section_extrapolate(obs_by_file),
        "seed000": section_seed000(model),
        "predictions": section_predictions(model),
        "collectives": list(COLLECTIVES),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "costmodel.json"), "w") as f:
        json.dump(rec, f, indent=1)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(markdown(rec))
    print(f"# wrote {args.out}/costmodel.json and README.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
