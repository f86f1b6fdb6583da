"""FSDP1 and FSDP2 as staleness sees them (docs/staleness.md, "Which reductions go stale").

Each reduction of FSDP's gradients runs in an owner scope (``stale/Owners.hpp``):

- FSDP2 (``fully_shard``) reduces one parameter group's gradients in ``foreach_reduce`` (called by
  ``FSDPParamGroup.post_backward``): a reduce-scatter on the shard group, then under HSDP an all-reduce of the shard
  across the replicas. The stream is named by its FSDPParams' ordinals in program order and the first one's name
  (``FSDP2 params 2-3 (1.weight +1)``): two models never share one, whatever their module names; a group that reduces
  another set of gradients (a parameter without a gradient in some step) is another stream.
- FSDP1 (``FullyShardedDataParallel``) reduces one flat parameter's gradient in ``_reduce_grad`` (sharded
  strategies: a reduce-scatter, then under HYBRID_SHARD an all-reduce across the replicas) or ``_reduce_grad_no_shard``
  (NO_SHARD: an all-reduce). The stream is the flat parameter's (``FSDP1 flat parameter #0 (0.weight +1)``). A
  flat parameter with an FSDP communication hook is not recognised (kept fresh).

One stage of a reduction goes stale, not both: under HSDP and HYBRID_SHARD the all-reduce across replicas after a
stale reduce-scatter is kept fresh. Each consumer replays what FSDP does after the stage that went stale, so that
``flush()`` puts a pending shard where FSDP would have: the all-reduce across the replicas (when the reduce-scatter
was stale), the post-divide factor, the cast to the parameter's dtype, and the split into the parameters' shards.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys
import threading
import weakref

import torch
import torch.distributed as dist

from delaycomm import _C, _owners
from delaycomm._registry import backend_of

__all__ = ["install", "Fsdp2Consumer", "Fsdp1Consumer"]


def _replicas_allreduce(flat: torch.Tensor, group) -> None:
    """SUM-all-reduce a flushed shard across the replicas, as part of flush (no staleness, no delay) on a delaycomm
    group; as a plain all-reduce on another."""
    try:
        backend = backend_of(group)
    except ValueError:
        dist.all_reduce(flat, group=group)
        return
    backend.flush_allreduce(flat)


# ---------------------------------------------------------------------------------------------------------------
# FSDP2


class Fsdp2Consumer(_owners.Consumer):
    """One FSDP2 parameter group's reduction: its FSDPParams in order, and what foreach_reduce does after it."""

    def __init__(self, fsdp_params, world: int, args: dict, name: str):
        super().__init__([fp.sharded_param for fp in fsdp_params], name)
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll

        self._fsdp_params = [weakref.ref(fp) for fp in fsdp_params]
        self.world = world
        self.rs_group = args["reduce_scatter_group"]
        self.ar_group = args["all_reduce_group"]
        self.shard_group_name = getattr(self.rs_group, "group_name", None)
        self.orig_dtype = args["orig_dtype"]
        self.reduce_dtype = args["reduce_dtype"] or args["unsharded_grads"][0].dtype
        self.device = args["device"]
        _, self.postdivide, _, self.ar_op = coll._get_gradient_divide_factors(
            self.rs_group,
            self.ar_group,
            self.reduce_dtype,
            args["device"].type,
            args["gradient_divide_factor"],
            args.get("force_sum_reduction_for_comms", False),
        )
        self.shard_numels = [
            _padded_numel(fp, g, world) // world for fp, g in zip(fsdp_params, args["unsharded_grads"])
        ]
        self.scatter_stale = False  # its reduce-scatter went stale (HSDP: flush reduces it across the replicas)
        # The rule per parameter (.grad None): the reduce-scatter input is rank-major, each rank's row the
        # parameters' shards back to back.
        self.set_ranges(_owners.back_to_back(self.shard_numels, rows=world))

    def replica_reduce(self, flat):
        if self.ar_group is None or not self.scatter_stale:
            return None
        if flat is None:
            flat = torch.zeros(sum(self.shard_numels), dtype=self.reduce_dtype, device=self.device)
        _replicas_allreduce(flat, self.ar_group)
        if self.ar_op == dist.ReduceOp.AVG:
            flat.div_(self.ar_group.size())
        return flat

    def grads(self, flat, scatter):
        out = flat.clone()
        if self.postdivide is not None and self.postdivide != 1:
            out.div_(self.postdivide)
        if self.orig_dtype is not None:
            out = out.to(self.orig_dtype)
        result, offset = [], 0
        for ref, n in zip(self._fsdp_params, self.shard_numels):
            fp = ref()
            if fp is not None:
                local = torch.as_strided(out, fp.sharded_size, fp.contiguous_sharded_stride, offset).clone()
                result.append((fp.sharded_param, fp.to_sharded_dtensor(local)))
            offset += n
        return result


