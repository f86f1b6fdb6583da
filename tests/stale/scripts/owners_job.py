"""A user's training jobs on the paths where a stale gradient could land on the wrong parameters, run unmodified by
tests/stale/test_owners.py (docs/staleness.md, "Which reductions go stale").

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/stale/scripts/owners_job.py \
        --paths gan,two_ddp --out DIR [--steps N]

Each path trains small float64 models with plain SGD (no momentum) for --steps steps on a process group of its
own, then ends as the docs say a user ends under staleness: ``optimizer.zero_grad()``,
``delaycomm.flush(into_grad=True)``, one more ``optimizer.step()``. With SGD, what the optimizers consumed in all
is (parameters at the start - at the end) / lr, per parameter. The script also computes each rank's own gradient at
every step on a local copy of the models (its contribution: what the rank would have sent had nothing been late),
and writes DIR/<path>.rank<r>.pt: per parameter the consumed total and this rank's contributions, the stats of its
group(s), and what the path records besides. delaycomm is configured only through DELAYCOMM_* variables.

Paths (2 ranks unless noted):
  ckpt_ddp, ckpt_reentrant_ddp      DDP, one bucket per block, each block under torch.utils.checkpoint
                                    (use_reentrant False / True): identical blocks, identical buckets
  ckpt_fsdp1, ckpt_reentrant_fsdp1  FSDP1 (FULL_SHARD) with one unit per block, checkpointed
  ckpt_fsdp2, ckpt_reentrant_fsdp2  FSDP2 (fully_shard per block and the root), checkpointed
  fsdp1                             FSDP1 FULL_SHARD, one unit per block
  gan                               DCGAN's loop: DDP(G), DDP(D); D reduced for the real batch, the fake batch and in
                                    G's backward
  two_ddp                           two DDP models of the same shape on one group, one backward
  two_ddp_hook                      two DDP models of different shapes, both with delaycomm.ddp_hook
  counters                          DDP; a parameter hook all-reduces a float and an int64 counter
  two_opt                           DDP; two optimizers (the blocks, the head)
  two_bwd                           DDP; two backward passes (two micro-batches) per optimizer step
  cautograd                         DDP under compiled autograd: backward() inside a torch.compile'd step
  hybrid_fsdp1                      4 ranks: FSDP1 HYBRID_SHARD on a 2 x 2 mesh
  orig_fsdp1_<strategy>             FSDP1 with use_orig_params=True, a unit per block: noshard, full, grad_op
                                    (SHARD_GRAD_OP), hybrid (4 ranks: HYBRID_SHARD on a 2 x 2 mesh); the end
                                    also before a checkpoint every 5 steps, training going on after it
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from job_main import run_paths
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

import delaycomm

DIM_IN, HIDDEN, DIM_OUT, BATCH, LR = 8, 16, 4, 16, 0.05
CHECKPOINT_EVERY = 5


class Block(torch.nn.Module):
    def __init__(self, hidden: int, ckpt: str | None):
        super().__init__()
        self.lin = torch.nn.Linear(hidden, hidden)
        self.ckpt = ckpt

    def forward(self, x):
        if self.ckpt is None:
            return torch.tanh(self.lin(x))
        return checkpoint(lambda t: torch.tanh(self.lin(t)), x, use_reentrant=self.ckpt == "reentrant")


class Net(torch.nn.Module):
    def __init__(self, seed: int = 0, hidden: int = HIDDEN, ckpt: str | None = None, dim_in: int = DIM_IN):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Linear(dim_in, hidden)
        self.blocks = torch.nn.ModuleList([Block(hidden, ckpt) for _ in range(3)])
        self.head = torch.nn.Linear(hidden, DIM_OUT)
        self.double()

    def forward(self, x):
        h = torch.tanh(self.embed(x))
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def batches(rank: int, steps: int, micro: int = 1):
    gen = torch.Generator().manual_seed(1 + rank)
    torch.manual_seed(1234)
    teacher = torch.randn(DIM_IN, DIM_OUT, dtype=torch.float64)
    for _ in range(steps):
        x = torch.randn(micro * BATCH, DIM_IN, generator=gen, dtype=torch.float64)
        yield x, torch.tanh(x @ teacher)


def local_grads(ref: torch.nn.Module, full: list[torch.Tensor], loss_fn, *args) -> list[torch.Tensor]:
    """This rank's own gradient of ``loss_fn(ref, *args)`` at the parameters ``full``."""
    with torch.no_grad():
        for q, v in zip(ref.parameters(), full):
            q.copy_(v)
    ref.zero_grad(set_to_none=True)
    loss_fn(ref, *args).backward()
    return [q.grad.detach().clone() if q.grad is not None else torch.zeros_like(q) for q in ref.parameters()]


