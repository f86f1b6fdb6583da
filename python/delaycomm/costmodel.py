"""A cost model of NCCL's collectives, fitted to measured tables and used to predict other scales (docs/costmodel.md).

Per collective, a call of ``S`` bytes (nccl-tests' ``size``) on ``n`` ranks over ``N`` nodes of ``g = n / N`` GPUs and
``k`` NICs each takes

    ring:  steps_intra * lat_intra + steps_inter * lat_inter + S * busfactor(n) / busbw(n, N)
    tree:  2 ((g - 1) lat_intra + ceil(log2 N) lat_inter) + 2 S / (0.9 busbw(n, N))     (all_reduce, N > 1)

NCCL's choice: the faster of the two. The step counts are NCCL's (src/graph/tuning.cc: a ring all_reduce has
``2 (n - 1)`` steps of which ``2 (N - 1)`` cross nodes; all_gather and reduce_scatter ``n - 1`` and ``N - 1``;
broadcast and reduce ``n`` and ``N``), the bus factors nccl-tests' (doc/PERFORMANCE.md), and the bus bandwidth is
that of the slowest link a ring crosses: ``bw_intra`` on one node, ``bw_net`` between nodes of one GPU, and
``min(bw_intra, min(k, g) bw_net)`` between nodes of several GPUs (a ring leaves each node once per channel: the
node's NICs carry one GPU's share). all_to_all, gather and scatter are sends to every peer at once (intra-node
peers over the node's links, the others through the NICs); sendrecv one flow per rank. The four terms
(``lat_intra``, ``lat_inter``, ``bw_intra``, ``bw_net``) are fitted per collective, by non-negative least squares on
the relative error of the time; a term no source shows is left unknown, and a prediction that needs it is refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from delaycomm.sources.ops import COLLECTIVES, Collective

__all__ = ["ModelError", "Topology", "Observation", "CollectiveFit", "CostModel", "fit", "load", "TERMS"]

TERMS = ("lat_intra", "lat_inter", "bw_intra", "bw_net")
_LINK = {
    "lat_intra": "the per-step latency of the links within a node",
    "lat_inter": "the per-step latency between nodes",
    "bw_intra": "the bus bandwidth within a node (NVLink/PCIe)",
    "bw_net": "the bus bandwidth between nodes (the network)",
}
_NEED = {
    "lat_intra": "a table of several GPUs per node",
    "lat_inter": "a table of several nodes",
    "bw_intra": "a table of several GPUs per node",
    "bw_net": "a table of several nodes",
}
TREE_EFFICIENCY = 0.9  # NCCL's tree bandwidth factor (src/graph/tuning.cc)
_RING_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
_PEER_OPS = ("alltoall", "gather", "scatter")


class ModelError(ValueError):
    """A fit or a prediction that cannot be made (the message says which term is missing and what would give it)."""


@dataclass(frozen=True)
class Topology:
    """``ranks`` ranks on ``nodes`` nodes of ``ranks / nodes`` GPUs each, with ``nics_per_node`` NICs (None: one per
    GPU, as rail-optimised GPU clusters are built)."""

    ranks: int
    nodes: int
    nics_per_node: int | None = None

    def __post_init__(self):
        if self.ranks < 1 or self.nodes < 1 or self.nodes > self.ranks or self.ranks % self.nodes:
            raise ModelError(
                f"topology: {self.ranks} ranks on {self.nodes} nodes (expected nodes in [1, ranks] dividing the ranks: "
                "the model assumes the same number of GPUs on every node)"
            )
        if self.nics_per_node is not None and self.nics_per_node < 1:
            raise ModelError(f"topology: nics_per_node is {self.nics_per_node} (expected >= 1)")

    @property
    def gpus_per_node(self) -> int:
        return self.ranks // self.nodes

    @property
    def nics_used(self) -> int:
        """The NICs of a node a collective's traffic spreads over: one per GPU at most."""
        return min(self.nics_per_node or self.gpus_per_node, self.gpus_per_node)

    def describe(self) -> str:
        nics = f", {self.nics_per_node} NICs per node" if self.nics_per_node else ""
        return f"{self.ranks} ranks on {self.nodes} node(s) of {self.gpus_per_node} GPU(s){nics}"


