"""Table of collectives run on a delaycomm group and on a plain Gloo group, with identical inputs.

Each case is ``run(group, rank, world, dtype, op) -> list[Tensor]`` (the tensors the collective produced on this
rank). The tests compare the two groups' outputs bit for bit; the combinations Gloo refuses are listed
(:func:`expected_refusal`), and delaycomm must refuse exactly those, in Gloo's words. Roots are group ranks
(``group_src``/``group_dst``), so the cases run on any group, including the harness's thread ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

R = dist.ReduceOp
REDUCE_OPS = {"sum": R.SUM, "avg": R.AVG, "max": R.MAX, "min": R.MIN, "product": R.PRODUCT}
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
)
N = 13  # odd, so that no size is a multiple of a vector width


def make(rank: int, dtype: torch.dtype, n: int = N, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + 17 * salt + 1)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 3).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    hi = 3 if dtype in (torch.int8, torch.uint8) else 50
    return torch.randint(0, hi, (n,), generator=g).to(dtype)


def _all_reduce(g, rank, world, dtype, op):
    t = make(rank, dtype)
    dist.all_reduce(t, op=op, group=g)
    return [t]


def _all_reduce_async_future(g, rank, world, dtype, op):
    t = make(rank, dtype)
    work = dist.all_reduce(t, op=op, group=g, async_op=True)
    value = work.get_future().wait()
    work.wait()
    return [t, *value]


def _reduce(g, rank, world, dtype, op):
    t = make(rank, dtype)
    dist.reduce(t, group_dst=world - 1, op=op, group=g)
    return [t] if rank == world - 1 else []


def _broadcast(g, rank, world, dtype, op):
    t = make(rank, dtype)
    dist.broadcast(t, group_src=world - 1, group=g)
    return [t]


def _all_gather(g, rank, world, dtype, op):
    out = [torch.zeros(N, dtype=dtype) for _ in range(world)]
    dist.all_gather(out, make(rank, dtype), group=g)
    return out


def _all_gather_into_tensor(g, rank, world, dtype, op):
    out = torch.zeros(world * N, dtype=dtype)
    dist.all_gather_into_tensor(out, make(rank, dtype), group=g)
    return [out]


def _all_gather_into_tensor_inplace(g, rank, world, dtype, op):
    out = torch.zeros(world * N, dtype=dtype)
    mine = out.narrow(0, rank * N, N)
    mine.copy_(make(rank, dtype))
    dist.all_gather_into_tensor(out, mine, group=g)
    return [out]


def _reduce_scatter(g, rank, world, dtype, op):
    out = torch.zeros(N, dtype=dtype)
    dist.reduce_scatter(out, [make(rank, dtype, salt=i) for i in range(world)], op=op, group=g)
    return [out]


def _reduce_scatter_tensor(g, rank, world, dtype, op):
    out = torch.zeros(N, dtype=dtype)
    dist.reduce_scatter_tensor(out, make(rank, dtype, n=world * N), op=op, group=g)
    return [out]


def _reduce_scatter_tensor_inplace(g, rank, world, dtype, op):
    inp = make(rank, dtype, n=world * N)
    out = inp.narrow(0, rank * N, N)
    dist.reduce_scatter_tensor(out, inp, op=op, group=g)
    return [inp]


def _all_to_all_single_uneven(g, rank, world, dtype, op):
    # rank r sends (r + d + 1) elements to rank d
    in_splits = [rank + d + 1 for d in range(world)]
    out_splits = [s + rank + 1 for s in range(world)]
    inp = make(rank, dtype, n=sum(in_splits))
    out = torch.zeros(sum(out_splits), dtype=dtype)
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=g)
    return [out]


def _all_to_all_single_even(g, rank, world, dtype, op):
    inp = make(rank, dtype, n=world * 3)
    out = torch.zeros(world * 3, dtype=dtype)
    dist.all_to_all_single(out, inp, group=g)
    return [out]


def _all_to_all(g, rank, world, dtype, op):
    ins = [make(rank, dtype, n=3, salt=d) for d in range(world)]
    outs = [torch.zeros(3, dtype=dtype) for _ in range(world)]
    dist.all_to_all(outs, ins, group=g)
    return outs


def _all_to_all_uneven(g, rank, world, dtype, op):
    # rank r sends d + 2 elements to rank d: Gloo's all_to_all takes equal sizes only, and delaycomm must refuse
    # it in the same words
    ins = [make(rank, dtype, n=d + 2, salt=d) for d in range(world)]
    outs = [torch.zeros(rank + 2, dtype=dtype) for _ in range(world)]
    dist.all_to_all(outs, ins, group=g)
    return outs


def _gather(g, rank, world, dtype, op):
    out = [torch.zeros(N, dtype=dtype) for _ in range(world)] if rank == 0 else None
    dist.gather(make(rank, dtype), out, group_dst=0, group=g)
    return out or []


def _scatter(g, rank, world, dtype, op):
    out = torch.zeros(N, dtype=dtype)
    ins = [make(rank, dtype, salt=i) for i in range(world)] if rank == 0 else None
    dist.scatter(out, ins, group_src=0, group=g)
    return [out]


def _all_reduce_coalesced_manager(g, rank, world, dtype, op):
    ts = [make(rank, dtype, n=N + i, salt=i) for i in range(3)]
    with dist._coalescing_manager(group=g, async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t, op=op, group=g)
    cm.wait()
    return ts


# Cases that run over every dtype; the others run over a few representative ones (CI has 2 cores).
FULL_DTYPE_CASES = {
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single_uneven",
}
FEW_DTYPES = (torch.float32, torch.bfloat16, torch.int64)

# name -> (run, uses_reduce_op)
CASES = {
    "all_reduce": (_all_reduce, True),
    "all_reduce_async_future": (_all_reduce_async_future, True),
    "reduce": (_reduce, True),
    "broadcast": (_broadcast, False),
    "all_gather": (_all_gather, False),
    "all_gather_into_tensor": (_all_gather_into_tensor, False),
    "all_gather_into_tensor_inplace": (_all_gather_into_tensor_inplace, False),
    "reduce_scatter": (_reduce_scatter, True),
    "reduce_scatter_tensor": (_reduce_scatter_tensor, True),
    "reduce_scatter_tensor_inplace": (_reduce_scatter_tensor_inplace, True),
    "all_to_all_single_uneven": (_all_to_all_single_uneven, False),
    "all_to_all_single_even": (_all_to_all_single_even, False),
    "all_to_all": (_all_to_all, False),
    "all_to_all_uneven": (_all_to_all_uneven, False),
    "gather": (_gather, False),
    "scatter": (_scatter, False),
    "all_reduce_coalescing_manager": (_all_reduce_coalesced_manager, True),
}


def expected_refusal(name: str, dtype: torch.dtype, op_name: str) -> bool:
    """Whether Gloo refuses this combination (then delaycomm must refuse it in the same words)."""
    if name == "all_to_all_uneven":
        return True
    return op_name == "avg" and not dtype.is_floating_point  # Gloo's AVG divides in place


def run_case(name, group, rank, world, dtype, op):
    """Run one case; returns ("ok", [tensors]) or ("error", message)."""
    fn, _ = CASES[name]
    try:
        return "ok", fn(group, rank, world, dtype, op)
    except Exception as e:  # noqa: BLE001 - compared against Gloo's behaviour
        return "error", f"{type(e).__name__}: {e}"


def compare_case(name: str, rank: int, world: int, dc_group, gloo_group, dtypes=DTYPES) -> list[str]:
    """Run one case over its dtypes and reduce ops on both groups; return the differences (empty: all equal).

    A combination Gloo refuses (:func:`expected_refusal`) must be refused by both groups with the same message;
    every other combination must succeed on both and give the same tensors, bit for bit.
    """
    _, uses_op = CASES[name]
    ops = REDUCE_OPS.items() if uses_op else [("-", R.SUM)]
    problems = []
    for dtype in dtypes if name in FULL_DTYPE_CASES else [d for d in dtypes if d in FEW_DTYPES]:
        for op_name, op in ops:
            ref_status, ref = run_case(name, gloo_group, rank, world, dtype, op)
            got_status, got = run_case(name, dc_group, rank, world, dtype, op)
            where = f"{name} {dtype} {op_name}"
            want = "error" if expected_refusal(name, dtype, op_name) else "ok"
            if (ref_status, got_status) != (want, want):
                problems.append(
                    f"{where}: expected {want} from both, got gloo {ref_status} "
                    f"({ref if ref_status == 'error' else 'ok'}), delaycomm {got_status} "
                    f"({got if got_status == 'error' else 'ok'})"
                )
                continue
            if want == "error":
                if ref != got:
                    problems.append(f"{where}: refused in other words: gloo {ref!r}, delaycomm {got!r}")
                continue
            if len(ref) != len(got):
                problems.append(f"{where}: {len(ref)} outputs from gloo, {len(got)} from delaycomm")
                continue
            for i, (a, b) in enumerate(zip(ref, got)):
                if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
                    problems.append(f"{where}: output {i} differs: gloo {a.tolist()} delaycomm {b.tolist()}")
    return problems