class Full:
    """The full parameters of a model, in its original parameters' order, whatever wraps it."""

    def __init__(self, model, kind: str, side):
        self.model, self.kind, self.side = model, kind, side

    def __call__(self) -> list[torch.Tensor]:
        if self.kind == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            with FSDP.summon_full_params(self.model):
                return [p.detach().clone() for p in self.model.parameters()]
        if self.kind == "fsdp2":
            out = []
            for p in self.model.parameters():
                local = p.to_local().detach().contiguous()  # dim-0 shards, even here (sizes divisible by 2)
                parts = [torch.empty_like(local) for _ in range(dist.get_world_size(self.side))]
                dist.all_gather(parts, local, group=self.side)  # a Gloo side group: no delay
                out.append(torch.cat(parts, dim=0))
            return out
        module = self.model.module if isinstance(self.model, DDP) else self.model
        return [p.detach().clone() for p in module.parameters()]


def _end(opts, paths_full: list[Full]) -> dict:
    """The user's end of training under staleness: zero_grad, flush into .grad, one more step."""
    for opt in opts:
        opt.zero_grad(set_to_none=True)
    result = delaycomm.flush(into_grad=True)
    for opt in opts:
        opt.step()
    return {"final": [f() for f in paths_full], "flushed_streams": len(result), "unapplied": list(result.unapplied)}


_STRATEGIES = {"noshard": "NO_SHARD", "full": "FULL_SHARD", "grad_op": "SHARD_GRAD_OP", "hybrid": "HYBRID_SHARD"}


