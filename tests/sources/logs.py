"""Synthetic nccl-tests logs for the readers' tests: tables whose numbers follow nccl-tests' own formulas, in the
layouts its versions print (src/common.cu, the collectives' print_header), so that each oddity is one small case."""

from __future__ import annotations

from delaycomm.sources.ops import COLLECTIVES

ELSIZE = {"float": 4, "double": 8, "half": 2, "int8": 1}


def time_us(collective: str, size: int) -> float:
    """A made-up time per size: 20 us plus 100 GB/s of bus traffic; in-place 10% slower (tests tell them apart)."""
    return 20.0 + size / 100e3


def row(collective: str, n: int, size: int, fmt: str = "new", dtype: str = "float", root: int | None = None,
        redop: str | None = None, extra: str = "") -> str:  # fmt: skip
    """One row as nccl-tests prints it: ``fmt`` new (size count type redop root ... #wrong), old (no root column,
    an ``error`` column; all_gather without redop), or the ``bytes N type op`` layout of 2016."""
    c = COLLECTIVES[collective]
    e = ELSIZE[dtype]
    count = size // (e * n) if c.size_is_total else size // e
    size = count * e * n if c.size_is_total else count * e
    redop = redop if redop is not None else ("sum" if c.reduces or collective == "sendrecv" else "none")
    root = root if root is not None else (0 if c.rooted else -1)
    fields = [f"{size:12d}", f"{count:12d}", f"{dtype:>8s}"]
    if fmt == "new":
        fields += [f"{redop:>6s}", f"{root:6d}"]
    elif fmt == "old":
        if c.reduces or collective == "alltoall":
            fields.append(f"{redop:>6s}")
        if c.rooted:
            fields.append(f"{root:6d}")
    for k, place in enumerate((1.0, 1.1)):
        t = time_us(collective, size) * place
        algbw = size / t / 1e3
        busbw = algbw * c.bus_factor(n)
        wrong = "N/A" if k == 1 and collective in ("alltoall", "sendrecv") else ("0" if fmt == "new" else "2e-07")
        fields += [f"{t:7.2f}", f"{algbw:6.2f}", f"{busbw:6.2f}", f"{wrong:>6s}"]
    return "  ".join(fields) + extra


def header(collective: str, fmt: str = "new") -> list[str]:
    c = COLLECTIVES[collective]
    if fmt == "new":
        cols = ["size", "count", "type", "redop", "root"]
        wrong = "#wrong"
    else:
        cols = ["size", "count", "type"]
        if c.reduces or collective == "alltoall":
            cols.append("redop")
        if c.rooted:
            cols.append("root")
        wrong = "error"
    cols += ["time", "algbw", "busbw", wrong] * 2
    units = (
        ["(B)", "(elements)"] + [""] * (len(cols) - 10) + ["(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)"]
    )
    return [
        "#                                                              out-of-place                       in-place",
        "#  " + "  ".join(f"{h:>8s}" for h in cols),
        "#  " + "  ".join(f"{u:>8s}" for u in units),
    ]


def rank_lines(n: int, nodes: int = 1) -> list[str]:
    per = n // nodes
    return [
        f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {f'node{r // per}':>10s} device {r % per:2d} "
        f"[0000:{r:02x}:00] NVIDIA H100 80GB HBM3"
        for r in range(n)
    ]


def run(collective: str, n: int, sizes, nodes: int = 1, fmt: str = "new", starting: bool = True,
        ranks: bool = True, **kw) -> list[str]:  # fmt: skip
    """One run of ``<collective>_perf`` as nccl-tests >= 2.17 prints it (or ``fmt`` old, without the markers)."""
    lines = []
    if starting and fmt == "new":
        lines += ["# nccl-tests version 2.17.8 nccl-headers=22902 nccl-library=22902",
                  f"# Collective test starting: {collective}_perf"]  # fmt: skip
    lines += ["# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 "
              "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]  # fmt: skip
    if ranks:
        lines += rank_lines(n, nodes)
    lines += ["#", *header(collective, fmt)]
    lines += [row(collective, n, s, fmt, **kw) for s in sizes]
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 12.34", "#"]
    if starting and fmt == "new":
        lines += [f"# Collective test concluded: {collective}_perf", "#", ""]
    return lines


def write(tmp_path, name: str, lines) -> str:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return str(p)