@dataclass(frozen=True)
class Observation:
    """One measured time: ``collective`` (nccl-tests' name) of ``size`` bytes (nccl-tests' size) on ``topology``."""

    collective: str
    size: int
    topology: Topology
    seconds: float
    where: str = ""


def _variants(c: Collective, size: float, t: Topology) -> list[list[np.ndarray]]:
    """The coefficient vectors over (lat_intra, lat_inter, 1/bw_intra, 1/bw_net) of a call: one list per algorithm
    (the call takes the fastest), each the candidates of its slowest link (it takes the slowest)."""
    n, nn, g, k = t.ranks, t.nodes, t.gpus_per_node, t.nics_used
    if n == 1:
        return [[np.zeros(4)]]
    name = c.name
    wire = size * c.bus_factor(n)

    def vec(li, le, ui=0.0, ue=0.0):
        return np.array([li, le, ui, ue], dtype=np.float64)

    def links(w_intra: float, w_net: float) -> list[tuple[float, float]]:
        if nn == 1:
            return [(w_intra, 0.0)]
        if g == 1:
            return [(0.0, w_net)]
        return [(w_intra, 0.0), (0.0, w_net)]

    if name in _RING_OPS:
        if name == "all_reduce":
            steps, inter = 2 * (n - 1), 2 * (nn - 1)
        elif name in ("all_gather", "reduce_scatter"):
            steps, inter = n - 1, nn - 1
        else:
            steps, inter = n, nn if nn > 1 else 0
        ring = [vec(steps - inter, inter, ui, ue) for ui, ue in links(wire, wire / k)]
        algos = [ring]
        if name == "all_reduce" and nn > 1:
            tw = 2.0 * size / TREE_EFFICIENCY
            lat = vec(2 * (g - 1), 2 * math.ceil(math.log2(nn)))
            algos.append([lat + vec(0, 0, ui, ue) for ui, ue in links(tw, tw / k)])
        return algos
    if name in _PEER_OPS:
        share = size / n  # one peer's part
        w_intra = share * (g - 1)
        w_net = share * (n - g) * (g / k if name == "alltoall" else 1.0)
        cands = []
        if g > 1:
            cands.append(vec(g - 1, n - g, w_intra, 0.0))
        if nn > 1:
            cands.append(vec(g - 1, n - g, 0.0, w_net))
        return [cands]
    # sendrecv: one flow per rank; between nodes the node's last GPU sends through one NIC.
    lat = vec(0, 1) if nn > 1 else vec(1, 0)
    return [[lat + vec(0, 0, ui, ue) for ui, ue in links(size, size)]]


def _evaluate(variants: list[list[np.ndarray]], theta: np.ndarray) -> tuple[float, int, int]:
    """The time (the fastest algorithm's slowest link) and which algorithm and link it is."""
    best = (math.inf, 0, 0)
    for a, cands in enumerate(variants):
        times = [float(v @ theta) for v in cands]
        j = int(np.argmax(times))
        if times[j] < best[0]:
            best = (times[j], a, j)
    return best


