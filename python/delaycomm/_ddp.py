"""DDP as staleness sees it: the reducer's buckets, communication hooks and join() (docs/staleness.md, "Which
reductions go stale").

Each DDP module is an owner, named by its ordinal in program order (``DDP #0`` is the first DDP module a forward, a
hook registration or a join() shadow shows). Its streams are its buckets, named by the bucket and its parameters'
ordinals in the module (``DDP #1 bucket #0 (params 3-0)``), so two DDP modules never share a stream, whatever their
shapes.

- The reducer's default hook reduces from C++: :func:`install` wraps ``DistributedDataParallel._post_forward`` (where
  DDP prepares each backward round) to register the module's bucket layout (at its first forward and after DDP
  rebuilds its buckets) and mark each round; the native side then recognises the reducer's bucket reductions
  (``stale/Owners.hpp``).
- A communication hook (fp16/bf16 compression, PowerSGD, ``delaycomm.ddp_hook``, a user's) runs in its bucket's scope:
  ``register_comm_hook`` wraps the hook. The hook's first reduction of the bucket's size is the bucket's gradient; its
  other reductions, and whatever its callbacks issue, are kept fresh.
- ``join()``: a joined rank shadows the active ranks' backward pass (zero buckets through the same hook, and the
  used-parameter map) outside any backward pass; ``_match_all_reduce_for_bwd_pass`` and
  ``_match_unused_params_allreduce`` are wrapped so that those reductions are the same streams as the active ranks'.

:class:`BucketConsumer` puts a flushed bucket into its parameters' ``.grad``: the bucket holds its parameters'
gradients back to back in the bucket's order, as DDP copies them out. A hook's bucket is applied the same way when
the hook returns its reduced tensor as the bucket's gradient (torch's allreduce, fp16/bf16 compress and PowerSGD
hooks, ``delaycomm.ddp_hook``); another hook's pending bucket is returned by ``flush()`` but not applied.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref

import torch
import torch.distributed as dist

from delaycomm import _C, _owners

__all__ = ["install", "BucketConsumer"]


class BucketConsumer(_owners.Consumer):
    """One DDP bucket's parameters, back to back in the bucket's order."""

    def __init__(self, params: list[torch.Tensor], name: str, applies: bool = True):
        super().__init__(params, name, applies)
        self.numels = [p.numel() for p in params]
        self.set_ranges(_owners.back_to_back(self.numels))  # the rule per parameter (.grad None)

    def grads(self, flat, scatter):
        out, offset = [], 0
        for p, n in zip(self.params(), self.numels):
            out.append((p, flat[offset : offset + n].view_as(p).to(p.dtype)))
            offset += n
        return out


class _State:
    """delaycomm's view of one DDP module."""

    def __init__(self, ddp):
        self.id = _owners.ordinal("ddp", ddp)
        self.layout: list[tuple[list[torch.Tensor], int, torch.dtype, BucketConsumer]] | None = None
        self.rebuilt = False
        self.builtin_hook = None
        self.comm_hook = False  # a Python communication hook is registered
        self.hook_consumers: dict[tuple, BucketConsumer] = {}
        self.unrecognised = False  # join() without its shadow's hook points: the module's buckets stay fresh
        weakref.finalize(ddp, _C._stale_ddp_forget, self.id)


_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _state(ddp) -> _State:
    st = _states.get(ddp)
    if st is None:
        st = _states[ddp] = _State(ddp)
    return st


def _param_names(ddp, params) -> str:
    index = {id(p): i for i, p in enumerate(ddp.module.parameters())}
    return _owners.runs([index.get(id(p), -1) for p in params])


def _buckets(ddp) -> tuple[bool, list] | None:
    """Whether DDP has rebuilt its buckets (it does after the first step), and the reducer's buckets in its index
    order; None (warned once) where this torch's DDP lacks the private state delaycomm reads: its buckets are then
    not recognised (kept fresh)."""
    try:
        rebuilt = bool(ddp._has_rebuilt_buckets)
        buckets = ddp.reducer._get_zeros_like_grad_buckets()
    except AttributeError as e:
        _owners.warn_unrecognised("DDP's buckets (its reducer's bucket layout)", e)
        return None
    return rebuilt, [(list(b.parameters()), b.buffer(), int(b.index())) for b in buckets]


