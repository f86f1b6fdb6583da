"""HTA reads delaycomm's profiler traces (docs/telemetry.md, "In a profiler trace"): per rank, the gloo events
against the c10d ops and delaycomm's spans, from HTA's own data frames.

    DELAYCOMM_DELAY=const:5ms DELAYCOMM_DELAY_FRACTION=0.3 python -m torch.distributed.run --standalone \
      --nproc_per_node 2 bench/results/2026-12-06-vm2core-profiler-spans/profiled_job.py 'DIR/rank{rank}.json'
    python bench/results/2026-12-06-vm2core-profiler-spans/hta_check.py DIR   # needs HolisticTraceAnalysis
"""

import sys

from hta.trace_analysis import TraceAnalysis


def main(trace_dir: str) -> None:
    analysis = TraceAnalysis(trace_dir=trace_dir)
    names = analysis.t.symbol_table.get_sym_table()
    for rank in sorted(analysis.t.get_ranks()):
        df = analysis.t.get_trace(rank)
        n = df["name"].map(names.__getitem__)
        delay = df[n == "delaycomm:delay"]["dur"].sum() / 1e3
        print(
            f"rank {rank}: events {len(df)}, gloo:all_reduce {(n == 'gloo:all_reduce').sum()}, "
            f"c10d::allreduce_ {(n == 'c10d::allreduce_').sum()}, delaycomm:delay {(n == 'delaycomm:delay').sum()}, "
            f"delaycomm:queued {(n == 'delaycomm:queued').sum()}, delay dur sum ms {delay:.1f}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
