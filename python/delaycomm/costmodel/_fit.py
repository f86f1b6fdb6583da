"""The fit of :mod:`delaycomm.costmodel`: NCCL's choice per row and non-negative least squares, alternated."""

from __future__ import annotations

import math

import numpy as np

from delaycomm.costmodel import (
    _FASTEST,
    _SCALE,
    TERMS,
    CollectiveFit,
    Observation,
    _best,
    _candidates,
    _nnls,
    nccl,
)
from delaycomm.sources.ops import COLLECTIVES

_START = np.array([3.4e-6, 14e-6, 1 / 370e9, 1 / 50e9, 1 / 480e9, 25e-6])  # NCCL's defaults (nccl.NCCL_DEFAULTS)
# NVLink SHARP enters an all_reduce fit only where a table needs it: its rows on one node faster by this much than
# the ring of the same node's reduce_scatter/all_gather fit can be.
_NVLS_NEEDED = 1.10


def _alternate(obs: list[Observation], nvls: bool, fixed: dict[int, float], max_rounds: int, tuning=None):
    """Choose each row's (algorithm, protocol) under the terms, fit the free terms to those choices, until the
    choices repeat; the best terms seen, by the rows' RMS relative error."""
    cands = [_candidates(COLLECTIVES[o.collective], float(o.size), o.topology, nvls, tuning) for o in obs]
    t = np.array([o.seconds for o in obs])
    theta = _START.copy()
    for j, v in fixed.items():
        theta[j] = v
    free = np.array([j not in fixed for j in range(len(TERMS))])
    best = None
    seen: set[tuple] = set()
    for _ in range(max_rounds):
        chosen = [_best(c, theta) for c in cands]
        err = float(np.sqrt(np.mean((np.array([p for p, _, _ in chosen]) / t - 1.0) ** 2)))
        if best is None or err < best[0] - 1e-15:
            best = (err, theta.copy())
        key = tuple((i, j) for _, i, j in chosen)
        if key in seen:
            break
        seen.add(key)
        const = np.array([cands[r][i].entries[j][0] for r, (_, i, j) in enumerate(chosen)])
        vecs = np.array([cands[r][i].entries[j][1] for r, (_, i, j) in enumerate(chosen)])
        const = const + vecs[:, ~free] @ theta[~free]
        a = vecs / t[:, None] * _SCALE
        used = (np.abs(a).sum(axis=0) > 0) & free
        nxt = theta.copy()
        nxt[used] = _nnls(a[:, used], 1.0 - const / t) * _SCALE[used]
        theta = nxt
    return best[0], best[1], cands, t


def _plain(cands, i: int, theta: np.ndarray) -> np.ndarray:
    """The decisive entry of the row's ring/Simple candidate (its NVLS or point-to-point one where chosen)."""
    pick = cands[i]
    if pick.algorithm in ("ring", "tree"):
        pick = next((c for c in cands if c.algorithm == "ring" and c.protocol == "Simple"), pick)
    return pick.entries[pick.time(theta)[1]][1]


def _null_space(a: np.ndarray) -> np.ndarray:
    """The directions of the (scaled) terms that no row sees: rows of the returned matrix."""
    if a.shape[1] == 0:
        return np.zeros((0, 0))
    _u, s, vt = np.linalg.svd(a, full_matrices=True)
    tol = 1e-9 * (s[0] if len(s) else 1.0)
    rank = int(np.sum(s > tol))
    return vt[rank:]


def _reference_ring(fits: dict[str, CollectiveFit]) -> CollectiveFit | None:
    for name in ("reduce_scatter", "all_gather"):
        f = fits.get(name)
        if f is not None and f.bw_intra is not None and f.lat_intra is not None and not f.undetermined:
            return f
    return None


def fit_collective(
    name: str, obs: list[Observation], max_rounds: int, others: dict[str, CollectiveFit], tuning=None
) -> CollectiveFit:
    """One collective's terms; all_reduce adds NVLink SHARP where its one-node rows need it (module docstring)."""
    _, theta, cands, t = _alternate(obs, False, {}, max_rounds, tuning)
    assumed: dict[str, str] = {}
    ref = _reference_ring(others) if name == "all_reduce" else None
    one_node = [o for o in obs if o.topology.nodes == 1 and o.topology.gpus_per_node > 2]
    if ref is not None and one_node and theta[nccl.U_INTRA] > 0:
        if 1.0 / theta[nccl.U_INTRA] > _NVLS_NEEDED * ref.bw_intra:
            fixed = {nccl.U_INTRA: 1.0 / ref.bw_intra, nccl.LAT_INTRA: ref.lat_intra}
            _, theta, cands, t = _alternate(obs, True, fixed, max_rounds, tuning)
            why = f"the {ref.collective} fit: NCCL's rings are the same for every collective"
            assumed = {"bw_intra": why, "lat_intra": why}
    chosen = [_best(c, theta) for c in cands]
    rows = np.array([cands[r][i].entries[j][1] for r, (_, i, j) in enumerate(chosen)])
    used = np.abs(rows).sum(axis=0) > 0
    for term in assumed:
        used[TERMS.index(term)] = True
    # Which terms the rows determine is judged on NCCL's ring/Simple (or NVLS) form of each row: a mix of algorithms
    # and protocols at one scale weighs the links differently only through NCCL's constants.
    plain = np.array([_plain(c, i, theta) for c, (_, i, _) in zip(cands, chosen)])
    free = used.copy()
    for term in assumed:
        free[TERMS.index(term)] = False
    null = _null_space(plain[:, free] / t[:, None] * _SCALE[free])
    undetermined = np.zeros((null.shape[0], len(TERMS)))
    undetermined[:, free] = null
    for j in np.flatnonzero(free & (theta <= 0)):
        if TERMS[j].startswith("bw"):  # no row is slowed by it: as unknown as a direction no row sees
            undetermined = np.vstack([undetermined, np.eye(len(TERMS))[j]])
    vals: list[float | None] = []
    for j, term in enumerate(TERMS):
        if not used[j]:
            vals.append(None)
        elif term.startswith("lat"):
            vals.append(float(theta[j]))
        else:
            vals.append(1.0 / theta[j] if theta[j] > 0 else _FASTEST)
    pred = np.array([p for p, _, _ in chosen])
    return CollectiveFit(
        name,
        vals[0],
        vals[1],
        vals[2],
        vals[3],
        len(obs),
        float(np.sqrt(np.mean((pred / t - 1.0) ** 2))),
        sorted({o.where.rsplit(":", 1)[0] for o in obs if o.where}),
        _bound(nccl.U_INTRA, cands, chosen, theta, used),
        _bound(nccl.U_NET, cands, chosen, theta, used),
        vals[4],
        vals[5],
        assumed=assumed,
        undetermined=[[round(float(x), 12) for x in v] for v in undetermined],
    )


def _bound(j: int, cands, chosen, theta: np.ndarray, used: np.ndarray) -> float | None:
    """For an inverse bandwidth never the bottleneck: the largest value that keeps it so in every row, as the
    smallest bandwidth (bytes/s) the measurements allow; None when no row prices it at all."""
    if used[j]:
        return None
    limit = math.inf
    for c, (tm, i, _) in zip(cands, chosen):
        for c0, v in c[i].entries:
            if v[j] > 0:
                rest = c0 + float(v @ theta) - v[j] * theta[j]
                limit = min(limit, max(tm - rest, 0.0) / v[j])
    if not math.isfinite(limit):
        return None
    return 1.0 / limit if limit > 0 else _FASTEST