def _padded_numel(fsdp_param, grad: torch.Tensor, world: int) -> int:
    """The numel of the parameter's part of the reduce-scatter input (foreach_reduce pads dim 0 to the world size,
    after moving a Shard(d > 0) dimension's chunks to dim 0)."""
    size = list(grad.size())
    dim = fsdp_param.fsdp_placement.dim
    if world > 1 and dim != 0:
        size[dim] //= world
        size[0] *= world
    size[0] = math.ceil(size[0] / world) * world
    return math.prod(size)


def _names(fqns: list) -> str:
    """' (0.weight +1)': the first parameter's name and how many follow (for a stream's name)."""
    if not fqns or fqns[0] is None:
        return ""
    return f" ({fqns[0]}" + (f" +{len(fqns) - 1})" if len(fqns) > 1 else ")")


_FOREACH_REDUCE_ARGS = (
    "fsdp_params",
    "unsharded_grads",
    "reduce_scatter_group",
    "orig_dtype",
    "reduce_dtype",
    "device",
    "gradient_divide_factor",
    "all_reduce_group",
)
_fsdp2_consumers: dict[tuple, Fsdp2Consumer] = {}


def _fsdp2_consumer(args: dict) -> Fsdp2Consumer:
    fsdp_params, grads, rs_group = args["fsdp_params"], args["unsharded_grads"], args["reduce_scatter_group"]
    key = (
        tuple(id(fp) for fp in fsdp_params),
        tuple(tuple(g.shape) for g in grads),
        id(rs_group),
        id(args["all_reduce_group"]),
        args["orig_dtype"],
        args["reduce_dtype"],
        args["gradient_divide_factor"],
    )
    c = _fsdp2_consumers.get(key)
    if c is None or not c.alive():
        world = rs_group.size() if rs_group is not None else 1
        ordinals = [_owners.ordinal("fsdp2_param", fp) for fp in fsdp_params]
        name = f"FSDP2 params {_owners.runs(ordinals)}{_names([getattr(fp, '_param_fqn', None) for fp in fsdp_params])}"
        c = _fsdp2_consumers[key] = Fsdp2Consumer(fsdp_params, world, args, name)
    return c


def _foreach_reduce(original):
    params = list(inspect.signature(original).parameters)
    where = {name: params.index(name) for name in _FOREACH_REDUCE_ARGS}

    def foreach_reduce(*args, **kwargs):
        try:
            named = {n: kwargs[n] if n in kwargs else args[i] for n, i in where.items()}
            c = _fsdp2_consumer(named) if named["fsdp_params"] else None
        except (AttributeError, IndexError, KeyError, TypeError) as e:  # torch's private state changed
            _owners.warn_unrecognised("FSDP2's parameter groups", e)
            c = None
        if c is None:
            return original(*args, **kwargs)
        _C._stale_scope_enter("fsdp", c.name, -1, c.id)
        try:
            return original(*args, **kwargs)
        finally:
            c.scatter_stale = _C._stale_scope_exit() or c.scatter_stale

    return foreach_reduce


