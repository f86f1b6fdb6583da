"""NCCL's tuning model: its constants and the (algorithm, protocol) candidates of a call (docs/costmodel.md).

Every constant here is NCCL's, from ``src/graph/tuning.cc`` (``ncclTunerConstantsDefaults``, ``ncclTopoTuneModel``,
``ncclTopoGetAlgoTime``; NVIDIA/nccl master, read 2026-12-06) unless its comment says otherwise. What NCCL reads from
the machine's topology (the bus bandwidths of the links, and for one node NVLink SHARP's) is what the fit supplies,
with two per-step latencies that scale NCCL's table of hardware latencies to the measured cluster.

A candidate is one (algorithm, protocol) for one call: its time is the largest of its entries (each entry a constant
plus a coefficient vector over the unknowns :data:`TERMS`: one entry per link the data may cross, and one for a
protocol's bandwidth cap), and NCCL runs the candidate of least time, as ``ncclTopoGetAlgoTime`` ranks them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

#: The unknowns, in order: the ring/Simple per-step latency over NVLink and over the network (s), the inverse bus
#: bandwidths (s/B) of a node's links, of one NIC, and of NVLink SHARP (NVLS) all_reduce on one node, and the NVLS
#: all_reduce latency (s).
TERMS = ("lat_intra", "lat_inter", "bw_intra", "bw_net", "bw_nvls", "lat_nvls")
LAT_INTRA, LAT_INTER, U_INTRA, U_NET, U_NVLS, LAT_NVLS = range(6)
PROTOCOLS = ("LL", "LL128", "Simple")
LL, LL128, SIMPLE = range(3)

# baseLatencies (us): Tree, Ring; per protocol LL, LL128, Simple.
BASE_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
# hwLatencies (us): [link][algorithm][protocol].
HW_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls_tree": (0.0, 0.0, 20.9)},
}
# NVLSTree's latency (us): no base latency; its NVLink hop is NVLS's (the fitted lat_nvls scales it), each network
# hop hwLatencies[NET][NVLS_TREE][Simple].
NVLS_TREE_HW_US = {"nvlink": 25.0, "net": 20.9}
# Protocols' share of the ring's bus bandwidth: LL busBw * .5 (capped by llMaxBw), LL128 * 0.92.
RING_PROTO_BW = (0.5, 0.92, 1.0)
# Tree all_reduce: busBw * .92; LL a further 1/3.8 (capped by llMaxBw); LL128 120/128 between nodes (7/9 on one).
TREE_BW = 0.92
TREE_PROTO_BW = (1.0 / 3.8, 120.0 / 128.0, 1.0)
TREE_LL128_ONE_NODE = 7.0 / 9.0
# llMaxBws (GB/s), Hopper on one node, Intel-hosted nodes for 2 and for more nodes (NCCL picks by node count and CPU).
LL_MAX_GBPS = {1: 141.0, 2: 39.0, 4: 20.4}
# The ring's plateau (ncclTopoGetAlgoTime): ring/Simple all_reduce between nodes has its latency * 1.4 (sm80+)
# once nBytes / (nChannels * nRanks) >= 64.
RING_PLATEAU = 1.4
PLATEAU_CHANNELS = 16  # not NCCL's: the channel count is the topology's; 16 is an H100 ring's usual count
# NVLSTree (all_reduce between nodes whose GPUs run NVLink SHARP): nvlsEfficiency (Hopper) and the channel count
# of its intra-node bandwidth (intraBw = bwIntra * .85 * (nCh - 1) / nCh, doubled for all_reduce), its inter-node
# bandwidth doubled on two nodes ("Handle 2 node case of NVLSTree"), and perChMaxNVLSTreeBws (Hopper, GB/s, 2 nodes
# and more) times the channels.
NVLS_EFFICIENCY = 0.85
NVLS_CHANNELS = 16  # not NCCL's: NCCL_NVLS_NCHANNELS' usual value on an H100 node
NVLS_TREE_PER_CH_GBPS = {2: 57.7, 4: 45.5}
# treeCorrectionFactor[protocol][log2(nBytes >> 6)] for the 24 powers of two from 64 B: the tree's measured
# shortfall from its model at medium sizes.
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0,
     1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0, 1.0,
     1.0),
    (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9,
     0.9),
)  # fmt: skip
# NCCL's defaults for the terms, as it would price an H100 node with 400 Gb/s NICs before any measurement: NVLink
# ring/Simple 3.4 us, network 14 us per step; the bus bandwidth of 18 NVLinks of SM90_NVLINK_BW 20.6 GB/s
# (src/graph/topo.h) and one 400 Gb/s NIC (a line rate, not an NCCL constant).
NCCL_DEFAULTS = {"lat_intra": 3.4e-6, "lat_inter": 14.0e-6, "bw_intra": 18 * 20.6e9, "bw_net": 50e9}

RING_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
PEER_OPS = ("alltoall", "gather", "scatter", "sendrecv")


@dataclass(frozen=True)
class Candidate:
    """One (algorithm, protocol) of a call: time = max over entries of ``const + vec @ theta``."""

    algorithm: str
    protocol: str
    entries: tuple[tuple[float, np.ndarray], ...]

    def time(self, theta: np.ndarray) -> tuple[float, int]:
        best, j = -math.inf, 0
        for i, (c, v) in enumerate(self.entries):
            t = c + float(v @ theta)
            if t > best:
                best, j = t, i
        return best, j


def _vec(**kw: float) -> np.ndarray:
    v = np.zeros(len(TERMS))
    for k, x in kw.items():
        v[TERMS.index(k)] = x
    return v


def log2i(x: int) -> int:
    return max(int(x).bit_length() - 1, 0)


def ll_max(nodes: int) -> float:
    return LL_MAX_GBPS[1 if nodes == 1 else 2 if nodes == 2 else 4] * 1e9


def tree_correction(p: int, size: float) -> float:
    k = log2i(int(size) >> 6)
    return TREE_CORRECTION[p][k] if int(size) >> 6 > 0 and k < len(TREE_CORRECTION[p]) else 1.0


def _links(g: int, nodes: int, k: int) -> list[np.ndarray]:
    """The links a ring or tree's bytes cross, as the coefficient of each one's inverse bus bandwidth: NVLink within
    a node, the node's ``k`` NICs between nodes (a ring leaves a node once per channel: its NICs carry one GPU's
    share)."""
    if nodes == 1:
        return [_vec(bw_intra=1.0)]
    if g == 1:
        return [_vec(bw_net=1.0)]
    return [_vec(bw_intra=1.0), _vec(bw_net=1.0 / k)]


def ring_steps(name: str, n: int, nodes: int) -> tuple[int, int]:
    """NCCL's ``nsteps`` and ``nInterSteps`` of a ring."""
    if name == "all_reduce":
        return 2 * (n - 1), 2 * (nodes - 1) if nodes > 1 else 0
    if name in ("all_gather", "reduce_scatter"):
        return n - 1, nodes - 1 if nodes > 1 else 0
    return n, nodes if nodes > 1 else 0