def _nnls(a: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """min |a x - b| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    _m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    for _ in range(iters):
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12 * max(1.0, np.abs(w).max()):
            break
        j = np.argmax(np.where(passive, -np.inf, w))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-300
        w = a.T @ (b - a @ x)
    return x


@dataclass
class CollectiveFit:
    """The fitted terms of one collective; a term None was not observed."""

    collective: str
    lat_intra: float | None
    lat_inter: float | None
    bw_intra: float | None
    bw_net: float | None
    rows: int
    rms_relative_error: float
    sources: list[str] = field(default_factory=list)
    # A bandwidth the sources never show as the bottleneck, only that it is at least this (bytes/s).
    bw_intra_min: float | None = None
    bw_net_min: float | None = None

    def _missing(self, j: int, where: str) -> ModelError:
        bound = (None, None, self.bw_intra_min, self.bw_net_min)[j]
        shown = f" (they show only that it is at least {bound * 1e-9:.1f} GB/s)" if bound else ""
        return ModelError(
            f"cost model: {where} needs {_LINK[TERMS[j]]} ({TERMS[j]}), which the sources of the "
            f"{self.collective} fit do not show{shown}: add {_NEED[TERMS[j]]}"
        )

    def theta(self, needed: Iterable[int], where: str) -> tuple[np.ndarray, set[int]]:
        """The terms as the model's unknowns (latencies, inverse bandwidths), and which of them are only bounds.

        Raises:
            ModelError: a needed term was neither fitted nor bounded.
        """
        vals = [self.lat_intra, self.lat_inter, self.bw_intra, self.bw_net]
        mins = [None, None, self.bw_intra_min, self.bw_net_min]
        out, bounded = np.zeros(4), set()
        for j in needed:
            if vals[j] is None and mins[j] is None:
                raise self._missing(j, where)
        for j in range(4):
            v = vals[j] if vals[j] is not None else mins[j]
            if vals[j] is None and mins[j] is not None:
                bounded.add(j)
            if v is not None:
                out[j] = v if j < 2 else (1.0 / v if v > 0 else 0.0)
        return out, bounded

    def as_dict(self) -> dict:
        return {
            "lat_intra_us": None if self.lat_intra is None else self.lat_intra * 1e6,
            "lat_inter_us": None if self.lat_inter is None else self.lat_inter * 1e6,
            "bw_intra_GBps": None if self.bw_intra is None else self.bw_intra * 1e-9,
            "bw_net_GBps": None if self.bw_net is None else self.bw_net * 1e-9,
            "bw_intra_min_GBps": None if self.bw_intra_min is None else self.bw_intra_min * 1e-9,
            "bw_net_min_GBps": None if self.bw_net_min is None else self.bw_net_min * 1e-9,
            "rows": self.rows,
            "rms_relative_error": self.rms_relative_error,
            "sources": self.sources,
        }

    @staticmethod
    def from_dict(name: str, d: dict) -> CollectiveFit:
        def get(key: str, scale: float) -> float | None:
            v = d.get(key)
            if v is None:
                return None
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ModelError(f"cost model: {name}.{key} is {v!r} (expected a number >= 0 or null)")
            return float(v) * scale

        return CollectiveFit(
            name,
            get("lat_intra_us", 1e-6),
            get("lat_inter_us", 1e-6),
            get("bw_intra_GBps", 1e9),
            get("bw_net_GBps", 1e9),
            int(d.get("rows", 0)),
            float(d.get("rms_relative_error", 0.0)),
            list(d.get("sources", [])),
            get("bw_intra_min_GBps", 1e9),
            get("bw_net_min_GBps", 1e9),
        )


@dataclass
class CostModel:
    """Fitted terms per collective (nccl-tests' names), and the predictions they give."""

    fits: dict[str, CollectiveFit]

    def _fit_of(self, name: str, params_of: str | None) -> tuple[Collective, CollectiveFit]:
        c = COLLECTIVES.get(name)
        if c is None:
            raise ModelError(f"cost model: no collective {name!r} (expected one of {', '.join(COLLECTIVES)})")
        key = params_of or name
        if key not in self.fits:
            have = ", ".join(self.fits) or "none"
            raise ModelError(f"cost model: the sources have no {key} table to fit (fitted: {have})")
        return c, self.fits[key]

    def seconds(
        self, name: str, size: int, topology: Topology, *, algorithm: str | None = None, params_of: str | None = None
    ) -> float:
        """The predicted time of ``name`` on ``size`` bytes (nccl-tests' size) at ``topology``.

        Args:
            algorithm: ``ring`` or ``tree`` to price one algorithm (default: the faster, as NCCL picks).
            params_of: price with another collective's fitted terms (a cross-check of the bus factors).

        Raises:
            ModelError: the collective was not fitted, or the prediction needs a term the sources do not show.
        """
        c, f = self._fit_of(name, params_of)
        variants = _variants(c, float(size), topology)
        if algorithm is not None:
            k = {"ring": 0, "tree": 1}.get(algorithm)
            if k is None or k >= len(variants):
                raise ModelError(f"cost model: {name} at {topology.describe()} has no {algorithm} algorithm")
            variants = [variants[k]]
        return self._price(c, f, variants, topology)[0]

    def algorithm(self, name: str, size: int, topology: Topology) -> str:
        """``ring`` or ``tree``: the algorithm the model prices fastest."""
        c, f = self._fit_of(name, None)
        return ("ring", "tree")[self._price(c, f, _variants(c, float(size), topology), topology)[1]]

    @staticmethod
    def _price(c: Collective, f: CollectiveFit, variants, topology: Topology) -> tuple[float, int]:
        where = f"{c.name} at {topology.describe()}"
        needed = {j for cands in variants for v in cands for j in range(4) if v[j] != 0}
        theta, bounded = f.theta(sorted(needed), where)
        t, a, j = _evaluate(variants, theta)
        # A bandwidth known only as a bound may price a link as the bottleneck only if the known links do too.
        used = {i for i in bounded if variants[a][j][i] != 0}
        if used:
            known = [float(v @ theta) for v in variants[a] if not any(v[i] != 0 for i in bounded)]
            if not known or max(known) < t * (1 - 1e-9):
                raise f._missing(min(used), where)
        return t, a

    def busbw(self, name: str, size: int, topology: Topology, **kw) -> float:
        """The predicted bus bandwidth (bytes/s, nccl-tests' definition)."""
        c = COLLECTIVES[name]
        return size * c.bus_factor(topology.ranks) / self.seconds(name, size, topology, **kw)

    def as_dict(self) -> dict:
        return {
            "format": "delaycomm-costmodel",
            "version": 1,
            "model": "docs/costmodel.md",
            "tree_efficiency": TREE_EFFICIENCY,
            "collectives": {k: f.as_dict() for k, f in self.fits.items()},
        }

    @staticmethod
    def from_dict(d: dict, where: str = "cost model") -> CostModel:
        if not isinstance(d, dict) or d.get("format") != "delaycomm-costmodel" or d.get("version") != 1:
            raise ModelError(f"{where}: not a delaycomm cost model (expected format delaycomm-costmodel, version 1)")
        cols = d.get("collectives")
        if not isinstance(cols, dict) or not cols:
            raise ModelError(f"{where}: field collectives is missing or empty")
        fits = {}
        for name, v in cols.items():
            if name not in COLLECTIVES or not isinstance(v, dict):
                raise ModelError(f"{where}: field collectives.{name} is not a fitted collective")
            fits[name] = CollectiveFit.from_dict(name, v)
        return CostModel(fits)


def fit(observations: Sequence[Observation], *, max_rounds: int = 30) -> CostModel:
    """The model whose terms, per collective, best fit the observations' times in relative error.

    Raises:
        ModelError: no observations, or a collective without any.
    """
    if not observations:
        raise ModelError("cost model: no measurements to fit")
    by: dict[str, list[Observation]] = {}
    for o in observations:
        if o.collective not in COLLECTIVES:
            raise ModelError(f"cost model: {o.where or 'an observation'} names no collective ({o.collective!r})")
        if not (o.seconds > 0 and math.isfinite(o.seconds)):
            raise ModelError(f"cost model: {o.where or 'an observation'} has a time of {o.seconds!r} s")
        by.setdefault(o.collective, []).append(o)
    return CostModel({name: _fit_one(name, obs, max_rounds) for name, obs in by.items()})


def _fit_one(name: str, obs: list[Observation], max_rounds: int) -> CollectiveFit:
    c = COLLECTIVES[name]
    variants = [_variants(c, float(o.size), o.topology) for o in obs]
    t = np.array([o.seconds for o in obs])
    # Start from NCCL's own figures (tuning.cc, Simple protocol: 3.4 us per NVLink step, 9.6 us per network step)
    # and 300 / 25 GB/s; scale the unknowns to order 1 for the solver.
    scale = np.array([1e-5, 1e-5, 1e-11, 1e-10])
    theta = np.array([3.4e-6, 9.6e-6, 1 / 300e9, 1 / 25e9])
    best: tuple[float, np.ndarray, list] | None = None
    seen: set[tuple] = set()
    for _ in range(max_rounds):
        chosen = [_evaluate(v, theta) for v in variants]
        key = tuple((a, j) for _, a, j in chosen)
        rows = np.array([variants[i][a][j] for i, (_, a, j) in enumerate(chosen)])
        resid = np.array([p for p, _, _ in chosen]) / t - 1.0
        err = float(np.sqrt(np.mean(resid**2)))
        if best is None or err < best[0] - 1e-15:
            best = (err, theta.copy(), rows)
        if key in seen:
            break
        seen.add(key)
        a = rows / t[:, None] * scale
        used = np.abs(a).sum(axis=0) > 0
        x = np.zeros(4)
        x[used] = _nnls(a[:, used], np.ones(len(obs)))
        theta = x * scale
    err, theta, rows = best
    final = [_evaluate(v, theta) for v in variants]
    resid = np.array([p for p, _, _ in final]) / t - 1.0
    observed = np.abs(np.array([variants[i][a][j] for i, (_, a, j) in enumerate(final)])).sum(axis=0) > 0
    vals: list[float | None] = []
    for j in range(4):
        if not observed[j]:
            vals.append(None)
        elif j < 2:
            vals.append(float(theta[j]))
        else:
            vals.append(1.0 / theta[j] if theta[j] > 0 else _FASTEST)
    return CollectiveFit(
        name,
        vals[0],
        vals[1],
        vals[2],
        vals[3],
        len(obs),
        float(np.sqrt(np.mean(resid**2))),
        sorted({o.where.rsplit(":", 1)[0] for o in obs if o.where}),
        _bound(2, variants, final, theta, observed),
        _bound(3, variants, final, theta, observed),
    )


_FASTEST = 1e18  # bytes/s: a bandwidth the fit found costless


def _bound(j: int, variants, chosen, theta: np.ndarray, observed: np.ndarray) -> float | None:
    """For an inverse bandwidth never the bottleneck: the largest value that keeps it so in every row, as the
    smallest bandwidth (bytes/s) the measurements allow; None when no row prices it at all."""
    if observed[j]:
        return None
    limit = math.inf
    for algos, (t, a, _) in zip(variants, chosen):
        for v in algos[a]:
            if v[j] > 0:
                rest = float(v @ theta) - v[j] * theta[j]
                limit = min(limit, max(t - rest, 0.0) / v[j])
    if not math.isfinite(limit):
        return None
    return 1.0 / limit if limit > 0 else _FASTEST


def load(path: str) -> CostModel:
    """The cost model in a JSON file: a model (``format`` delaycomm-costmodel) or a profile whose metadata carries one
    (``python -m delaycomm profile ... --ranks N``).

    Raises:
        ModelError: the file cannot be read or holds no model.
    """
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise ModelError(f"cost model file {path!r} cannot be read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ModelError(f"cost model file {path!r} is not JSON ({e})") from None
    if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict) and "costmodel" in doc["metadata"]:
        doc = doc["metadata"]["costmodel"]
    return CostModel.from_dict(doc, f"cost model file {path!r}")
