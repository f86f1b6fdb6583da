"""Per-path summary of tests/stale/scripts/consume_job.py's output (before-after.txt).

python bench/results/2026-12-06-vm2core-stale-consume/summary.py OUTDIR
"""

import glob
import sys

import torch


def main(out: str) -> None:
    paths = sorted({p.split("/")[-1].split(".rank")[0] for p in glob.glob(out + "/*.pt")})
    for path in paths:
        r = [torch.load(f"{out}/{path}.rank{i}.pt", weights_only=False) for i in range(2)]
        if "contributed" not in r[0]:
            continue
        errs = []
        for i in range(len(r[0]["contributed"])):
            want = sum(x["contributed"][i] for x in r) / 2
            errs += [float((x["consumed"][i] - want).abs().max() / want.abs().max()) for x in r]
        st = r[0]["stats"]["staleness"]
        print(
            f"{path:9s} err {max(errs):.2e} stale_calls {[x['stale_calls'] for x in r]} taken {r[0]['steps_taken']} "
            f"forced {r[0]['forced']} stale {st['stale']} dropped {st['dropped']} "
            f"scales {r[0]['scales'][:2]}..{r[0]['scales'][-2:]}"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out")
