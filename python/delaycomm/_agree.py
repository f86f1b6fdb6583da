"""The ranks of a new delaycomm group agree on the options that must match, or every rank fails (docs/config.md).

When a group is created, every rank publishes its effective options (those marked ``must_match`` in
``delaycomm._config.OPTIONS``, each as a canonical key; a trace file by its content) through the group's store,
and compares its digest with rank 0's. The verdict is shared, so either every rank goes on or every rank raises
the same ``ValueError`` naming each differing option with each rank's value. A rank whose own options were
rejected publishes that error, so the others fail at once with it instead of waiting. Every wait is bounded by
the group's timeout and ends in ``torch.distributed.DistStoreError`` naming the ranks that did not answer.

Keys live under ``delaycomm/config/<attempt>/`` of the group's store (torch gives each group its own prefix;
``<attempt>`` is torchrun's ``TORCHELASTIC_RESTART_COUNT``, 0 outside torchrun). A restarted attempt can share the
store with the attempt before it (torchrun's agent store), so it never reads that attempt's keys. A generation
number drawn from a counter keeps a re-created group that reuses the store (a re-init in the same attempt) away
from the keys of the group before it; the last rank through removes the generation's keys. :func:`agree` returns
``<attempt>.<generation>``, the same on every rank once they agree, for the group's other keys (its inner Gloo's
rendezvous, the staleness agreement): stale keys there would pair a rank with a peer that no longer exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from delaycomm._config import OPTIONS, Delay, EffectiveConfig, format_value, parse_delay, shorten

__all__ = ["agree", "canonical_options"]

_PREFIX = "delaycomm/config/"
EXEMPT = tuple(o.name for o in OPTIONS if not o.must_match)


def _delay_key(value: str) -> tuple[str, str]:
    """The delay distribution as a key (its solved parameters; a trace or a profile by content), and how to show
    it. ``value``: the option's value (``_config.Delay``: its parsed spec, read once when the option was), or a
    spec's text (parsed here)."""
    spec = value.spec if isinstance(value, Delay) else parse_delay(value).spec
    if spec.digest is not None:  # trace:FILE, profile:FILE: the content, not the path
        return json.dumps([spec.family, spec.digest]), f"{value} (content {spec.digest})"
    params = {k: f"{v:.12g}" for k, v in sorted(spec.describe()["parameters"].items())}
    return json.dumps([spec.family, params]), str(value)


def canonical_options(cfg: EffectiveConfig, members: list[int]) -> dict[str, dict[str, str]]:
    """Option name -> {"key", "shown", "origin"} for each option that must match across ranks.

    ``key`` compares values (equal keys: the same effective value in this group), ``shown`` is the value for
    people, ``origin`` where it came from. ``members`` are the group's global ranks: ``delay_ranks`` and
    ``slowdown`` name global ranks, so their key is what they do to this group's members (``all`` and ``0,1`` are
    one value in the group of ranks 0 and 1).
    """
    out = {}
    for opt in OPTIONS:
        if not opt.must_match:
            continue
        value = cfg.values[opt.name]
        shown = format_value(opt.name, value)
        if opt.name == "delay" and value != "none":
            key, shown = _delay_key(value)
        elif opt.name == "delay_ranks":
            key = json.dumps([r for r in members if value is None or r in value])
        elif opt.name == "slowdown":
            key = json.dumps([[r, f] for r, f in value if r in members])
        elif opt.name == "delay_mode" and value == "match" and opt.name in cfg.auto:
            # auto's match adds on cuda ops where an explicit match raises: not one value (_config._native_mode)
            key, shown = json.dumps("match (auto)"), "match (auto)"
        else:
            key = json.dumps(value)
        out[opt.name] = {
            "key": key,
            "shown": shorten(shown),
            "origin": cfg.origins.get(opt.name, cfg.sources[opt.name]),
        }
    return out


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2,5'; [3] -> 'rank 3'."""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(parts)


def _mismatch_message(group: str, global_ranks: list[int], payloads: list[dict[str, Any]]) -> str:
    lines = []
    for opt in OPTIONS:
        if not opt.must_match:
            continue
        entries = [p["options"][opt.name] for p in payloads]
        if len({e["key"] for e in entries}) == 1:
            continue
        by_value: dict[tuple[str, str, str], list[int]] = {}
        for r, e in zip(global_ranks, entries):
            by_value.setdefault((e["key"], e["shown"], e["origin"]), []).append(r)
        shown = "; ".join(
            f"{k[1]!r} on {_ranges(rs)} (from {k[2]})" for k, rs in sorted(by_value.items(), key=lambda kv: kv[1][0])
        )
        lines.append(f"  {opt.name}: {shown}")
    return (
        f"delaycomm: group {group!r}: the ranks give different values to options that must be the same on "
        f"every rank (every rank of the group raises this error):\n"
        + "\n".join(lines)
        + f"\ngive each of them one value on every rank (options that may differ per rank: {', '.join(EXEMPT)})"
    )


