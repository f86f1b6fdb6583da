"""A cost model of NCCL's collectives, fitted to measured tables and used to predict other scales (docs/costmodel.md).

NCCL prices every call once per (algorithm, protocol): ring and, for all_reduce, tree, each in LL, LL128 and
Simple (NVLink SHARP for an all_reduce on one node where a table needs it, NVLSTree between such nodes), as a
latency plus the bytes over a bandwidth, and runs the cheapest of those the cluster's NCCL_ALGO/NCCL_PROTO enable
(``src/graph/tuning.cc``). This model does the same with NCCL's own
structure and constants (:mod:`.nccl`: step counts within and between nodes, base and per-hop latencies per
algorithm and protocol, the protocols' bandwidth shares, the tree's 0.92 and its correction at medium sizes, the
ring's plateau) and fits what NCCL reads from the machine: the bus bandwidth of a node's links and of a NIC, and
two per-step latencies that scale NCCL's table of hardware latencies to the cluster measured. The collectives NCCL
runs on rings share those terms (one fit); alltoall, gather, scatter and sendrecv, which NCCL's tuning does not
model, have their own. A term no source shows is unknown, and a prediction that needs it is refused; a fit whose
rows cannot tell its terms apart is refused, naming the table that would.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from delaycomm.costmodel import nccl
from delaycomm.costmodel.nccl import TERMS
from delaycomm.sources.ops import COLLECTIVES, Collective

__all__ = ["ModelError", "Topology", "Observation", "CollectiveFit", "CostModel", "fit", "load", "TERMS", "nccl"]

VERSION = 2
_LINK = {
    "lat_intra": "the per-step latency of the links within a node",
    "lat_inter": "the per-step latency between nodes",
    "bw_intra": "the bus bandwidth within a node (NVLink/PCIe)",
    "bw_net": "the bus bandwidth between nodes (the network)",
    "bw_nvls": "the bus bandwidth of NVLink SHARP all_reduce",
    "lat_nvls": "the latency of NVLink SHARP all_reduce",
}
_NEED = {
    "lat_intra": "a table of several GPUs per node",
    "lat_inter": "a table of several nodes",
    "bw_intra": "a table of several GPUs per node",
    "bw_net": "a table of several nodes",
    "bw_nvls": "an all_reduce table of one node",
    "lat_nvls": "an all_reduce table of one node",
}
_SCALE = np.array([1e-5, 1e-5, 1e-11, 1e-10, 1e-11, 1e-5])  # the unknowns' orders, for the solver
_FASTEST = 1e18  # bytes/s: a bandwidth the fit found costless


def _hint(names: list[str]) -> str:
    lat = [x for x in names if x.startswith("lat")]
    bw = [x for x in names if x.startswith("bw")]
    out = []
    if lat and bw:
        out.append("rows of several sizes, from latency-bound (KiB) to bandwidth-bound (hundreds of MiB)")
    if len(lat) > 1 or len(bw) > 1:
        out.append("a table at another number of nodes or of GPUs per node, which weighs the links differently")
    return " and ".join(out) or "more rows"


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


def _candidates(
    c: Collective, size: float, t: Topology, with_nvls: bool, tuning: nccl.Tuning | None = None
) -> list[nccl.Candidate]:
    out = nccl.candidates(
        c.name, size, c.bus_factor(t.ranks), t.ranks, t.nodes, t.nics_used, with_nvls and t.gpus_per_node > 2, tuning
    )
    if not out:
        raise ModelError(
            f"cost model: {tuning.describe() if tuning else ''} leaves {c.name} at {t.describe()} no algorithm and "
            "protocol the model prices (NCCL would fail such a call: enable ring, or tree/NVLSTree for all_reduce "
            "between nodes)"
        )
    return out


def _best(cands: list[nccl.Candidate], theta: np.ndarray) -> tuple[float, int, int]:
    """The time of the cheapest candidate, which one, and which of its entries decides it."""
    best = (math.inf, 0, 0)
    for i, cand in enumerate(cands):
        tm, j = cand.time(theta)
        if tm < best[0]:
            best = (tm, i, j)
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
    """The fitted terms of one collective (seconds, bytes/s); a term None was not observed."""

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
    bw_nvls: float | None = None
    lat_nvls: float | None = None
    assumed: dict[str, str] = field(default_factory=dict)  # term -> where its value comes from, when not fitted
    # Directions in the terms (scaled as the fit scales them) that the rows cannot see: a prediction along one is
    # refused (the rows cannot tell those terms apart).
    undetermined: list[list[float]] = field(default_factory=list)

    def values(self) -> list[float | None]:
        return [self.lat_intra, self.lat_inter, self.bw_intra, self.bw_net, self.bw_nvls, self.lat_nvls]

    def _missing(self, j: int, where: str) -> ModelError:
        bound = (None, None, self.bw_intra_min, self.bw_net_min, None, None)[j]
        shown = f" (they show only that it is at least {bound * 1e-9:.1f} GB/s)" if bound else ""
        return ModelError(
            f"cost model: {where} needs {_LINK[TERMS[j]]} ({TERMS[j]}), which the sources of the "
            f"{self.collective} fit do not show{shown}: add {_NEED[TERMS[j]]}"
        )

    def theta(self, needed, where: str) -> tuple[np.ndarray, set[int]]:
        """The terms as the model's unknowns (latencies, inverse bandwidths), and which of them are only bounds.

        Raises:
            ModelError: a needed term was neither fitted nor bounded.
        """
        vals = self.values()
        mins = [None, None, self.bw_intra_min, self.bw_net_min, None, None]
        out, bounded = np.zeros(len(TERMS)), set()
        for j in needed:
            if vals[j] is None and mins[j] is None:
                raise self._missing(j, where)
        for j in range(len(TERMS)):
            v = vals[j] if vals[j] is not None else mins[j]
            if vals[j] is None and mins[j] is not None:
                bounded.add(j)
            if v is not None:
                out[j] = v if TERMS[j].startswith("lat") else (1.0 / v if v > 0 else 0.0)
        return out, bounded

    def check_determined(self, vec: np.ndarray, where: str) -> None:
        """Refuse a prediction that depends on a mix of terms the rows could not tell apart.

        Raises:
            ModelError: naming the terms and the table that would separate them.
        """
        v = vec * _SCALE
        norm = float(np.linalg.norm(v))
        names: set[str] = set()
        for d in self.undetermined:
            d = np.asarray(d)
            if norm > 0 and abs(float(v @ d)) > 1e-6 * norm:
                names.update(TERMS[k] for k in range(len(TERMS)) if abs(d[k]) > 0.05)
        if names:
            shown = [t for t in TERMS if t in names]
            raise ModelError(
                f"cost model: {where} depends on {', '.join(shown)} apart, which the {self.rows} row(s) of the "
                f"{self.collective} fit cannot tell apart (other mixes of them fit those rows as well): add "
                f"{_hint(shown)}"
            )

    def as_dict(self) -> dict:
        def us(v):
            return None if v is None else v * 1e6

        def gb(v):
            return None if v is None else v * 1e-9

        return {
            "lat_intra_us": us(self.lat_intra),
            "lat_inter_us": us(self.lat_inter),
            "bw_intra_GBps": gb(self.bw_intra),
            "bw_net_GBps": gb(self.bw_net),
            "bw_nvls_GBps": gb(self.bw_nvls),
            "lat_nvls_us": us(self.lat_nvls),
            "bw_intra_min_GBps": gb(self.bw_intra_min),
            "bw_net_min_GBps": gb(self.bw_net_min),
            "rows": self.rows,
            "rms_relative_error": self.rms_relative_error,
            "sources": self.sources,
            "assumed": self.assumed,
            "undetermined": self.undetermined,
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
            get("bw_nvls_GBps", 1e9),
            get("lat_nvls_us", 1e-6),
            dict(d.get("assumed", {})),
            [list(map(float, v)) for v in d.get("undetermined", [])],
        )


@dataclass
class CostModel:
    """Fitted terms per collective (nccl-tests' names), and the predictions they give, under the cluster's NCCL_ALGO
    and NCCL_PROTO (``tuning``: the sources' and the target's alike)."""

    fits: dict[str, CollectiveFit]
    tuning: nccl.Tuning = field(default_factory=nccl.Tuning)

    def _fit_of(self, name: str, params_of: str | None) -> tuple[Collective, CollectiveFit]:
        c = COLLECTIVES.get(name)
        if c is None:
            raise ModelError(f"cost model: no collective {name!r} (expected one of {', '.join(COLLECTIVES)})")
        key = params_of or name
        if key not in self.fits:
            have = ", ".join(self.fits) or "none"
            raise ModelError(f"cost model: the sources have no {key} table to fit (fitted: {have})")
        return c, self.fits[key]

    def _priced(self, name, size, topology, algorithm=None, protocol=None, params_of=None):
        c, f = self._fit_of(name, params_of)
        cands = _candidates(c, float(size), topology, f.bw_nvls is not None, self.tuning)
        if algorithm is not None or protocol is not None:
            cands = [
                x
                for x in cands
                if (algorithm is None or x.algorithm == algorithm) and (protocol is None or x.protocol == protocol)
            ]
            if not cands:
                raise ModelError(
                    f"cost model: {name} at {topology.describe()} has no {algorithm or ''} {protocol or ''} candidate"
                    " (NCCL runs tree only for all_reduce; NVLS on one node and NVLSTree between nodes only where the"
                    " fit saw NVLink SHARP; NCCL_ALGO/NCCL_PROTO may have disabled it)".replace("  ", " ")
                )
        where = f"{name} at {topology.describe()}"
        needed = {j for x in cands for _, v in x.entries for j in range(len(TERMS)) if v[j] != 0}
        theta, bounded = f.theta(sorted(needed), where)
        t, i, j = _best(cands, theta)
        f.check_determined(cands[i].entries[j][1], where)
        # A bandwidth known only as a bound may price a link as the bottleneck only if a known entry does too.
        used = {b for b in bounded if cands[i].entries[j][1][b] != 0}
        if used:
            known = [c0 + float(v @ theta) for c0, v in cands[i].entries if not any(v[b] != 0 for b in bounded)]
            if not known or max(known) < t * (1 - 1e-9):
                raise f._missing(min(used), where)
        return t, cands[i]

    def seconds(
        self,
        name: str,
        size: int,
        topology: Topology,
        *,
        algorithm: str | None = None,
        protocol: str | None = None,
        params_of: str | None = None,
    ) -> float:
        """The predicted time of ``name`` on ``size`` bytes (nccl-tests' size) at ``topology``.

        Args:
            algorithm: ``ring``, ``tree``, ``nvls`` or ``nvls_tree`` to price one algorithm (default: the cheapest,
                as NCCL picks).
            protocol: ``LL``, ``LL128`` or ``Simple`` likewise.
            params_of: price with another collective's fitted terms (a cross-check of the bus factors).

        Raises:
            ModelError: the collective was not fitted, or the prediction needs a term the sources do not show.
        """
        return self._priced(name, size, topology, algorithm, protocol, params_of)[0]

    def choice(self, name: str, size: int, topology: Topology) -> tuple[str, str]:
        """The (algorithm, protocol) the model prices cheapest, as NCCL's tuner would pick."""
        cand = self._priced(name, size, topology)[1]
        return cand.algorithm, cand.protocol

    def algorithm(self, name: str, size: int, topology: Topology) -> str:
        return self.choice(name, size, topology)[0]

    def busbw(self, name: str, size: int, topology: Topology, **kw) -> float:
        """The predicted bus bandwidth (bytes/s, nccl-tests' definition)."""
        c = COLLECTIVES[name]
        return size * c.bus_factor(topology.ranks) / self.seconds(name, size, topology, **kw)

    def with_defaults(self, **links: float) -> CostModel:
        """This model with every unknown term set, for a prediction the sources alone cannot make: latencies from
        NCCL's defaults, bandwidths from ``links`` (``bw_intra``/``bw_net`` in bytes/s, e.g. a NIC's line rate) or
        NCCL's defaults. Each value set is listed in the fit's ``assumed``."""
        out = {}
        for name, f in self.fits.items():
            g = CollectiveFit.from_dict(name, f.as_dict())
            for term in ("lat_intra", "lat_inter", "bw_intra", "bw_net"):
                if getattr(g, term) is None:
                    given = links.get(term)
                    setattr(g, term, given if given is not None else nccl.NCCL_DEFAULTS[term])
                    g.assumed[term] = "given" if given is not None else "NCCL's default (src/graph/tuning.cc, topo.h)"
            out[name] = g
        return CostModel(out, self.tuning)

    def as_dict(self) -> dict:
        return {
            "format": "delaycomm-costmodel",
            "version": VERSION,
            "model": "docs/costmodel.md",
            "tree_bandwidth": nccl.TREE_BW,
            "nccl_algo": self.tuning.algo,
            "nccl_proto": self.tuning.proto,
            "collectives": {k: f.as_dict() for k, f in self.fits.items()},
        }

    @staticmethod
    def from_dict(d: dict, where: str = "cost model") -> CostModel:
        if not isinstance(d, dict) or d.get("format") != "delaycomm-costmodel":
            raise ModelError(f"{where}: not a delaycomm cost model (expected format delaycomm-costmodel)")
        if d.get("version") != VERSION:
            raise ModelError(
                f"{where}: cost model version {d.get('version')!r} (expected {VERSION}: re-run "
                "'python -m delaycomm profile ... --ranks N --nodes M' to fit it again)"
            )
        cols = d.get("collectives")
        if not isinstance(cols, dict) or not cols:
            raise ModelError(f"{where}: field collectives is missing or empty")
        fits = {}
        for name, v in cols.items():
            if name not in COLLECTIVES or not isinstance(v, dict):
                raise ModelError(f"{where}: field collectives.{name} is not a fitted collective")
            fits[name] = CollectiveFit.from_dict(name, v)
        tuning = {}
        for key in ("nccl_algo", "nccl_proto"):
            v = d.get(key)
            if v is not None and not isinstance(v, str):
                raise ModelError(f"{where}: field {key} is {v!r} (expected NCCL's syntax, a string, or null)")
            tuning[key[5:]] = v
        try:
            return CostModel(fits, nccl.Tuning(**tuning))
        except ValueError as e:
            raise ModelError(f"{where}: {e}") from None


def fit(observations: Sequence[Observation], *, max_rounds: int = 40, tuning: nccl.Tuning | None = None) -> CostModel:
    """The model whose terms, per collective, best fit the observations' times in relative error.

    ``tuning``: the cluster's NCCL_ALGO and NCCL_PROTO, under which the sources ran and the target will.

    Raises:
        ModelError: no observations, a bad one, or a fit its rows cannot determine (the message says what would).
    """
    if not observations:
        raise ModelError("cost model: no measurements to fit")
    groups: dict[str, list[Observation]] = {}
    for o in observations:
        if o.collective not in COLLECTIVES:
            raise ModelError(f"cost model: {o.where or 'an observation'} names no collective ({o.collective!r})")
        if not (o.seconds > 0 and math.isfinite(o.seconds)):
            raise ModelError(f"cost model: {o.where or 'an observation'} has a time of {o.seconds!r} s")
        if o.topology.ranks < 2:
            raise ModelError(
                f"cost model: {o.where or 'an observation'} is of one rank, which communicates nothing: it cannot "
                "show a link's latency or bandwidth"
            )
        groups.setdefault(o.collective, []).append(o)
    fits: dict[str, CollectiveFit] = {}
    for name in sorted(groups, key=lambda k: k == "all_reduce"):  # all_reduce last: it may use reduce_scatter's rings
        fits[name] = _fit.fit_collective(name, groups[name], max_rounds, fits, tuning)
    return CostModel(fits, tuning or nccl.Tuning())


from delaycomm.costmodel import _fit  # noqa: E402  (it uses the classes above)


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