def _wrap(kind: str, model: torch.nn.Module, group, mesh=None, path: str = ""):
    if kind == "ddp":
        cap = (HIDDEN * HIDDEN + HIDDEN) * 8 / 2**20  # one block per bucket
        return DDP(model, process_group=group, bucket_cap_mb=cap)
    if kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        kwargs = {"process_group": group} if mesh is None else {"device_mesh": mesh}
        strategy = ShardingStrategy.FULL_SHARD if mesh is None else ShardingStrategy.HYBRID_SHARD
        if path.startswith("orig_fsdp1_"):
            strategy = ShardingStrategy[_STRATEGIES[path.removeprefix("orig_fsdp1_")]]
            kwargs["use_orig_params"] = True
        return FSDP(
            model,
            device_id=torch.device("cpu"),
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            sharding_strategy=strategy,
            **kwargs,
        )
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")  # the path's own group (its stats are the path's)
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train_net(path: str, rank: int, steps: int) -> dict:
    """The single-model paths: checkpointing under DDP / FSDP1 / FSDP2, counters, two optimizers, two backwards."""
    kind = "fsdp1" if "fsdp1" in path else "fsdp2" if "fsdp2" in path else "ddp"
    ckpt = "reentrant" if "reentrant" in path else "plain" if path.startswith("ckpt") else None
    group = dist.new_group()
    side = dist.new_group(backend="gloo")
    mesh = None
    if path in ("hybrid_fsdp1", "orig_fsdp1_hybrid"):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("replicate", "shard"))
    if path == "cautograd":
        # Compiled autograd: DDP then reduces with its Python reducer, traced into the compiled backward.
        torch._dynamo.config.optimize_ddp = "python_reducer"
        torch._dynamo.config.compiled_autograd = True
    model = _wrap(kind, Net(ckpt=ckpt), group, mesh, path)
    ref = Net(ckpt=None)
    full = Full(model, kind, side)
    start = full()
    params = list(model.parameters())
    if path == "two_opt":
        opts = [torch.optim.SGD(params[:-2], lr=LR), torch.optim.SGD(params[-2:], lr=LR)]
    else:
        opts = [torch.optim.SGD(params, lr=LR)]
    contributed = [torch.zeros_like(p) for p in start]
    counters = []
    if path == "counters":
        fc = torch.zeros(3, dtype=torch.float64)
        ic = torch.zeros(1, dtype=torch.int64)

        def hook(grad):
            fc.fill_(rank + 1.0)
            ic.fill_(rank + 1)
            dist.all_reduce(fc, group=group)
            dist.all_reduce(ic, group=group)
            counters.append((fc.tolist(), ic.tolist()))

        model.module.head.weight.register_hook(hook)
    micro = 2 if path == "two_bwd" else 1
    net = model
    if path == "cautograd":

        @torch.compile(backend="aot_eager")
        def step_fn(x, y):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss

    # use_orig_params: the user's end also before each checkpoint, every CHECKPOINT_EVERY steps (training goes on
    # after it), so that flush(into_grad=True) has something pending at some of them whatever the draws.
    ends = [] if path.startswith("orig_fsdp1_") else None
    for step, (x, y) in enumerate(batches(rank, steps, micro)):
        if ends is not None and step > 0 and step % CHECKPOINT_EVERY == 0:
            ends.append(_end(opts, [])["flushed_streams"])
        for g, c in zip(local_grads(ref, full(), _step_loss, x, y, micro), contributed):
            c += g
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        if path == "cautograd":
            step_fn(x, y)
        else:
            for i in range(micro):  # a forward and a backward per micro-batch, each reduced
                _micro_loss(net, x, y, micro, i).backward()
        for opt in opts:
            opt.step()
    out = _end(opts, [full])
    if ends is not None:
        out["flushed_streams"] = sum(ends, out["flushed_streams"])
    out.update(
        start=start,
        consumed=[(a - b) / LR for a, b in zip(start, out.pop("final")[0])],
        contributed=contributed,
        counters=counters,
        stats=[delaycomm.stats(g) for g in _groups(group, mesh)],
    )
    if path == "cautograd":
        from torch._dynamo.utils import counters as dynamo_counters

        out["compiled_autograd_captures"] = int(dynamo_counters["compiled_autograd"]["captures"])
    return out


def _step_loss(m, x, y, micro: int):
    return sum(_micro_loss(m, x, y, micro, i) for i in range(micro))


def _mse(m, x, y):
    return F.mse_loss(m(x), y)


def _micro_loss(m, x, y, micro: int, i: int):
    n = x.shape[0] // micro
    return F.mse_loss(m(x[i * n : (i + 1) * n]), y[i * n : (i + 1) * n]) / micro


def _groups(group, mesh) -> list:
    if mesh is None:
        return [group]
    return [mesh.get_group(d) for d in mesh.mesh_dim_names]


def train_two(path: str, rank: int, steps: int) -> dict:
    """Two DDP models on one group, reduced in one backward pass; with ddp_hook, of different shapes."""
    group = dist.new_group()
    hook = path == "two_ddp_hook"
    a, b = Net(0), Net(1, hidden=24 if hook else HIDDEN)
    ref_a, ref_b = Net(0), Net(1, hidden=24 if hook else HIDDEN)
    models = [_wrap("ddp", a, group), _wrap("ddp", b, group)]
    if hook:
        for m in models:
            m.register_comm_hook(group, delaycomm.ddp_hook)
    fulls = [Full(m, "ddp", None) for m in models]
    start = [p for f in fulls for p in f()]
    opt = torch.optim.SGD([p for m in models for p in m.parameters()], lr=LR)
    contributed = [torch.zeros_like(p) for p in start]
    for x, y in batches(rank, steps):
        ga = local_grads(ref_a, fulls[0](), _mse, x, y)
        gb = local_grads(ref_b, fulls[1](), _mse, x, y)
        for g, c in zip(ga + gb, contributed):
            c += g
        opt.zero_grad(set_to_none=True)
        (F.mse_loss(models[0](x), y) + F.mse_loss(models[1](x), y)).backward()
        opt.step()
    out = _end([opt], fulls)
    final = [p for f in out.pop("final") for p in f]
    out.update(consumed=[(s - e) / LR for s, e in zip(start, final)], contributed=contributed)
    out["stats"] = [delaycomm.stats(group)]
    return out


