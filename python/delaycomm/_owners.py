"""The owners of gradient reductions, as staleness recognises them (docs/staleness.md, "Which reductions go stale").

A reduction may go stale only when delaycomm can prove whose gradients it carries and how its result is consumed.
Its owner tells: DDP's reducer and its buckets (:mod:`delaycomm._ddp`), FSDP1's flat parameters and FSDP2's parameter
groups (:mod:`delaycomm._fsdp`). Each owner's code path is wrapped (:func:`patch`) so that, while it reduces one set
of gradients, the calling thread is marked with a *scope* naming the stream (in rank-invariant terms: the owner's
ordinal in program order, the bucket, the parameters) and its *consumer*: the parameters the result lands on, and how
:func:`delaycomm.flush` puts a pending contribution there. The native side (``stale/Owners.hpp``) keeps what C++ needs:
the consumers' parameters, the scopes, DDP's bucket layouts.

The optimizer's own events enforce the rule (docs/staleness.md, "The rule": a contribution is applied iff its own
step's gradient is applied, with the factor its own step applied it with): torch's global optimizer step post hook
(a step consumed each parameter whose ``.grad`` was not None, and skipped the others), ``GradScaler.step`` (a step it
skipped: the optimizer did not step, or found an inf), ``zero_grad`` with no step since the last one (the gradients
were thrown away), and ``GradScaler.scale`` (the loss scale the next gradients are computed at). A recognised stream
whose last result none of these resolved before it is reduced again is kept fresh (a GAN's discriminator, reduced
for real and fake batches and again in the generator's backward; two backward passes per step).

NOTE: the hook points are private torch functions. :func:`patch` warns once, naming the one it did not find, and
then wraps nothing there: what it would have recognised has no owner, so it is kept fresh with its delay, never made
stale unrecognised. tests/stale run the real DDP, FSDP1 and FSDP2, so a torch release that renames one fails there.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from delaycomm import _C

__all__ = [
    "Consumer",
    "consumer_of",
    "consumers",
    "ordinal",
    "patch",
    "warn_missing",
    "warn_unrecognised",
    "install",
    "runs",
    "reduction_scope",
]

_lock = threading.Lock()
# consumer id -> Consumer, in registration order (program order: the same on every rank).
_consumers: dict[int, Consumer] = {}
_ordinals: dict[str, weakref.WeakKeyDictionary] = {}
_counters: dict[str, int] = {}
_warned: set[str] = set()
_installed = False


class Consumer:
    """The parameters one stream's result lands on, and how a pending contribution of that stream is put there.

    Subclasses know their owner's layout: :meth:`grads` turns the stream's flushed tensor (what its next steps would
    have delivered to this rank: the all-reduce's sum, or this rank's reduce-scatter shard) into a gradient per
    parameter, consumed as the owner consumes the stream's result.
    """

    # The group whose reduce-scatter replica_reduce follows (HSDP, HYBRID_SHARD), by name.
    shard_group_name: str | None = None

    def __init__(self, params: list[torch.Tensor], name: str, applies: bool = True):
        self.name = name
        self.applies = applies
        self._params = [weakref.ref(p) for p in params]
        self.id = _C._stale_consumer(list(params))
        with _lock:
            _consumers[self.id] = self

    def set_ranges(self, ranges: list[list[tuple[int, int]]]) -> None:
        """Each parameter's elements ``[(offset, numel), ...]`` in the stream's tensor: a step skipped for some of
        the parameters only (``.grad`` None) then applies the rule to their elements (else the stream is kept
        fresh)."""
        _C._stale_consumer_ranges(self.id, ranges)

    def params(self) -> list[torch.Tensor]:
        """The live parameters (those whose tensor died are left out)."""
        return [p for p in (r() for r in self._params) if p is not None]

    def alive(self) -> bool:
        return all(r() is not None for r in self._params)

    def grads(self, flat: torch.Tensor, scatter: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(parameter, gradient) pairs for the stream's flushed tensor ``flat``."""
        raise NotImplementedError

    def replica_reduce(self, flat: torch.Tensor | None) -> torch.Tensor | None:
        """HSDP, HYBRID_SHARD: all-reduce a flushed shard across the replicas, as the owner does after its
        reduce-scatter (collective; ``flat`` None: nothing pending here, a zero shard). None when not needed."""
        return None

    def add_to_grad(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        """Add ``grad`` to ``param.grad`` (creating it), as the owner accumulates a reduced gradient."""
        if param.grad is None:
            param.grad = grad.clone()
        else:
            param.grad.add_(grad)


def back_to_back(numels: list[int], rows: int = 1) -> list[list[tuple[int, int]]]:
    """Each parameter's ranges in a tensor of ``rows`` rows, each row the parameters' ``numels`` back to back."""
    total = sum(numels)
    ranges, offset = [], 0
    for n in numels:
        ranges.append([(r * total + offset, n) for r in range(rows)])
        offset += n
    return ranges


def consumer_of(consumer_id: int) -> Consumer | None:
    with _lock:
        return _consumers.get(consumer_id)


def consumers() -> list[Consumer]:
    """Every consumer registered, in registration order."""
    with _lock:
        return list(_consumers.values())


def ordinal(kind: str, obj: Any) -> int:
    """``obj``'s ordinal among the ``kind`` objects seen so far, in the order first seen (program order: the same on
    every rank running the same program)."""
    with _lock:
        table = _ordinals.setdefault(kind, weakref.WeakKeyDictionary())
        n = table.get(obj)
        if n is None:
            n = table[obj] = _counters.get(kind, 0)
            _counters[kind] = n + 1
        return n


def runs(indices: list[int]) -> str:
    """Ordinals as runs: [5, 4, 3, 1] -> '5-3,1'."""
    parts: list[str] = []
    i = 0
    while i < len(indices):
        j = i
        step = 0
        if i + 1 < len(indices) and abs(indices[i + 1] - indices[i]) == 1:
            step = indices[i + 1] - indices[i]
            while j + 1 < len(indices) and indices[j + 1] - indices[j] == step:
                j += 1
        parts.append(str(indices[i]) if j == i else f"{indices[i]}-{indices[j]}")
        i = j + 1
    return ",".join(parts)


def warn_once(key: str, message: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


_WHERE = 'See docs/staleness.md, "Which reductions go stale"'


def warn_missing(where: str, what: str) -> None:
    """Warn once that the torch hook point ``where`` is not in this torch: ``what`` cannot be recognised, and its
    reductions are kept fresh with their delay (the safe side)."""
    warn_once(
        where,
        f"delaycomm: {where} is not in this torch ({torch.__version__}): {what} cannot be recognised, so those "
        f"reductions are kept fresh (delayed as under bsp, never stale). {_WHERE}",
    )


def warn_unrecognised(what: str, error: Exception) -> None:
    """Warn once that ``what`` could not be read from torch's private state (``error``: a torch release changed
    it); its reductions are kept fresh with their delay (the safe side)."""
    warn_once(
        f"unrecognised {what}",
        f"delaycomm: {what} cannot be recognised in this torch ({torch.__version__}): "
        f"{type(error).__name__}: {error}; so those reductions are kept fresh (delayed as under bsp, never stale). "
        f"{_WHERE}",
    )


def _qualname(owner: Any) -> str:
    """``torch.nn.parallel.distributed.DistributedDataParallel`` for a class, the module's name for a module."""
    if isinstance(owner, types.ModuleType):
        return owner.__name__
    return f"{owner.__module__}.{owner.__qualname__}"


def patch(owner: Any, name: str, make: Callable[[Callable], Callable], what: str) -> bool:
    """Replace ``owner.name`` by ``make(original)`` once; warn once and leave it alone when torch has no such name.

    ``what``: what the hook point lets delaycomm recognise, for the warning (those reductions are then kept fresh,
    with their delay). Returns whether the hook point is in place.
    """
    original = getattr(owner, name, None)
    if original is None:
        warn_missing(f"{_qualname(owner)}.{name}", what)
        return False
    if getattr(original, "__delaycomm_scoped__", False):
        return True
    wrapper = make(original)
    functools.update_wrapper(wrapper, original)
    wrapper.__delaycomm_scoped__ = True
    setattr(owner, name, wrapper)
    return True


_bare_consumers: dict[str, int] = {}


@contextlib.contextmanager
def reduction_scope(name: str):
    """The scope FSDP reduces one parameter group's gradients in, for tests and tools that issue such a reduction
    themselves: its first reduction is the stream ``name``, an all-reduce after a stale reduce-scatter in it is the
    replicas' (kept fresh). Its consumer has no parameters, so the runtime check passes at every call (nothing for an
    optimizer to consume) and flush() applies nothing (its sums are in flush()'s dict)."""
    with _lock:
        cid = _bare_consumers.get(name)
    if cid is None:
        cid = _C._stale_consumer([])
        with _lock:
            _bare_consumers[name] = cid
    _C._stale_scope_enter("fsdp", name, -1, cid)
    try:
        yield
    finally:
        _C._stale_scope_exit()


# The parameters of each optimizer (count, list), refreshed when the count changes.
_optimizer_params: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Post hooks seen per optimizer (GradScaler.step tells from it whether the optimizer stepped).
_step_events: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _params_of(optimizer) -> list[torch.Tensor]:
    n = sum(len(g["params"]) for g in optimizer.param_groups)
    cached = _optimizer_params.get(optimizer)
    if cached is None or cached[0] != n:
        cached = (n, [p for g in optimizer.param_groups for p in g["params"]])
        _optimizer_params[optimizer] = cached
    return cached[1]


# GradScaler.step running on this thread: the optimizer's step is recorded once the scaler's found_inf is known.
_in_scaler = threading.local()


def _stepped(optimizer, args, kwargs) -> None:
    # torch.optim steps a parameter only when its .grad is not None: the others' step is skipped. A parameter with
    # no elements here has nothing to consume: FSDP1 with use_orig_params=True leaves each parameter outside this
    # rank's shard empty, its .grad None by design, on some ranks and not on others; counted as skipped it would
    # keep its stream fresh on those ranks alone, and the ranks would disagree on who is late.
    consumed, skipped = [], []
    for p in _params_of(optimizer):
        (consumed if p.grad is not None or p.numel() == 0 else skipped).append(p)
    with _lock:
        _step_events[optimizer] = _step_events.get(optimizer, 0) + 1
    if getattr(_in_scaler, "optimizer", None) is optimizer:
        _in_scaler.step = (consumed, skipped)
    else:
        _C._stale_optimizer_stepped(consumed, skipped)


def _found_inf(scaler, optimizer) -> bool:
    state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer), {})
    return bool(sum(float(v.item()) for v in state.get("found_inf_per_device", {}).values()))