def _hw_ratio(link: str, algo: str, p: int) -> float:
    """A hardware latency relative to the ring/Simple latency of its link (the fitted term it scales)."""
    return HW_US[link][algo][p] / HW_US[link]["ring"][SIMPLE]


def ring(name: str, size: float, bus_factor: float, n: int, nodes: int, k: int) -> list[Candidate]:
    g = n // nodes
    steps, inter = ring_steps(name, n, nodes)
    out = []
    for p, proto in enumerate(PROTOCOLS):
        base = BASE_US["ring"][p] * 1e-6
        if name in ("broadcast", "reduce"):
            # Every step at the latency of the slowest link (NCCL prices Simple with the tree's hardware latency).
            algo = "tree" if p == SIMPLE else "ring"
            lat = (
                _vec(lat_intra=steps * _hw_ratio("nvlink", algo, p))
                if nodes == 1
                else _vec(lat_inter=steps * _hw_ratio("net", algo, p))
            )
        else:
            # One GPU per node: NCCL exposes the tree's network latency.
            net_algo = "tree" if g == 1 else "ring"
            lat = _vec(
                lat_intra=(steps - inter) * _hw_ratio("nvlink", "ring", p),
                lat_inter=inter * _hw_ratio("net", net_algo, p),
            )
        if name == "all_reduce" and p == SIMPLE and nodes > 1 and size / (PLATEAU_CHANNELS * n) >= 64:
            base, lat = base * RING_PLATEAU, lat * RING_PLATEAU
        wire = size * bus_factor / RING_PROTO_BW[p]
        entries = [(base, lat + wire * link) for link in _links(g, nodes, k)]
        if p == LL:
            entries.append((base + size * bus_factor / ll_max(nodes), lat))
        out.append(Candidate("ring", proto, tuple(entries)))
    return out