def _refresh(ddp, st: _State) -> None:
    """Register the module's current bucket layout (its reducer's index order)."""
    found = _buckets(ddp)
    if found is None:
        st.unrecognised = True
        st.layout = []
        return
    st.rebuilt, buckets = found
    layout = []
    for params, buf, index in buckets:
        name = f"DDP #{st.id} bucket #{index} (params {_param_names(ddp, params)})"
        layout.append((params, buf.numel(), buf.dtype, BucketConsumer(params, name)))
    st.layout = layout
    st.hook_consumers.clear()
    # Without the comm-hook hook points delaycomm cannot tell whether a hook replaced the reducer's own reduction.
    own = (
        not st.unrecognised
        and all(_in_place.get(name, False) for name in _COMM_HOOK_POINTS)
        and not st.comm_hook
        and st.builtin_hook in (None, dist.BuiltinCommHookType.ALLREDUCE)
    )
    _C._stale_ddp_layout(
        st.id,
        ddp.process_group.group_name,
        [(params, numel, dtype, c.name, c.id) for params, numel, dtype, c in layout],
        _dynamic_unused(ddp),
        own,
    )


def _dynamic_unused(ddp) -> bool:
    return bool(ddp.find_unused_parameters and not ddp.static_graph)


def _new_round(ddp) -> None:
    """Register the module's bucket layout when it is new or DDP rebuilt it, and mark a backward round."""
    st = _state(ddp)
    rebuilt_now = not st.unrecognised and not st.rebuilt and getattr(ddp, "_has_rebuilt_buckets", False)
    if st.layout is None or rebuilt_now:
        _refresh(ddp, st)
    _C._stale_ddp_round(st.id)


# Run with Dynamo off, it and all it calls (torch._disable_dynamo imports torch._dynamo at the first call, not here).
_new_round_eager = torch._disable_dynamo(_new_round)


def _post_forward(original):
    def post_forward(self, *args, **kwargs):
        if torch.compiler.is_compiling() and getattr(self, "_use_python_reducer", False):
            # Dynamo traces DDP's forward (compiled autograd: DDP's Python reducer reduces inside the compiled
            # backward, where its reductions are kept fresh): trace DDP's own code only, as without delaycomm.
            return original(self, *args, **kwargs)
        out = original(self, *args, **kwargs)
        _new_round_eager(self)
        return out

    _outside_dynamo.append(post_forward.__code__)
    return post_forward


# torch.compile (docs/staleness.md, "torch.compile"): a wrapper DDP's forward calls runs where Dynamo does not
# compile it, so that delaycomm adds no graph break: Dynamo skips its frame (its own work runs with Dynamo off) when
# DDP's forward calls it eagerly, as Dynamo treats DDP's own code, and traces through it where it traces DDP's forward.
_outside_dynamo: list = []
_dynamo_lock = threading.Lock()
_dynamo_waiting = False


def _skip_frames() -> None:
    from torch._dynamo.eval_frame import skip_code

    for code in _outside_dynamo:
        skip_code(code)


def _keep_out_of_dynamo() -> None:
    """Have Dynamo skip the wrappers' frames: now if torch._dynamo is imported (DDP's constructor imports it), else
    as soon as it is (importing it costs seconds that a job without DDP must not pay)."""
    global _dynamo_waiting
    from delaycomm._fsdp import _AfterImport

    with _dynamo_lock:
        if "torch._dynamo" not in sys.modules:
            if not _dynamo_waiting:
                _dynamo_waiting = True
                sys.meta_path.insert(0, _AfterImport("torch._dynamo", _skip_frames))
            return
    _skip_frames()