_scalers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SCALE_WHAT = 'the loss scale of a GradScaler subclass (docs/staleness.md, "The rule")'


def _wrap_scale_of(cls) -> None:
    """Wrap ``scale`` and ``update`` of ``cls`` and of the classes it inherits from (a subclass such as FSDP1's
    ShardedGradScaler overrides them)."""
    for klass in cls.__mro__:
        for name in ("scale", "update"):
            if name in vars(klass):
                patch(klass, name, _scaler_scale, _SCALE_WHAT)


def _scaler_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _wrap_scale_of(type(self))

    return __init__


def _scaler_step(original):
    def step(self, optimizer, *args, **kwargs):
        _wrap_scale_of(type(self))  # a scaler made before delaycomm was installed
        if not getattr(self, "_enabled", False):
            return original(self, optimizer, *args, **kwargs)
        outer = getattr(_in_scaler, "optimizer", None)
        _in_scaler.optimizer, _in_scaler.step = optimizer, None
        try:
            out = original(self, optimizer, *args, **kwargs)
            took = _in_scaler.step
        finally:
            _in_scaler.optimizer, _in_scaler.step = outer, None
        # An optimizer that takes the scaler's found_inf itself (_step_supports_amp_scaling) is stepped always and
        # skips inside: found_inf tells.
        if took is None or _found_inf(self, optimizer):
            _C._stale_optimizer_skipped(_params_of(optimizer))
        else:
            _C._stale_optimizer_stepped(*took)
        return out

    return step


