"""``python -m delaycomm config``: show the effective configuration (and where each value came from);
``python -m delaycomm profile``: latency profiles (docs/profile.md); ``python -m delaycomm profile compare``: a
replay against its profile; ``python -m delaycomm timeline``: merge the ranks' DELAYCOMM_TRACE files
(docs/telemetry.md)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from delaycomm._config import OPTIONS, format_value

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["timeline"]:  # the ranks' DELAYCOMM_TRACE files merged (docs/telemetry.md, "Timeline")
        from delaycomm import timeline

        return timeline.main(argv[1:])
    if argv[:2] == ["profile", "compare"]:  # a replay's fidelity (docs/profile.md, "Fidelity")
        from delaycomm import fidelity

        return fidelity.main(argv[2:])

    epilog = (
        "options (keyword / environment variable / default / same on every rank):\n"
        + "\n".join(
            f"  {o.name:<15} {o.env:<26} {o.default!s:<16} {'yes' if o.must_match else 'no':<4} {o.help}"
            for o in OPTIONS
        )
        + (
            "\n\nOptions marked 'yes' must have one value on every rank of a group: a difference is an error on every "
            "rank when the group is created."
        )
    )
    parser = argparse.ArgumentParser(
        prog="python -m delaycomm",
        description="delaycomm command line",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "config",
        help="show the effective configuration",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pp = sub.add_parser(
        "profile",
        help="merge stats files into a latency profile; show or plot one (docs/profile.md)",
        description="Merge the stats files (DELAYCOMM_STATS) of the ranks of one or more jobs into a latency "
        "profile, per op and size class; replay it with DELAYCOMM_DELAY=profile:PROFILE.json (docs/profile.md).",
    )
    pp.add_argument(
        "stats",
        nargs="*",
        metavar="SOURCE",
        help="stats files (JSON) of every rank of the jobs, nccl-tests logs, PyTorch profiler traces (by content)",
    )
    pp.add_argument("-o", "--output", metavar="PROFILE.json", help="write the profile here")
    pp.add_argument("--show", metavar="PROFILE.json", help="print a profile as a table")
    pp.add_argument("--png", metavar="FILE.png", help="plot the quantiles per size (needs matplotlib)")
    from delaycomm.sources.build import add_arguments

    add_arguments(pp)
    args = parser.parse_args(argv)
    if args.command == "profile":
        from delaycomm import profile

        return profile.main(args)

    import delaycomm

    try:
        cfg = delaycomm.resolve()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    nccl = delaycomm.nccl_settings()
    if args.json:
        print(
            json.dumps(
                {
                    "config": cfg.as_dict(),
                    "sources": cfg.sources,
                    "must_match": {o.name: o.must_match for o in OPTIONS},
                    "nccl": nccl,
                },
                indent=2,
            )
        )
        return 0
    print(f"# delaycomm {delaycomm.__version__} (CUDA sources compiled: {delaycomm._C.cuda_compiled})")
    print(f"# {'option':<15} {'value':<28} {'source':<36} same on every rank")
    for o in OPTIONS:
        v = format_value(o.name, cfg.values[o.name])
        print(f"  {o.name:<15} {v!s:<28} {cfg.sources[o.name]:<36} {'yes' if o.must_match else 'no'}")
    for var in ("NCCL_ALGO", "NCCL_BUFFSIZE"):
        print(f"  {var:<15} {nccl[var]['value']!s:<28} {nccl[var]['source']}")
    print(f"  {'nccl_version':<15} {nccl['nccl_version']!s:<28}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