def tree(size: float, n: int, nodes: int, k: int) -> list[Candidate]:
    """Tree all_reduce: 2((g - 1) intra + log2(N) inter) hops, 2S at .92 of the bus bandwidth (on one node a chain
    through the node's GPUs, LL128 at 7/9 instead of 120/128)."""
    g = n // nodes
    out = []
    for p, proto in enumerate(PROTOCOLS):
        base = BASE_US["tree"][p] * 1e-6
        lat = _vec(
            lat_intra=2 * (g - 1) * _hw_ratio("nvlink", "tree", p),
            lat_inter=2 * log2i(nodes) * _hw_ratio("net", "tree", p),
        )
        proto_bw = TREE_LL128_ONE_NODE if p == LL128 and nodes == 1 else TREE_PROTO_BW[p]
        share = TREE_BW * proto_bw * tree_correction(p, size)
        wire = 2.0 * size / share
        entries = [(base, lat + wire * link) for link in _links(g, nodes, k)]
        if p == LL:
            entries.append((base + 2.0 * size / (ll_max(nodes) * tree_correction(p, size)), lat))
        out.append(Candidate("tree", proto, tuple(entries)))
    return out


def nvls(size: float, bus_factor: float) -> Candidate:
    """NVLink SHARP all_reduce on one node (Simple only): its own latency and bus bandwidth, both fitted."""
    return Candidate("nvls", "Simple", ((0.0, _vec(lat_nvls=1.0, bw_nvls=size * bus_factor)),))


def nvls_tree(size: float, bus_factor: float, n: int, nodes: int, k: int) -> Candidate:
    """NVLSTree all_reduce between nodes (Simple only): NVLS within each node, trees between the nodes.

    NCCL's bus bandwidth is the least of NVLS's within a node (``bw_nvls``, the one-node NVLS fit, times
    .85 (nCh - 1) / nCh and doubled: all_reduce pipelines two operations), the node's NICs (doubled on two nodes)
    and the per-channel cap; its latency one NVLS hop plus 2 log2(N) network hops at NVLSTree's 20.9 us.
    """
    wire = size * bus_factor
    intra = NVLS_EFFICIENCY * (NVLS_CHANNELS - 1) / NVLS_CHANNELS * 2.0
    inter = k * (2.0 if nodes <= 2 else 1.0)
    cap = NVLS_CHANNELS * NVLS_TREE_PER_CH_GBPS[2 if nodes <= 2 else 4] * 1e9
    lat = _vec(lat_nvls=1.0, lat_inter=2 * log2i(nodes) * NVLS_TREE_HW_US["net"] / HW_US["net"]["ring"][SIMPLE])
    entries = ((0.0, lat + _vec(bw_nvls=wire / intra)), (0.0, lat + _vec(bw_net=wire / inter)), (wire / cap, lat))
    return Candidate("nvls_tree", "Simple", entries)


def peer(name: str, size: float, n: int, nodes: int, k: int) -> list[Candidate]:
    """alltoall, gather, scatter: sends to every peer at once (NCCL's tuning has no model of them: one step per
    peer, intra-node peers over NVLink, the others through the node's NICs); sendrecv one flow per rank."""
    g = n // nodes
    if name == "sendrecv":
        lat = _vec(lat_inter=1.0) if nodes > 1 else _vec(lat_intra=1.0)
        return [Candidate("p2p", "Simple", tuple((0.0, lat + size * link) for link in _links(g, nodes, 1)))]
    share = size / n
    lat = _vec(lat_intra=g - 1, lat_inter=n - g)
    entries = []
    if g > 1:
        entries.append((0.0, lat + _vec(bw_intra=share * (g - 1))))
    if nodes > 1:
        entries.append((0.0, lat + _vec(bw_net=share * (n - g) * (g / k if name == "alltoall" else 1.0))))
    return [Candidate("p2p", "Simple", tuple(entries))]


def candidates(
    name: str,
    size: float,
    bus_factor: float,
    n: int,
    nodes: int,
    k: int,
    with_nvls: bool,
    tuning: Tuning | None = None,
) -> list[Candidate]:
    """Every (algorithm, protocol) NCCL could run for the call (none for one rank: it costs nothing), less those
    ``tuning`` (the cluster's NCCL_ALGO and NCCL_PROTO) disables."""
    out = _every_candidate(name, size, bus_factor, n, nodes, k, with_nvls)
    if tuning is None or name in PEER_OPS or n == 1:
        return out
    return [c for c in out if tuning.allows(name, c.algorithm, c.protocol)]