def _scaler_scale(original):
    """GradScaler.scale and .update: the scale the next gradients are computed at (and flush delivers at: the one
    the next GradScaler.step unscales by)."""

    def scale(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if getattr(self, "_enabled", False) and getattr(self, "_scale", None) is not None:
            # NOTE: one host read per call (a synchronisation on CUDA; GradScaler.step makes one anyway).
            _C._stale_set_loss_scale(float(self._scale.item()))
            with _lock:
                if self not in _scalers:  # gone, its scale goes with it: the gradients after it are unscaled
                    _scalers[self] = weakref.finalize(self, _C._stale_set_loss_scale, 1.0)
        return out

    return scale


def _optimizer_zero_grad(original):
    def zero_grad(self, *args, **kwargs):
        _C._stale_grads_discarded(_params_of(self))
        return original(self, *args, **kwargs)

    return zero_grad


def _module_zero_grad(original):
    def zero_grad(self, *args, **kwargs):
        _C._stale_grads_discarded(list(self.parameters()))
        return original(self, *args, **kwargs)

    return zero_grad


def install(check: bool = False) -> None:
    """Install the optimizer hooks once (the owners' hook points: delaycomm._ddp.install, _fsdp.install); ``check``:
    the conservation check's too (stale_check, delaycomm._stalecheck)."""
    global _installed
    if check:
        from delaycomm import _stalecheck

        _stalecheck.install()
    if _installed:
        return
    _installed = True
    import importlib

    # NOTE: torch.optim deletes its submodules' names from its namespace; the module itself stays importable.
    optim = importlib.import_module("torch.optim.optimizer")
    register = getattr(optim, "register_optimizer_step_post_hook", None)
    if register is None:
        warn_once(
            "optimizer",
            "delaycomm: torch.optim.optimizer.register_optimizer_step_post_hook is not in this torch "
            f"({torch.__version__}): optimizer steps cannot be seen, so every recognised gradient stream fails the "
            'runtime check and is kept fresh (docs/staleness.md, "The runtime check")',
        )
    else:
        register(_stepped)
    what = 'a step GradScaler skipped and its loss scale (docs/staleness.md, "The rule")'
    try:
        scaler = importlib.import_module("torch.amp.grad_scaler").GradScaler
    except (ImportError, AttributeError):
        warn_missing("torch.amp.grad_scaler.GradScaler", what)
    else:
        patch(scaler, "step", _scaler_step, what)
        patch(scaler, "__init__", _scaler_init, what)
        _wrap_scale_of(scaler)
    patch(optim.Optimizer, "zero_grad", _optimizer_zero_grad, "gradients thrown away by zero_grad with no step")
    patch(torch.nn.Module, "zero_grad", _module_zero_grad, "gradients thrown away by zero_grad with no step")
