"""Every collective that exists at world size 1, through delaycomm, sync and async, with exact expected values.

    python tests/gpu/collectives_ws1.py --device cuda     # delaycomm over NCCL on one GPU
    python tests/gpu/collectives_ws1.py --device cpu      # the same table over Gloo (the CPU rehearsal)

Prints one line ``JSON{...}``: per case and async_op, whether the result was exact, and delaycomm's telemetry per
op against the number of calls made (every call must be counted). Exit status 1 when anything is wrong. send/recv
are left out: at world size 1 there is no peer. Run by tests/gpu/test_nccl_collectives.py.

At world size 1 every reduction of one contribution is that contribution, so an exact result only shows that the
data went through untouched; what can fail here is the wrapper (routing, works, futures, coalescing, telemetry)
and NCCL's path through it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist

R = dist.ReduceOp
N = 13  # odd: no vector width divides it


def data(device, salt=0, n=N):
    return torch.arange(n, dtype=torch.float32, device=device) + 1 + 100 * salt


def _wait(work, async_op):
    if async_op:
        assert work is not None, "async_op=True returned no work"
        work.wait()
    else:
        assert work is None, f"async_op=False returned {work!r}"


# Each case: (name, stats op it is counted under, calls of that op per run, fn(device, group, async_op) -> ok).
def c_broadcast(d, g, a):
    t = data(d)
    _wait(dist.broadcast(t, src=0, group=g, async_op=a), a)
    return torch.equal(t, data(d))


def c_all_reduce(op):
    def fn(d, g, a):
        t = data(d)
        _wait(dist.all_reduce(t, op=op, group=g, async_op=a), a)
        return torch.equal(t, data(d))

    return fn


def c_all_reduce_future(d, g, a):
    t = data(d)
    work = dist.all_reduce(t, group=g, async_op=True)
    got = work.get_future().then(lambda f: f.value()[0] * 2).wait()
    return torch.equal(got, data(d) * 2) and torch.equal(t, data(d))


def c_reduce(d, g, a):
    t = data(d)
    _wait(dist.reduce(t, dst=0, group=g, async_op=a), a)
    return torch.equal(t, data(d))


def c_all_gather(d, g, a):
    out = [torch.zeros(N, device=d)]
    _wait(dist.all_gather(out, data(d), group=g, async_op=a), a)
    return torch.equal(out[0], data(d))


def c_all_gather_into_tensor(d, g, a):
    out = torch.zeros(N, device=d)
    _wait(dist.all_gather_into_tensor(out, data(d), group=g, async_op=a), a)
    return torch.equal(out, data(d))


def c_gather(d, g, a):
    out = [torch.zeros(N, device=d)]
    _wait(dist.gather(data(d), gather_list=out, dst=0, group=g, async_op=a), a)
    return torch.equal(out[0], data(d))


def c_scatter(d, g, a):
    out = torch.zeros(N, device=d)
    _wait(dist.scatter(out, scatter_list=[data(d)], src=0, group=g, async_op=a), a)
    return torch.equal(out, data(d))


def c_reduce_scatter(d, g, a):
    out = torch.zeros(N, device=d)
    _wait(dist.reduce_scatter(out, [data(d)], group=g, async_op=a), a)
    return torch.equal(out, data(d))


def c_reduce_scatter_tensor(d, g, a):
    out = torch.zeros(N, device=d)
    _wait(dist.reduce_scatter_tensor(out, data(d), group=g, async_op=a), a)
    return torch.equal(out, data(d))


def c_all_to_all_single(d, g, a):
    out = torch.zeros(N, device=d)
    _wait(dist.all_to_all_single(out, data(d), group=g, async_op=a), a)
    return torch.equal(out, data(d))


def c_all_to_all_single_splits(d, g, a):
    out = torch.zeros(N, device=d)
    _wait(dist.all_to_all_single(out, data(d), output_split_sizes=[N], input_split_sizes=[N], group=g, async_op=a), a)
    return torch.equal(out, data(d))


def c_all_to_all(d, g, a):
    out = [torch.zeros(N, device=d)]
    _wait(dist.all_to_all(out, [data(d)], group=g, async_op=a), a)
    return torch.equal(out[0], data(d))


def c_barrier(d, g, a):
    kw = {"device_ids": [0]} if d == "cuda" else {}
    _wait(dist.barrier(group=g, async_op=a, **kw), a)
    return True


def c_coalesced_all_reduce(d, g, a):
    ts = [data(d, 0), data(d, 1, n=7)]
    with dist._coalescing_manager(group=g, device=torch.device(d), async_ops=a) as cm:
        for t in ts:
            dist.all_reduce(t, group=g)
    if a:
        cm.wait()
    return torch.equal(ts[0], data(d, 0)) and torch.equal(ts[1], data(d, 1, n=7))


def c_coalesced_all_gather(d, g, a):
    outs = [torch.zeros(N, device=d), torch.zeros(7, device=d)]
    with dist._coalescing_manager(group=g, device=torch.device(d), async_ops=a) as cm:
        dist.all_gather_into_tensor(outs[0], data(d, 0), group=g)
        dist.all_gather_into_tensor(outs[1], data(d, 1, n=7), group=g)
    if a:
        cm.wait()
    return torch.equal(outs[0], data(d, 0)) and torch.equal(outs[1], data(d, 1, n=7))


def c_coalesced_reduce_scatter(d, g, a):
    outs = [torch.zeros(N, device=d), torch.zeros(7, device=d)]
    with dist._coalescing_manager(group=g, device=torch.device(d), async_ops=a) as cm:
        dist.reduce_scatter_tensor(outs[0], data(d, 0), group=g)
        dist.reduce_scatter_tensor(outs[1], data(d, 1, n=7), group=g)
    if a:
        cm.wait()
    return torch.equal(outs[0], data(d, 0)) and torch.equal(outs[1], data(d, 1, n=7))


CASES = [
    ("broadcast", "broadcast", 1, c_broadcast),
    ("all_reduce sum", "allreduce", 1, c_all_reduce(R.SUM)),
    ("all_reduce product", "allreduce", 1, c_all_reduce(R.PRODUCT)),
    ("all_reduce min", "allreduce", 1, c_all_reduce(R.MIN)),
    ("all_reduce max", "allreduce", 1, c_all_reduce(R.MAX)),
    ("all_reduce avg", "allreduce", 1, c_all_reduce(R.AVG)),
    ("all_reduce future.then", "allreduce", 1, c_all_reduce_future),
    ("reduce", "reduce", 1, c_reduce),
    ("all_gather", "allgather", 1, c_all_gather),
    ("all_gather_into_tensor", "_allgather_base", 1, c_all_gather_into_tensor),
    ("gather", "gather", 1, c_gather),
    ("scatter", "scatter", 1, c_scatter),
    ("reduce_scatter", "reduce_scatter", 1, c_reduce_scatter),
    ("reduce_scatter_tensor", "_reduce_scatter_base", 1, c_reduce_scatter_tensor),
    ("all_to_all_single", "alltoall_base", 1, c_all_to_all_single),
    ("all_to_all_single splits", "alltoall_base", 1, c_all_to_all_single_splits),
    ("all_to_all", "alltoall", 1, c_all_to_all),
    ("barrier", "barrier", 1, c_barrier),
    ("coalesced all_reduce", None, None, c_coalesced_all_reduce),
    ("coalesced all_gather_into_tensor", None, None, c_coalesced_all_gather),
    ("coalesced reduce_scatter_tensor", None, None, c_coalesced_reduce_scatter),
]
ONLY_ASYNC = {"all_reduce future.then"}  # a future exists only with async_op=True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), required=True)
    args = ap.parse_args()
    d = args.device
    import delaycomm

    tmp = tempfile.mkdtemp(prefix="delaycomm-ws1-")
    kw = {"device_id": torch.device("cuda", 0)} if d == "cuda" else {}
    if d == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("delaycomm", init_method=f"file://{tmp}/store", rank=0, world_size=1, **kw)
    g = dist.group.WORLD
    out = {
        "device": d,
        "backend": type(g._get_backend(torch.device(d))).__name__,
        "cases": {},
        "errors": {},
        "nccl_settings": delaycomm.nccl_settings() if d == "cuda" else None,
    }
    made: dict[str, int] = {}
    for name, op, calls, fn in CASES:
        for a in (True,) if name in ONLY_ASYNC else (False, True):
            key = f"{name} async_op={a}"
            try:
                ok = bool(fn(d, g, a))
                if d == "cuda":
                    torch.cuda.synchronize()
                if op is not None:
                    made[op] = made.get(op, 0) + calls
            except Exception as e:  # noqa: BLE001 - every failure is reported, the table goes on
                ok = False
                out["errors"][key] = f"{type(e).__name__}: {e}"[:300] + "\n" + traceback.format_exc()[-800:]
            out["cases"][key] = ok
    if d == "cuda":
        torch.cuda.synchronize()
    st = delaycomm.stats(g)["ops"]
    out["stats_calls"] = {op: v["calls"] for op, v in st.items()}
    out["stats_untimed"] = {op: v.get("untimed", 0) for op, v in st.items()}
    out["calls_made"] = made
    # Every call made is counted under its op (coalesced windows are counted under their own ops; checked for
    # presence only: how a window is split into ops is the inner backend's business).
    out["uncounted"] = {
        op: [n, st.get(op, {}).get("calls", 0)] for op, n in made.items() if st.get(op, {}).get("calls", 0) != n
    }
    out["ok"] = all(out["cases"].values()) and not out["uncounted"]
    print("JSON" + json.dumps(out))
    dist.destroy_process_group()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