# ---------------------------------------------------------------------------------------------------------------
# FSDP1


class Fsdp1Consumer(_owners.Consumer):
    """One FSDP1 flat parameter's reduction, and what FSDP1 does after it."""

    def __init__(self, state, handle, sharded: bool, name: str):
        flat = handle.flat_param
        params = list(getattr(flat, "_params", None) or []) if handle._use_orig_params else []
        super().__init__(params or [flat], name)
        self._flat = weakref.ref(flat)
        self._handle = weakref.ref(handle)
        self.sharded = sharded
        self.hybrid = (
            sharded
            and getattr(state, "_inter_node_pg", None) is not None
            and handle._sharding_strategy.name
            in (
                "HYBRID_SHARD",
                "_HYBRID_SHARD_ZERO2",
            )
        )
        self.inter_node_pg = state._inter_node_pg if self.hybrid else None
        self.shard_group_name = getattr(state.process_group, "group_name", None)
        self.postdivide = state._gradient_postdivide_factor
        # The reduce-scatter's output: a chunk of the padded unsharded gradient (the flat parameter's shard).
        self.shard_numel = math.ceil(flat.grad.numel() / state.world_size) if flat.grad is not None else flat.numel()
        self.reduce_dtype = flat.grad.dtype if flat.grad is not None else flat.dtype  # FSDP reduces .grad's dtype
        self.device = flat.device  # a flush after the model died still takes part in the replicas' all-reduce
        self.scatter_stale = False

    def replica_reduce(self, flat):
        if not self.hybrid or not self.scatter_stale:
            return None
        if flat is None:
            flat = torch.zeros(self.shard_numel, dtype=self.reduce_dtype, device=self.device)
        _replicas_allreduce(flat, self.inter_node_pg)
        return flat

    def grads(self, flat, scatter):
        param = self._flat()
        if param is None:
            return []
        out = flat.clone()
        if self.postdivide is not None and self.postdivide != 1:
            out.div_(self.postdivide)
        return [(param, out.to(param.dtype).view_as(param))]

    def add_to_grad(self, param, grad):
        handle = self._handle()
        if handle is None or not handle._use_orig_params:
            super().add_to_grad(param, grad)
            return
        # use_orig_params: the optimizer sees the original parameters, whose .grad are views of the flat parameter's.
        # zero_grad(set_to_none=True) sets those to None, but FSDP1 keeps flat_param.grad (the last step's gradient)
        # until the next forward, and only then writes the original parameters' .grad back into it: a None .grad
        # zeroes its part, and when every one is None the flat gradient is dropped. Do that first, as the next
        # forward would, so that the flush adds to what the optimizer holds, not to the last step's gradient.
        handle._writeback_orig_params()
        handle._reset_flat_param_grad_info_if_needed()
        super().add_to_grad(param, grad)
        # Every original parameter that requires a gradient now has one (the pending contribution, zero where
        # nothing was pending), as after a backward pass (FSDP's post-backward resets the same mask).
        flat = handle.flat_param
        for i, p in enumerate(flat._params):
            if p.requires_grad:
                flat._is_grad_none_mask[i] = False
        handle._use_sharded_grad_views()


_fsdp1_consumers: dict[tuple, Fsdp1Consumer] = {}


def _fsdp1_consumer(state, handle, sharded: bool) -> Fsdp1Consumer:
    key = (id(handle), sharded)
    c = _fsdp1_consumers.get(key)
    if c is None or not c.alive():
        fqns = list(getattr(handle.flat_param, "_fqns", ()))
        name = f"FSDP1 flat parameter #{_owners.ordinal('fsdp1_handle', handle)}{_names(fqns)}"
        c = _fsdp1_consumers[key] = Fsdp1Consumer(state, handle, sharded, name)
    return c