def _errors_message(group: str, errors: list[tuple[int, str]]) -> str:
    detail = "\n".join(f"  {_ranges([r])}: {e}" for r, e in errors)
    return (
        f"delaycomm: group {group!r} cannot be created: the options of {_ranges([r for r, _ in errors])} were "
        f"rejected (every rank of the group raises this error):\n{detail}"
    )


def agree(
    store: dist.Store,
    rank: int,
    size: int,
    timeout: timedelta,
    group: str,
    global_ranks: list[int],
    cfg: EffectiveConfig | None,
    error: ValueError | None,
) -> str:
    """Check with the other ranks of the group that the options which must match do; raise on every rank if not.

    Args:
        store: the group's store (torch's prefix store of this group).
        rank, size: this rank in the group and the group's size.
        timeout: the group's timeout; no wait here lasts longer.
        group: the group's name, for messages.
        global_ranks: the global rank of each rank of the group (messages name ranks by their global rank).
        cfg: this rank's effective options (None when ``error`` is set).
        error: the ValueError that rejected this rank's options, or None.

    Returns:
        This creation's generation, ``<attempt>.<n>``: the same on every rank of the group, and never one that an
        earlier creation over the same store (this attempt's or an earlier attempt's) used; ``<attempt>.0`` for a
        group of one rank, which has no peer to pair with.

    Raises:
        ValueError: this rank's ``error``; another rank's rejected options; options that differ across ranks.
        torch.distributed.DistStoreError: a rank did not answer within ``timeout``.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if size == 1:  # nothing to compare with
        if error is not None:
            raise error
        return f"{attempt}.0"  # no peer to read stale keys from
    payload: dict[str, Any] = {}
    if error is None:
        try:
            options = canonical_options(cfg, global_ranks)  # the parsed spec: its file is not read again
        except ValueError as e:
            error = e
        else:
            digest = hashlib.sha256(json.dumps({k: v["key"] for k, v in options.items()}, sort_keys=True).encode())
            payload = {"options": options, "digest": digest.hexdigest()}
    if error is not None:
        payload = {"error": str(error), "digest": ""}
    deadline = time.monotonic() + timeout.total_seconds()  # one timeout for the whole exchange
    s = dist.PrefixStore(f"{_PREFIX}{attempt}/", store)
    gen = (s.add("arrivals", 1) - 1) // size
    keys = [f"{gen}/{r}" for r in range(size)]
    s.set(keys[rank], json.dumps(payload))

    def wait(what: list[str], waiting_for: str) -> None:
        try:
            s.wait(what, timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except RuntimeError as e:  # TCPStore and HashStore raise DistStoreError, FileStore a RuntimeError
            if "timeout" not in str(e).lower():
                raise
            missing = [global_ranks[r] for r in range(size) if not s.check([keys[r]])]
            who = (
                f"{_ranges(missing)} to publish {'its' if len(missing) == 1 else 'their'} options"
                if missing
                else f"the other ranks to {waiting_for}"
            )
            raise dist.DistStoreError(
                f"delaycomm: group {group!r} rank {rank}: creating the group timed out after "
                f"{timeout.total_seconds():g} s (the group's timeout) waiting for {who}; a rank that never creates "
                "the group, or that failed before delaycomm's checks, leaves the others waiting"
            ) from None

    # Compare with rank 0's digest; the last rank to check publishes the verdict.
    wait([keys[0]], "publish their options")
    ok = error is None and json.loads(s.get(keys[0]))["digest"] == payload["digest"]
    s.add(f"{gen}/bad", 0 if ok else 1)
    if s.add(f"{gen}/checked", 1) == size:
        s.set(f"{gen}/verdict", "1")
    wait([f"{gen}/verdict"], "compare their options")
    failed = s.add(f"{gen}/bad", 0) > 0
    payloads = [json.loads(v) for v in s.multi_get(keys)] if failed else []
    # The last rank through removes the generation's keys. On a failure every rank raises as soon as it has read
    # what it needs, except group rank 0: it waits (bounded by the timeout) until every rank has, since it may host
    # the TCPStore (env://, tcp://, mp.spawn: global rank 0, which is group rank 0 of any group holding it), and a
    # store that vanishes while another rank still reads gives that rank a network error instead of this one.
    last = s.add(f"{gen}/done", 1) == size
    if last and failed:
        s.set(f"{gen}/released", "1")
    elif last:
        for k in keys + [f"{gen}/{n}" for n in ("bad", "checked", "verdict", "done")]:
            try:
                s.delete_key(k)
            except Exception:  # noqa: BLE001 - a store without delete_key keeps a few hundred bytes
                pass
    if not failed:
        return f"{attempt}.{gen}"
    if rank == 0:
        wait([f"{gen}/released"], "read the options")
    if error is not None:
        raise error
    errors = [(global_ranks[r], p["error"]) for r, p in enumerate(payloads) if "error" in p]
    if errors:
        raise ValueError(_errors_message(group, errors))
    raise ValueError(_mismatch_message(group, global_ranks, payloads))