@dataclass(frozen=True)
class Tuning:
    """The cluster's NCCL_ALGO and NCCL_PROTO (NCCL's syntax; None: NCCL's default, everything it models)."""

    algo: str | None = None
    proto: str | None = None

    def __post_init__(self):
        _ = self.enabled  # a bad list is an error where it is given

    @functools.cached_property
    def enabled(self) -> tuple[dict[str, frozenset[str]] | None, dict[str, frozenset[str]] | None]:
        algos = parse_tuning_list(self.algo, "NCCL_ALGO", NCCL_ALGOS) if self.algo else None
        protos = parse_tuning_list(self.proto, "NCCL_PROTO", NCCL_PROTOS) if self.proto else None
        return algos, protos

    def allows(self, name: str, algorithm: str, protocol: str) -> bool:
        algos, protos = self.enabled
        return (algos is None or algorithm in algos[name]) and (protos is None or protocol in protos[name])

    def describe(self) -> str:
        parts = [f"NCCL_ALGO={self.algo}" if self.algo else "", f"NCCL_PROTO={self.proto}" if self.proto else ""]
        return " ".join(p for p in parts if p) or "NCCL's defaults"


def _every_candidate(
    name: str, size: float, bus_factor: float, n: int, nodes: int, k: int, with_nvls: bool
) -> list[Candidate]:
    if n == 1:
        return [Candidate("none", "none", ((0.0, np.zeros(len(TERMS))),))]
    if name in PEER_OPS:
        return peer(name, size, n, nodes, k)
    out = ring(name, size, bus_factor, n, nodes, k)
    if name == "all_reduce":
        out += tree(size, n, nodes, k)
    if name == "all_reduce" and with_nvls:
        out.append(nvls(size, bus_factor) if nodes == 1 else nvls_tree(size, bus_factor, n, nodes, k))
    return out


# NCCL's names (src/init.cc: ncclFuncStr, ncclAlgoStr, ncclProtoStr) and the model's for them. CollNet and PAT are
# NCCL's but not the model's (no public table shows them): naming them is allowed, and prices nothing.
NCCL_FUNCS = {
    "broadcast": "broadcast",
    "reduce": "reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "allreduce": "all_reduce",
}
NCCL_ALGOS = {
    "tree": "tree",
    "ring": "ring",
    "collnetdirect": None,
    "collnetchain": None,
    "nvls": "nvls",
    "nvlstree": "nvls_tree",
    "pat": None,
}
NCCL_PROTOS = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}


def parse_tuning_list(text: str, option: str, elems: dict[str, str | None]) -> dict[str, frozenset[str]]:
    """What NCCL_ALGO or NCCL_PROTO (``text``, NCCL's syntax) enables per collective: the model's names.

    NCCL's ``parseList`` (src/graph/tuning.cc): entries separated by ``;``, each ``[function:]list`` where only the
    first may lack the function (it then applies to every function); a list is comma-separated names, all the others
    disabled, or ``^names``, those disabled; names are case-insensitive. Collectives no entry names keep everything.

    Raises:
        ValueError: a name NCCL does not know, or an entry NCCL would refuse (the message names ``option``).
    """
    enabled = {f: set(v for v in elems.values() if v) for f in NCCL_FUNCS.values()}
    entries = text.split(";")
    for i, entry in enumerate(entries):
        prefix, sep, names = entry.partition(":")
        if not sep:
            if i:
                raise ValueError(f"{option} {text!r}: every entry but the first must name a function ('allreduce:...')")
            prefix, names = "", entry
        prefix = prefix.strip().lower()
        if prefix and prefix not in NCCL_FUNCS:
            raise ValueError(f"{option} {text!r}: no function {prefix!r} (expected one of: {', '.join(NCCL_FUNCS)})")
        names = names.strip()
        negate = names.startswith("^")
        listed = set()
        for name in (names[1:] if negate else names).split(","):
            key = name.strip().lower()
            if key not in elems:
                raise ValueError(f"{option} {text!r}: no {key!r} (expected names from: {', '.join(elems)})")
            if elems[key]:
                listed.add(elems[key])
        every = {v for v in elems.values() if v}
        for f in [NCCL_FUNCS[prefix]] if prefix else NCCL_FUNCS.values():
            enabled[f] = every - listed if negate else listed
    return {f: frozenset(v) for f, v in enabled.items()}