def _reduce_grad(sharded: bool):
    def make(original):
        def reduce_grad(state, handle, *args, **kwargs):
            try:
                # A comm hook's reductions are not recognised.
                c = _fsdp1_consumer(state, handle, sharded) if state._comm_hook is None else None
            except (AttributeError, TypeError) as e:  # torch's private state changed
                _owners.warn_unrecognised("FSDP1's flat parameters", e)
                c = None
            if c is None:
                return original(state, handle, *args, **kwargs)
            _C._stale_scope_enter("fsdp", c.name, -1, c.id)
            try:
                return original(state, handle, *args, **kwargs)
            finally:
                c.scatter_stale = _C._stale_scope_exit() or c.scatter_stale

        return reduce_grad

    return make


# FSDP's hook points: module, function, wrapper, what they let delaycomm recognise.
# NOTE: tests/stale/test_hook_points.py renames entries here to stand for a torch release that renamed them.
HOOK_POINTS = [
    (
        "torch.distributed.fsdp._fully_shard._fsdp_param_group",
        "foreach_reduce",
        _foreach_reduce,
        "FSDP2's parameter groups",
    ),
    ("torch.distributed.fsdp._runtime_utils", "_reduce_grad", _reduce_grad(True), "FSDP1's sharded flat parameters"),
    (
        "torch.distributed.fsdp._runtime_utils",
        "_reduce_grad_no_shard",
        _reduce_grad(False),
        "FSDP1's NO_SHARD flat parameters",
    ),
]


def _foreach_reduce_usable(module) -> bool:
    """Whether FSDP2's foreach_reduce takes the arguments its consumer reads (warned once when not)."""
    original = getattr(module, "foreach_reduce", None)
    if original is None or getattr(original, "__delaycomm_scoped__", False):
        return True  # patch() warns when it is missing
    missing = [n for n in _FOREACH_REDUCE_ARGS if n not in inspect.signature(original).parameters]
    if missing:
        _owners.warn_missing(
            f"{module.__name__}.foreach_reduce's argument {', '.join(missing)}", "FSDP2's parameter groups"
        )
    return not missing


# The package whose import brings FSDP's hook points. Importing it costs about as much CPU as importing torch (5 to 6
# s of user time on the loaded 2-core VM), which a job that never uses FSDP must not pay: install() waits for it.
PACKAGE = "torch.distributed.fsdp"
_install_lock = threading.Lock()
_waiting = False


class _AfterImport:
    """A ``sys.meta_path`` entry that runs ``callback`` once, right after ``name`` has been imported (wherever that
    happens: the user's ``import``, or torch's own); it finds nothing itself, and leaves once used."""

    def __init__(self, name: str, callback) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None  # another import used it already
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec  # not a package torch ships: nothing to wrap, its reductions stay fresh
        exec_module = loader.exec_module

        def exec_then_callback(module):
            exec_module(module)
            self.callback()

        loader.exec_module = exec_then_callback  # this spec's loader only: the module keeps its own __loader__
        return spec


def install() -> None:
    """Wrap FSDP1's and FSDP2's gradient reductions (once): now if FSDP is imported, else as soon as it is. A
    missing hook point warns once and leaves its reductions fresh."""
    global _waiting
    with _install_lock:
        if PACKAGE not in sys.modules:
            if not _waiting:
                _waiting = True
                sys.meta_path.insert(0, _AfterImport(PACKAGE, _install_now))
            return
    _install_now()


def _install_now() -> None:
    for module_name, name, make, what in HOOK_POINTS:
        try:
            module = importlib.import_module(module_name)  # not under the lock: imports take module locks
        except ImportError:
            _owners.warn_missing(module_name, what)
            continue
        with _install_lock:  # two threads' groups (tests/harness/threads.py) must not wrap a hook point twice
            if name != "foreach_reduce" or _foreach_reduce_usable(module):
                _owners.patch(module, name, make, what)