def _known_hook(hook) -> bool:
    """Whether ``hook`` returns its reduced tensor as the bucket's gradient (so flush can apply a pending bucket)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    from delaycomm import stale

    fn = hook.func if isinstance(hook, functools.partial) else hook
    return fn in (
        default_hooks.allreduce_hook,
        default_hooks.fp16_compress_hook,
        default_hooks.bf16_compress_hook,
        default_hooks._compress_hook,
        psgd.powerSGD_hook,
        psgd.batched_powerSGD_hook,
        stale.ddp_hook,
    )


def _hook_consumer(ddp, st: _State, bucket, known: bool) -> BucketConsumer:
    index, numel = int(bucket.index()), int(bucket.buffer().numel())
    key = (index, numel)
    c = st.hook_consumers.get(key)
    if c is None or not c.alive():
        layout = st.layout[index] if st.layout is not None and index < len(st.layout) else None
        params = layout[0] if layout is not None and layout[1] == numel else list(bucket.parameters())
        name = f"DDP #{st.id} bucket #{index} (comm hook, params {_param_names(ddp, params)})"
        c = st.hook_consumers[key] = BucketConsumer(params, name, applies=known)
    return c


def _scoped(hook, ddp):
    if getattr(hook, "__delaycomm_scoped__", False):
        return hook
    ref = weakref.ref(ddp)
    known = _known_hook(hook)

    @functools.wraps(hook)
    def scoped(state, bucket):
        module = ref()
        # The compiled-autograd reducer passes (grad, param) instead of a bucket: not recognised (kept fresh).
        st = _state(module) if module is not None and isinstance(bucket, dist.GradBucket) else None
        if st is None or st.unrecognised:
            return hook(state, bucket)
        c = _hook_consumer(module, st, bucket, known)
        _C._stale_scope_enter("ddp_hook", c.name, int(bucket.buffer().numel()), c.id, st.id, _dynamic_unused(module))
        try:
            return hook(state, bucket)
        finally:
            _C._stale_scope_exit()

    scoped.__delaycomm_scoped__ = True
    return scoped


def _register_comm_hook(original):
    def register_comm_hook(self, state, hook):
        out = original(self, state, _scoped(hook, self))
        st = _state(self)
        st.comm_hook = True
        if st.layout is not None:
            _refresh(self, st)  # the reducer's own reductions are the hook's from now on
        return out

    return register_comm_hook


def _register_builtin_comm_hook(original):
    def register_builtin_comm_hook(self, comm_hook_type):
        out = original(self, comm_hook_type)
        st = _state(self)
        st.builtin_hook = comm_hook_type
        if st.layout is not None:
            _refresh(self, st)
        return out

    return register_builtin_comm_hook


def _shadowing(new_round: bool):
    def make(original):
        def shadowing(self, *args, **kwargs):
            st = _state(self)
            if new_round:
                _C._stale_ddp_round(st.id)
            _C._stale_scope_enter("ddp_shadow", ddp=st.id)
            try:
                return original(self, *args, **kwargs)
            finally:
                _C._stale_scope_exit()

        return shadowing

    return make


_shadow_in_place = True


def _join(original):
    def join(self, *args, **kwargs):
        if not _shadow_in_place:
            # A joined rank's shadow would not be recognised: the ranks' stale bookkeeping would differ.
            st = _state(self)
            st.unrecognised = True
            if st.layout is not None:
                _refresh(self, st)
        return original(self, *args, **kwargs)

    return join


# DDP's hook points (DistributedDataParallel's attributes): name, wrapper, what they let delaycomm recognise.
# NOTE: tests/stale/test_hook_points.py renames entries here to stand for a torch release that renamed them.
HOOK_POINTS = [
    ("_post_forward", _post_forward, "DDP's buckets (its reducer's default hook)"),
    ("register_comm_hook", _register_comm_hook, "the buckets of DDP communication hooks (and so DDP's own buckets)"),
    (
        "_register_builtin_comm_hook",
        _register_builtin_comm_hook,
        "DDP's builtin communication hooks (and so DDP's own buckets)",
    ),
]
_COMM_HOOK_POINTS = ("register_comm_hook", "_register_builtin_comm_hook")
_SHADOW = "a joined rank's buckets under DDP's join() (a DDP module that joins keeps its buckets fresh)"
SHADOW_POINTS = [
    ("_match_all_reduce_for_bwd_pass", _shadowing(True), _SHADOW),
    ("_match_unused_params_allreduce", _shadowing(False), _SHADOW),
]
# Which hook points are in place (install()).
_in_place: dict[str, bool] = {}


def install() -> None:
    """Wrap DDP's hook points (once); a missing one warns once and leaves what it recognises fresh."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    global _shadow_in_place
    for name, make, what in HOOK_POINTS:
        _in_place[name] = _owners.patch(DDP, name, make, what)
    shadow = [_owners.patch(DDP, name, make, what) for name, make, what in SHADOW_POINTS]
    _shadow_in_place = all(shadow)
    _owners.patch(DDP, "join", _join, "DDP's join()")
    _keep_out_of_dynamo()
