"""What the ecosystem recipes share (docs/ecosystem.md): the command line, the tiny model and data, and the result
file each rank writes, so that one recipe run on ``delaycomm`` and on ``gloo`` can be compared parameter by
parameter (examples/ecosystem/compare.py).

Every recipe is a user's script run unmodified under torchrun; delaycomm is configured only through DELAYCOMM_*
variables. ``--backend gloo`` runs the same script, same seeds and same data, on plain Gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

# One problem for every recipe: 4 classes separated by a fixed random linear map, 16 features.
FEATURES, CLASSES, HIDDEN = 16, 4, 32


def parse_args(doc: str, ways: tuple[str, ...] = ("recipe",), steps: int = 30, add=None) -> argparse.Namespace:
    """The recipes' common flags: --backend, --steps, --batch, --out, and --way (the recipe, or a front end's own
    way that docs/ecosystem.md shows failing); ``add(parser)`` adds a recipe's own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="delaycomm", help="process-group backend (default delaycomm)")
    parser.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    parser.add_argument("--batch", type=int, default=16, help="per-rank batch size (default 16)")
    parser.add_argument("--out", help="a folder for the result files (rank<R>.json); none: print only")
    parser.add_argument("--way", choices=ways, default=ways[0], help=f"default {ways[0]}")
    if add is not None:
        add(parser)
    args = parser.parse_args()
    if args.steps <= 0 or args.batch <= 0:
        parser.error("--steps and --batch must be positive")
    return args


def model() -> torch.nn.Module:
    """The same initial weights on every rank and in every run."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))


def dataset(samples: int) -> torch.utils.data.TensorDataset:
    """``samples`` labelled examples, the same in every run (each front end's sampler splits them over ranks)."""
    gen = torch.Generator().manual_seed(1234)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)
    x = torch.randn(samples, FEATURES, generator=gen)
    return torch.utils.data.TensorDataset(x, (x @ teacher).argmax(dim=1))


def finish(args: argparse.Namespace, front_end: str, params, versions: dict[str, str], **extra) -> None:
    """Write this rank's result: its parameters (exactly, as float.hex), the default group's backend, and on
    rank 0 delaycomm's counters summed over every delaycomm group (what shows that delaycomm was used)."""
    rank = dist.get_rank()
    flat = torch.cat([p.detach().reshape(-1).to(torch.float64).cpu() for p in params])
    doc = {
        "front_end": front_end,
        "way": args.way,
        "rank": rank,
        "world_size": dist.get_world_size(),
        "backend": str(dist.get_backend()),
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0], **versions},
        "params": [float(v).hex() for v in flat.tolist()],
        **extra,
    }
    if args.backend == "delaycomm":
        import delaycomm

        if doc["backend"] == "delaycomm":
            delaycomm.flush()  # a no-op under bsp; under ssp/asp it delivers what is still in flight
        calls = delayed = stale = kept_fresh = 0
        ops: dict[str, int] = {}
        for group in delaycomm.stats()["groups"].values():
            for op, o in group["ops"].items():
                calls += o["calls"]
                delayed += o["delayed_calls"]
                stale += o["stale_calls"]
                kept_fresh += o["kept_fresh_calls"]
                ops[op] = ops.get(op, 0) + o["calls"]
        doc["delaycomm"] = {
            "calls": calls,
            "delayed_calls": delayed,
            "stale_calls": stale,
            "kept_fresh_calls": kept_fresh,
            "ops": ops,
            "version": delaycomm.__version__,
        }
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump(doc, f)
    if rank == 0:
        counted = doc.get("delaycomm")
        print(
            f"{front_end}: {flat.numel()} parameters, sum {flat.sum().item():.6f}, backend {doc['backend']}"
            + (f", delaycomm calls {counted['calls']} (delayed {counted['delayed_calls']})" if counted else ""),
            flush=True,
        )
