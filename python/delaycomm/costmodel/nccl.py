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
# Protocols' share of the ring's bus bandwidth: LL busBw * .5 (capped by llMaxBw), LL128 * 0.92.
RING_PROTO_BW = (0.5, 0.92, 1.0)
# Tree all_reduce: busBw * .92; LL a further 1/3.8 (capped by llMaxBw); LL128 120/128 between nodes (7/9 on one).
TREE_BW = 0.92
TREE_PROTO_BW = (1.0 / 3.8, 120.0 / 128.0, 1.0)
# llMaxBws (GB/s), Hopper on one node, Intel-hosted nodes for 2 and for more nodes (NCCL picks by node count and CPU).
LL_MAX_GBPS = {1: 141.0, 2: 39.0, 4: 20.4}
# The ring's plateau (ncclTopoGetAlgoTime): ring/Simple all_reduce between nodes has its latency * 1.4 (sm80+)
# once nBytes / (nChannels * nRanks) >= 64.
RING_PLATEAU = 1.4
PLATEAU_CHANNELS = 16  # not NCCL's: the channel count is the topology's; 16 is an H100 ring's usual count
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
    """Tree all_reduce between nodes: 2((g - 1) intra + log2(N) inter) hops, 2S at .92 of the bus bandwidth."""
    g = n // nodes
    out = []
    for p, proto in enumerate(PROTOCOLS):
        base = BASE_US["tree"][p] * 1e-6
        lat = _vec(
            lat_intra=2 * (g - 1) * _hw_ratio("nvlink", "tree", p),
            lat_inter=2 * log2i(nodes) * _hw_ratio("net", "tree", p),
        )
        share = TREE_BW * TREE_PROTO_BW[p] * tree_correction(p, size)
        wire = 2.0 * size / share
        entries = [(base, lat + wire * link) for link in _links(g, nodes, k)]
        if p == LL:
            entries.append((base + 2.0 * size / (ll_max(nodes) * tree_correction(p, size)), lat))
        out.append(Candidate("tree", proto, tuple(entries)))
    return out


def nvls(size: float, bus_factor: float) -> Candidate:
    """NVLink SHARP all_reduce on one node (Simple only): its own latency and bus bandwidth, both fitted."""
    return Candidate("nvls", "Simple", ((0.0, _vec(lat_nvls=1.0, bw_nvls=size * bus_factor)),))


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
    name: str, size: float, bus_factor: float, n: int, nodes: int, k: int, with_nvls: bool
) -> list[Candidate]:
    """Every (algorithm, protocol) NCCL could run for the call (none for one rank: it costs nothing)."""
    if n == 1:
        return [Candidate("none", "none", ((0.0, np.zeros(len(TERMS))),))]
    if name in PEER_OPS:
        return peer(name, size, n, nodes, k)
    out = ring(name, size, bus_factor, n, nodes, k)
    if name == "all_reduce" and nodes > 1:
        out += tree(size, n, nodes, k)
    if name == "all_reduce" and nodes == 1 and with_nvls:
        out.append(nvls(size, bus_factor))
    return out