def _d_loss(d, real, fake):
    bce = F.binary_cross_entropy_with_logits
    out_real, out_fake = d(real), d(fake)
    return bce(out_real, torch.ones_like(out_real)) + bce(out_fake, torch.zeros_like(out_fake))


def _g_loss(g, d, noise):
    out = d(g(noise))
    return F.binary_cross_entropy_with_logits(out, torch.ones_like(out))


def train_gan(rank: int, steps: int) -> dict:
    """DCGAN's loop (torch's examples/dcgan): D on the real batch, then on G's fake batch (detached), D's step; then
    G through D, G's step."""
    group = dist.new_group()
    g_net = torch.nn.Sequential(torch.nn.Linear(4, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, DIM_IN))
    d_net = torch.nn.Sequential(torch.nn.Linear(DIM_IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))
    torch.manual_seed(0)
    g_ref = torch.nn.Sequential(torch.nn.Linear(4, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, DIM_IN)).double()
    d_ref = torch.nn.Sequential(torch.nn.Linear(DIM_IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)).double()
    G, D = DDP(g_net.double(), process_group=group), DDP(d_net.double(), process_group=group)
    fulls = [Full(G, "ddp", None), Full(D, "ddp", None)]
    start = [p for f in fulls for p in f()]
    opt_g, opt_d = torch.optim.SGD(G.parameters(), lr=LR), torch.optim.SGD(D.parameters(), lr=LR)
    n_g = len(list(G.parameters()))
    contributed = [torch.zeros_like(p) for p in start]
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    gen = torch.Generator().manual_seed(7 + rank)
    for real, _ in batches(rank, steps):
        noise = torch.randn(BATCH, 4, generator=gen, dtype=torch.float64)
        ones, zeros = torch.ones(BATCH, 1, dtype=torch.float64), torch.zeros(BATCH, 1, dtype=torch.float64)
        # This rank's own D gradient (real + fake), then, after D's step, its own G gradient.
        with torch.no_grad():
            for q, v in zip(g_ref.parameters(), fulls[0]()):
                q.copy_(v)
        fake_ref = g_ref(noise).detach()
        gd = local_grads(d_ref, fulls[1](), _d_loss, real, fake_ref)
        for c, g in zip(contributed[n_g:], gd):
            c += g

        opt_d.zero_grad(set_to_none=True)
        bce(D(real), ones).backward()
        fake = G(noise)
        bce(D(fake.detach()), zeros).backward()
        opt_d.step()

        with torch.no_grad():
            for q, v in zip(d_ref.parameters(), fulls[1]()):
                q.copy_(v)
        gg = local_grads(g_ref, fulls[0](), _g_loss, d_ref, noise)
        for c, g in zip(contributed[:n_g], gg):
            c += g
        opt_g.zero_grad(set_to_none=True)
        bce(D(fake), ones).backward()
        opt_g.step()
    out = _end([opt_d, opt_g], fulls)
    final = [p for f in out.pop("final") for p in f]
    out.update(consumed=[(s - e) / LR for s, e in zip(start, final)], contributed=contributed, n_g=n_g)
    out["stats"] = [delaycomm.stats(group)]
    return out


def _train(path: str, rank: int, world: int, steps: int) -> dict:
    if path == "gan":
        return train_gan(rank, steps)
    if path.startswith("two_ddp"):
        return train_two(path, rank, steps)
    return train_net(path, rank, steps)


def main() -> None:
    run_paths(__doc__, 30, _train)


if __name__ == "__main__":
    main()
