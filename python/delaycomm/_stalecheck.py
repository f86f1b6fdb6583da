"""The conservation check (``stale_check=1``, docs/staleness.md, "The check"): nothing lost, nothing applied twice.

Per parameter, what the optimizer consumed over the run (each step's ``.grad``, unscaled, read by torch's global
optimizer step pre hook: only the steps taken fire it) plus what is pending (flush's gradients, unscaled) must equal
what bsp would have delivered: the sum over the ranks of every rank's fresh gradient of every step taken (the native
engine keeps each rank's share per stream, ``FlushStream::reference``; flush reduces them as it reduces the pending
contributions). Checked at every :func:`delaycomm.flush` (every rank raises alike) and at the first optimizer step
after a flush when nothing was reduced in between (the end of training: the step that applies what flush
delivered). Parameters of streams kept fresh, and parameters no optimizer holds, are outside it.

The reference is held in float64 on the gradients' device: one copy of each recognised stream per rank, plus one of
each stream's last fresh gradient; each step adds one pass over the gradients (docs/staleness.md, "The check", has the
measured cost).
"""

from __future__ import annotations

import gc
import threading
import warnings
import weakref

import torch

from delaycomm import _C

__all__ = ["install", "enabled", "check_flush"]

_lock = threading.Lock()
_installed = False
# id(param) -> (weak ref, consumed sum in float64, local)
_consumed: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
# After a flush: id(param) -> (weak ref, what bsp delivers, float64), and the reduction count at the flush.
_owed: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
_owed_at: int | None = None
_names: dict[int, str] = {}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _pre_step(optimizer, args, kwargs) -> None:
    with _lock:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = _local(p.grad).detach().to(torch.float64)
                entry = _consumed.get(id(p))
                if entry is None or entry[0]() is not p:
                    _consumed[id(p)] = (weakref.ref(p), g.clone())
                else:
                    entry[1].add_(g)


def _post_step(optimizer, args, kwargs) -> None:
    global _owed_at
    with _lock:
        if _owed_at is None:
            return
        if _C._stale_reductions() != _owed_at:
            _owed.clear()  # reduced since the flush: the next flush checks
            _owed_at = None
            return
        ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        owed = {k: v for k, v in _owed.items() if k in ids and v[0]() is not None}
        for k in owed:
            del _owed[k]
        if not _owed:
            _owed_at = None
        errors = _compare(owed, {})
    if errors:
        raise RuntimeError(_message(errors, "at the optimizer step after flush"))


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    import importlib

    optim = importlib.import_module("torch.optim.optimizer")
    optim.register_optimizer_step_pre_hook(_pre_step)
    optim.register_optimizer_step_post_hook(_post_step)


def enabled() -> bool:
    return _installed


def _rtol(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 2e-2)


def _compare(reference: dict, pending: dict) -> list[tuple[torch.Tensor, float, float]]:
    """(parameter, max error, tolerance) for each parameter that does not conserve."""
    errors = []
    for pid, (ref, want) in reference.items():
        p = ref()
        if p is None:
            continue
        entry = _consumed.get(pid)
        got = entry[1].clone() if entry is not None and entry[0]() is p else torch.zeros_like(want)
        if pid in pending:
            got = got + pending[pid]
        scale = float(want.abs().max()) if want.numel() else 0.0
        tol = _rtol(p.dtype) * max(scale, 1e-30) + 1e-300
        err = float((got - want).abs().max()) if want.numel() else 0.0
        if not err <= tol:
            errors.append((p, err, tol))
    return errors


def _name_of(p: torch.Tensor) -> str:
    """The parameter's name in the module that holds it (found among the live modules; only on failure)."""
    if not _names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance on torch's deprecated module proxies warns
            modules = [obj for obj in gc.get_objects() if isinstance(obj, torch.nn.Module)]
        for module in modules:
            try:
                named = list(module.named_parameters())
            except (AttributeError, RuntimeError):  # a module in the middle of construction
                continue
            for name, q in named:
                if id(q) not in _names or len(name) > len(_names[id(q)]):
                    _names[id(q)] = name
    return _names.get(id(p), f"<unnamed parameter of shape {tuple(p.shape)}>")


def _message(errors, where: str) -> str:
    _names.clear()
    parts = [f"'{_name_of(p)}' (max error {err:.3e} > {tol:.3e})" for p, err, tol in errors[:8]]
    more = f" and {len(errors) - 8} more" if len(errors) > 8 else ""
    return (
        f"delaycomm: stale_check {where}: what the optimizer consumed plus what is pending differs from what bsp "
        f"would have delivered for {len(errors)} parameter(s): {', '.join(parts)}{more}. A stale contribution was "
        'lost or applied twice, or at the wrong scale (docs/staleness.md, "The check")'
    )


def check_flush(references: dict, pending: dict, agree) -> None:
    """At flush: ``references`` {param: what bsp delivered (reduced, float64)}, ``pending`` {param: unscaled pending
    gradient}; ``agree(bad: bool) -> int``: how many ranks found an error (collective), so every rank raises."""
    global _owed_at
    ref = {id(p): (weakref.ref(p), _local(t).detach().to(torch.float64)) for p, t in references.items()}
    pend = {id(p): _local(t).detach().to(torch.float64) for p, t in pending.items()}
    with _lock:
        errors = _compare(ref, pend)
    bad = agree(bool(errors))
    if bad:
        raise RuntimeError(
            _message(errors, "at flush")
            if errors
            else f"delaycomm: stale_check at flush: {bad} other rank(s) found parameters that do not conserve "
            '(their error names them; docs/staleness.md, "The check")'
        )
    with _lock:
        _owed.clear()
        _owed.update(ref)
        _owed_at = _C._stale_reductions()
