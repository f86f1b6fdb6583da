"""Summary of run.sh's rounds: per variant, size and phase (before / after the load change), each window's error."""
import json, glob, os, sys
out = sys.argv[1]
rows = []
for path in sorted(glob.glob(os.path.join(out, "*-*", "result.json"))):
    v, rnd = os.path.basename(os.path.dirname(path)).rsplit("-", 1)
    r = json.load(open(path))
    for size, row in r["jobs"]["B"]["sizes"].items():
        for w in row["windows"]:
            rows.append((v, rnd, size, w["calls"][0], w["p50_vs_A"], w["p90_vs_A"], w["p99_vs_A"]))
print("| variant | round | size | " + " | ".join(f"calls {a}-{a+500}" for a in range(0, 3000, 500)) + " |")
print("|---|---|---|" + "---|" * 6)
for v in ("decayed", "cumulative"):
    for rnd in sorted({r[1] for r in rows}):
        for size in ("1KiB", "4MiB"):
            cells = [f"{r[4]:+.0%}/{r[5]:+.0%}/{r[6]:+.0%}" for r in rows if r[:3] == (v, rnd, size)]
            if cells:
                print(f"| {v} | {rnd} | {size} | " + " | ".join(cells) + " |")
print()
print("p50 / p90 / p99 against A per window of 500 calls (each rank's calls pooled); the load starts before call 1000.")
print()
print("| variant | size | mean abs. error after the change (calls 1500-3000), p50 / p90 / p99 | the same, calls 0-1000 |")
print("|---|---|---|---|")
for v in ("decayed", "cumulative"):
    for size in ("1KiB", "4MiB"):
        sel = lambda lo, hi: [r for r in rows if r[0] == v and r[2] == size and lo <= r[3] < hi]
        def mae(rs):
            return " / ".join(f"{sum(abs(r[i]) for r in rs) / len(rs):.0%}" for i in (4, 5, 6)) if rs else "-"
        print(f"| {v} | {size} | {mae(sel(1500, 3000))} | {mae(sel(0, 1000))} |")
print()
print("| variant | round | 1 KiB mean, calls 0-1000 / 1500-3000 | 4 MiB mean, the same | nothing added (carried calls, both ranks) |")
print("|---|---|---|---|---|")
import statistics as st
for d in sorted(glob.glob(os.path.join(out, "*-*")), key=lambda d: (os.path.basename(d).split("-")[1], d)):
    load = lambda job: [json.load(open(p))["times_s"] for p in sorted(glob.glob(f"{d}/times-{job}.rank*.json"))]
    A, B = load("A"), load("B")
    cells = []
    for s in ("1KiB", "4MiB"):
        a = st.mean(x for r in A for x in r[s])
        b0 = st.mean(x for r in B for x in r[s][0:1000])
        b1 = st.mean(x for r in B for x in r[s][1500:3000])
        cells.append(f"{b0 / a - 1:+.0%} / {b1 / a - 1:+.0%}")
    stats = json.load(open(f"{d}/result.json"))["jobs"]["B"]["stats"].values()
    nothing = sum(v["nothing_added"] for v in stats)
    calls = sum(v["calls"] for v in stats)
    v, rnd = os.path.basename(d).rsplit("-", 1)
    print(f"| {v} | {rnd} | {cells[0]} | {cells[1]} | {nothing} of {calls} ({nothing / calls:.0%}) |")
print()
print("Means against A's mean (the times files, not committed: 2 MB).")
