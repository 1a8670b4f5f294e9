"""A collective-time model over a cluster's topology, after NCCL's own tuning model.

NCCL picks, for every call, the algorithm and protocol with the least predicted time
``lat + bytes / (1000 * algbw)`` (microseconds, GB/s), from a table it fills at start-up
(``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` in NVIDIA/nccl src/graph/tuning.cc; the
constants and line numbers below are those of commit b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2,
v2.20.3, whose rules hold from 2.19 to 2.22). This module fills the same table from the graphs
NCCL's topology search finds on a :class:`~commprof.modeling.collective.clusters.Cluster`
(:func:`commprof.modeling.collective.nccl_search.search`: channels and each channel's bandwidth
inside a
node, ``bwIntra``, and on the network, ``bwInter``) and makes the same choice. Pure functions.

Bus bandwidth (tuning.cc lines 175 to 178), ``nCh`` the graph's channels, ``p`` ranks on ``N``
nodes of ``g`` GPUs:

    ring, tree:  nCh * (bwIntra if N <= 2 else bwInter)
                 (a two-node tree's bwIntra is raised by the search to at most 2 bwInter: a
                 tree sends half a ring's bytes between two nodes)
    NVLS:        nCh * min(bwIntra, bwInter)           (one node; nCh = g heads)
    NVLSTree:    nCh * min(bwIntra, bwInter if N <= 2 else bwInter / 2)

then per protocol (lines 181 to 186): ring LL / 4 (/ 3 on one node for all but all-reduce),
capped at ``LL_MAX_BW``; ring LL128 0.92 (0.7 with one rank a node), capped at ``nCh *
perChMaxRingLL128Bw``; tree 0.92 capped at ``nCh * perChMaxTreeBw``, LL / 3.8, LL128 7/9 (one
node) or 120/128 capped at ``nCh * perChMaxTreeLL128Bw``; 0.85 for a tree of one GPU a node.
LL128 only where NCCL enables it (``Cluster.ll128_on``: across nodes, not on a GPU-to-NIC path
through the CPU). The algorithm bandwidth is ``busBw * p / nsteps`` for a ring (``nsteps`` =
2(p-1) for all-reduce, p-1 for all-gather and reduce-scatter, p for broadcast), ``busBw / 2`` for
a tree and ``busBw * 5/6`` for NVLS. The per-channel caps are why the channel count matters: 8
channels (8 HDR NICs) cap LL128 at 160 GB/s, 16 (16 NICs of 100 Gb/s) do not.

Latency (us) per algorithm, with ``intra``/``inter`` the hardware latencies ``HW_LAT_US`` of the
link kind inside a node and of the network:

    ring:      base + (nsteps - nInter) * intra + nInter * inter,  nInter = 2N (all-reduce, N>1)
    broadcast: base + one hop where the ring graph keeps sameChannels, else base + nsteps hops
               of the network (several nodes) or the node's link, Simple at the tree's hop
               latency (a chunk's; lines 234 to 240; ``nccl_search.same_channels``)
    tree:      base + 2 ((g - 1) intra + log2(N) inter)            (latency grows with log N)
    NVLS:      intra (+ inter on several nodes);  NVLSTree: base + intra + 2 log2(N) inter

On several nodes a ring step costs at least the network post overhead (1 us, 3 us for Simple),
and the multi-node Simple ring all-reduce pays NCCL's "plateau" factor 1.4 (line 442). Tree
bandwidths at mid sizes take NCCL's ``TREE_CORRECTION`` factors.

Correction (:class:`Corrections`, with an ablation row in benchmarks/README.md; off is NCCL's
tuning model):

- ``two_node_fill``: an all-reduce spanning exactly two nodes takes ``min(S, nCh * BUFFSIZE) /
  algbw`` longer than NCCL's model (``BUFFSIZE`` = ``NCCL_BUFFSIZE_BYTES``, NCCL's default
  network buffer of a channel; ``nCh`` the communicator's channels, ``comm->nChannels``): the
  transfer reaches its rate only once every channel's buffer has filled. Not NCCL's: chosen on
  development logs (every two-node log but OCI's ramps up this way over 1 MiB to 1 GiB; the one
  log past two nodes does not), the constant NCCL's own, not fitted.

What it leaves out (limits): NCCL releases from 2.23 lower the tree's Simple latencies (NVLink
28 -> 4 us a hop), halve ring LL's discount and count 2(N - 1) inter-node ring steps, and from
2.28 scale NVLS by an efficiency: a cluster on those releases picks Simple trees earlier than
this table; a network plugin's own latency (``latencyInter``) is not in a description (IB
reports 0); CollNet (SHARP in the IB switches) is not modelled (it needs the switch plugin,
which a description cannot tell); NVLS for all-gather and reduce-scatter is left out (ring
only); RCCL's tuning and search differ from NCCL's and are approximated by them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from commprof.modeling.collective.clusters import Cluster
from commprof.modeling.collective.nccl_search import Graphs, search

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
"""Collectives the model predicts (nccl-tests' names without ``_perf``)."""
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree")
"""NCCL algorithms modelled (CollNet is not: see the module docstring)."""
PROTOCOLS = ("LL", "LL128", "Simple")
"""NCCL protocols, in NCCL's order."""

BASE_LAT_US: dict[str, tuple[float, float, float]] = {
    "tree": (6.8, 14.0, 0.0),
    "ring": (6.6, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
}
"""``baseLat`` (us) by algorithm, per protocol (LL, LL128, Simple): tuning.cc."""
HW_LAT_US: dict[str, dict[str, tuple[float, float, float]]] = {
    "nvlink": {
        "tree": (0.6, 1.25, 28.0),
        "ring": (0.6, 1.9, 3.4),
        "nvls": (0.0, 0.0, 23.0),
        "nvls_tree": (0.0, 0.0, 23.0),
    },
    "pci": {
        "tree": (1.0, 1.9, 28.0),
        "ring": (1.0, 2.5, 5.7),
        "nvls": (0.0, 0.0, 0.0),
        "nvls_tree": (0.0, 0.0, 0.0),
    },
    "net": {
        "tree": (5.0, 8.5, 28.0),
        "ring": (2.7, 4.0, 14.0),
        "nvls": (0.0, 0.0, 18.0),
        "nvls_tree": (0.0, 0.0, 14.0),
    },
}
"""``hwLat`` (us) by link kind (NVLink, PCI, network), algorithm and protocol: tuning.cc."""
NET_OVERHEAD_US = 1.0
"""Network post overhead a ring step pays on several nodes (``getNetOverhead``, Intel hosts; x3
for Simple)."""
RING_PLATEAU = 1.4
"""Latency factor of the multi-node Simple ring all-reduce (``ncclTopoGetAlgoTime``, sm >= 80)."""
LL_MAX_BW_GBPS: dict[str, tuple[float, float, float]] = {
    "one_node": (39.0, 87.7, 87.7),
    "intel_host": (39.0, 39.0, 20.4),
}
"""``llMaxBws`` (GB/s): one node by generation (volta, ampere, hopper+); several nodes by node
count (1, 2, more) on an Intel host (the row NCCL uses when the CPU is not AMD): tuning.cc."""
PER_CHANNEL_CAPS_GBPS: dict[str, dict[str, tuple[float, float, float]]] = {
    "volta": {"ring_ll128": (20.0, 20.0, 20.0), "tree_ll128": (20.0, 20.0, 20.0),
              "tree": (26.5, 18.5, 10.0)},
    "ampere": {"ring_ll128": (20.0, 20.0, 20.0), "tree_ll128": (20.0, 20.0, 20.0),
               "tree": (24.0, 23.6, 17.8)},
    "hopper": {"ring_ll128": (36.7, 36.7, 36.7), "tree_ll128": (36.7, 36.7, 29.0),
               "tree": (38.7, 41.4, 36.0)},
}  # fmt: skip
"""``perChMaxRingLL128Bws``, ``perChMaxTreeLL128Bws``, ``perChMaxTreeBws`` (GB/s a channel) by
generation and node count (1, 2, more): tuning.cc. Blackwell and ``other`` take Hopper's and
Ampere's rows."""
TREE_CORRECTION: dict[str, tuple[float, ...]] = {
    "LL": (1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7,
           0.8, 0.9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8,
              0.9, 0.9, 0.9, 0.9, 1.0, 1.0),
    "Simple": (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6,
               0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9),
}  # fmt: skip
"""``treeCorrectionFactor`` by protocol, indexed by log2(bytes / 64) (64 B to 256 MiB):
tuning.cc."""
NCCL_BUFFSIZE_BYTES = 4 << 20
"""NCCL's default buffer of one channel's connection (``NCCL_BUFFSIZE``, 4 MiB: NCCL
documentation, environment variables)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Corrections:
    """The model's corrections to NCCL's tuning model (module docstring); all off is that model."""

    two_node_fill: bool = True
    """Two-node all-reduce pays its channels' buffer fill (``min(S, nCh BUFFSIZE) / algbw``)."""


CORRECTIONS = Corrections()
"""The declared model: every correction on."""
NO_CORRECTIONS = Corrections(two_node_fill=False)
"""NCCL's tuning model alone (the ablation's baseline)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """The model's time for one collective call, with the algorithm and protocol chosen."""

    num_bytes: int
    """Message size as nccl-tests prints it (the whole buffer; all-gather's output)."""
    time_us: float
    """Predicted time in microseconds."""
    algorithm: str
    """One of ``ALGORITHMS``."""
    protocol: str
    """One of ``PROTOCOLS``."""
    algbw_gbps: float
    """``num_bytes / time`` in GB/s (1e9 bytes), as nccl-tests."""
    busbw_gbps: float
    """``algbw * bus_factor`` (nccl-tests doc/PERFORMANCE.md)."""


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw: 2(p-1)/p all-reduce, (p-1)/p all-gather and reduce-scatter,
    1 broadcast (NVIDIA/nccl-tests doc/PERFORMANCE.md)."""
    p = world_size
    return {
        "all_reduce": 2.0 * (p - 1) / p,
        "all_gather": (p - 1) / p,
        "reduce_scatter": (p - 1) / p,
        "broadcast": 1.0,
    }[_check_collective(collective)]


def _check_collective(collective: str) -> str:
    if collective not in COLLECTIVES:
        raise ValueError(f"--collective {collective!r}: choose one of {', '.join(COLLECTIVES)}")
    return collective


def _node_index(num_nodes: int) -> int:
    return 0 if num_nodes == 1 else 1 if num_nodes == 2 else 2


def _generation_row(cluster: Cluster) -> str:
    gen = cluster.gpu_generation
    return {"blackwell": "hopper", "other": "ampere"}.get(gen, gen)


def _steps(collective: str, p: int, n: int) -> tuple[int, int]:
    """Ring steps and the inter-node ones among them (``nsteps``, ``nInterSteps``)."""
    if collective == "all_reduce":
        return 2 * (p - 1), (2 * n if n > 1 else 0)
    if collective in ("all_gather", "reduce_scatter"):
        return p - 1, n - 1
    return p, n  # broadcast


def _algorithms(collective: str, cluster: Cluster, num_nodes: int) -> list[str]:
    if collective != "all_reduce":
        return ["ring"]
    algos = ["ring", "tree"]
    if cluster.nvls and cluster.intra_fabric == "nvswitch":
        algos.append("nvls" if num_nodes == 1 else "nvls_tree")
    return algos


def bus_sides(algo: str, graphs: Graphs, cluster: Cluster, num_nodes: int) -> tuple[float, float]:
    """``graphs[a]->nChannels * bw`` (tuning.cc lines 175 to 178) as its two sides: (intra-node,
    network) GB/s, the bus bandwidth their minimum; the network side is inf on one node.

    One node: ``nChannels * bwIntra``. Two nodes: NCCL reads ``bwIntra`` of every graph (a
    tree's raised to at most twice ``bwInter`` by the search, so its network side is twice
    ``nChannels * bwInter``). Past two: ``bwInter``. On several nodes a ring or tree is also
    bounded by the NVLink its channels cross (``B_intra * g / (g - 1)``, the intra-node side),
    which binds only once that link is slower than described (a calibration's ``intra_bw``).
    NVLS: NVLink SHARP's ``bwIntra`` and, past one node, NVLSTree's ``bwInter`` (halved past two).
    """
    g = cluster.gpus_per_node
    b_intra = cluster.intra_bytes_per_s * cluster.intra_efficiency / 1e9
    intra_room = b_intra * g / (g - 1) if g > 1 else math.inf
    if algo in ("ring", "tree"):
        graph = graphs.ring if algo == "ring" else graphs.tree
        n = graph.num_channels
        if num_nodes == 1:
            return n * graph.bw_intra_gbps, math.inf
        net = n * graph.bw_inter_gbps
        if num_nodes == 2:
            intra = n * graph.bw_intra_gbps
            return min(intra, intra_room), 2.0 * net if algo == "tree" else net
        return intra_room, net
    nvls = graphs.nvls
    assert nvls is not None  # _algorithms offers NVLS only where the search found it
    intra = nvls.num_channels * nvls.bw_intra_gbps
    if algo == "nvls":  # tuning.cc line 176: min(bwIntra, bwInter), bwInter >= bwIntra here
        return intra, math.inf
    inter = nvls.bw_inter_gbps * (1.0 if num_nodes <= 2 else 0.5)  # line 177
    return intra, nvls.num_channels * inter


def latency_parts(
    cluster: Cluster,
    world_size: int,
    collective: str,
    algorithm: str,
    protocol: str,
    *,
    graphs: Graphs | None = None,
) -> tuple[float, float, float]:
    """An algorithm's latency (us) in NCCL's tuning model, as its three terms: ``baseLat``, the
    intra-node hops and the network hops (tuning.cc; module docstring, "Latency").

    Ring: ``nsteps - nInter`` intra hops (each at least the network post overhead on several
    nodes) and ``nInter`` network hops; a ring broadcast one hop where the ring graph keeps
    ``sameChannels``, else ``nsteps`` = p hops, every one a network hop on several nodes
    (NCCL's ``hw[a]``) and an intra-node hop on one, Simple at the tree's hop latency; tree
    ``2 (g - 1)`` intra and ``2 floor(log2 N)`` network hops; NVLS one intra hop (and one network
    hop past one node); NVLSTree one intra and ``2 floor(log2 N)`` network hops. ``graphs``: the
    search's graphs for this communicator where the caller has them (else searched here).
    """
    n = cluster.nodes_for(world_size)
    g = world_size // n
    pi = PROTOCOLS.index(protocol)
    intra_kind = "pci" if cluster.intra_fabric == "pcie" else "nvlink"
    intra_lat = HW_LAT_US[intra_kind][algorithm][pi]
    inter_lat = HW_LAT_US["net"][algorithm][pi]
    base = BASE_LAT_US[algorithm][pi]
    if algorithm == "ring" and collective == "broadcast":
        # lines 234 to 240: one hop where every channel follows one GPU order (sameChannels);
        # else nsteps hops of hw[a] (the network on several nodes, for every step), Simple at
        # the tree's latency ("some chunk latency")
        if (graphs or search(cluster, n)).ring.same_channels:
            return (base, 0.0, inter_lat) if n > 1 else (base, intra_lat, 0.0)
        nsteps, _ = _steps(collective, world_size, n)
        kind = "net" if n > 1 else intra_kind
        hop = HW_LAT_US[kind]["tree" if protocol == "Simple" else "ring"][pi]
        return (base, 0.0, nsteps * hop) if n > 1 else (base, nsteps * hop, 0.0)
    if algorithm == "ring":
        nsteps, ninter = _steps(collective, world_size, n)
        if n > 1:
            intra_lat = max(intra_lat, NET_OVERHEAD_US * (3.0 if protocol == "Simple" else 1.0))
        return base, (nsteps - ninter) * intra_lat, ninter * inter_lat
    levels = math.floor(math.log2(n))
    if algorithm == "tree":
        return base, 2.0 * (g - 1) * intra_lat, 2.0 * levels * inter_lat
    if algorithm == "nvls":
        return 0.0, intra_lat, inter_lat if n > 1 else 0.0
    return base, intra_lat, 2.0 * levels * inter_lat


def table(
    cluster: Cluster,
    world_size: int,
    collective: str = "all_reduce",
    algorithms: Sequence[str] | None = None,
    corrections: Corrections = CORRECTIONS,
) -> dict[tuple[str, str], tuple[float, float]]:
    """NCCL's tuning table for one communicator: (algorithm, protocol) -> (latency us, algbw GB/s).

    ``ncclTopoTuneModel`` (tuning.cc lines 120 to 340) over the graphs of
    :func:`~commprof.modeling.collective.nccl_search.search`.

    Args:
        cluster: The topology.
        world_size: Ranks (fills whole nodes, see ``Cluster.nodes_for``).
        collective: One of ``COLLECTIVES``.
        algorithms: Restrict the choice (as ``NCCL_ALGO`` does); None: every one enabled.
        corrections: Which corrections apply (none acts on the table today).

    Returns:
        The entries enabled on this hardware.
    """
    del corrections  # the table is NCCL's; the corrections act on predict's times
    _check_collective(collective)
    n = cluster.nodes_for(world_size)
    p = world_size
    g = p // n
    if algorithms is not None:
        bad = sorted(set(algorithms) - set(ALGORITHMS))
        if bad:
            raise ValueError(f"unknown algorithms {bad}; choose from {list(ALGORITHMS)}")
    graphs = search(cluster, n)
    ni = _node_index(n)
    gen = _generation_row(cluster)
    caps = PER_CHANNEL_CAPS_GBPS[gen]
    if n == 1:
        ll_max = LL_MAX_BW_GBPS["one_node"][0 if gen == "volta" else 1]
    else:
        ll_max = LL_MAX_BW_GBPS["intel_host"][ni]
    nsteps, _ = _steps(collective, p, n)
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for algo in _algorithms(collective, cluster, n):
        if algorithms is not None and algo not in algorithms:
            continue
        if algo.startswith("nvls") and graphs.nvls is None:
            continue
        nch = graphs.ring.num_channels if algo == "ring" else graphs.tree.num_channels
        for proto in PROTOCOLS:
            if algo.startswith("nvls") and proto != "Simple":
                continue
            if proto == "LL128" and not cluster.ll128_on(n):  # across nodes: its NIC path
                continue
            bus = min(bus_sides(algo, graphs, cluster, n))
            if algo == "ring" and proto == "LL":  # line 181: 1/3 on one node but all-reduce
                third = n == 1 and collective != "all_reduce"
                bus = min(ll_max, bus / (3.0 if third else 4.0))
            if algo == "ring" and proto == "LL128":  # line 182
                bus = min(bus * (0.7 if g < 2 else 0.92), nch * caps["ring_ll128"][ni])
            if algo == "tree":
                bus = min(bus * 0.92, nch * caps["tree"][ni])  # line 183
                if proto == "LL":
                    bus = min(bus / 3.8, ll_max)
                if proto == "LL128":
                    factor = 7.0 / 9.0 if n == 1 else 120.0 / 128.0
                    bus = min(bus * factor, nch * caps["tree_ll128"][ni])
                if g == 1:  # line 186: one GPU a node searches NCCL_TOPO_PATTERN_TREE
                    bus *= 0.85
            ratio = p / nsteps if algo == "ring" else 5.0 / 6.0 if algo.startswith("nvls") else 0.5
            algbw = bus * ratio
            lat = sum(latency_parts(cluster, world_size, collective, algo, proto, graphs=graphs))
            out[(algo, proto)] = (lat, algbw)
    if not out:
        raise ValueError(
            f"no algorithm of {list(algorithms or ())} is available for {collective} on "
            f"{cluster.name!r} at {world_size} ranks"
        )
    return out


def algo_time_us(
    entry: tuple[float, float],
    algorithm: str,
    protocol: str,
    num_bytes: int,
    *,
    collective: str,
    num_nodes: int,
    world_size: int,
    num_channels: int,
) -> float:
    """``ncclTopoGetAlgoTime``: ``lat + bytes / (1000 algbw)`` with the tree correction and the
    ring plateau.

    Args:
        entry: (latency us, algbw GB/s) from :func:`table`.
        algorithm: Its algorithm.
        protocol: Its protocol.
        num_bytes: Message size in bytes.
        collective: The collective.
        num_nodes: Nodes spanned.
        world_size: Ranks.
        num_channels: The communicator's channels (``comm->nChannels``, for the plateau's
            per-channel size).

    Returns:
        Time in microseconds.
    """
    lat, bw = entry
    log_size = int(math.log2(max(num_bytes >> 6, 1)))
    if algorithm == "tree" and log_size < len(TREE_CORRECTION[protocol]):
        bw *= TREE_CORRECTION[protocol][log_size]
    if (
        algorithm == "ring"
        and protocol == "Simple"
        and num_nodes > 1
        and collective == "all_reduce"
        and num_bytes / (num_channels * world_size) >= 64
    ):
        lat *= RING_PLATEAU
    return lat + num_bytes / (1000.0 * bw)


def predict(
    cluster: Cluster,
    world_size: int,
    sizes_bytes: Sequence[int],
    collective: str = "all_reduce",
    algorithms: Sequence[str] | None = None,
    corrections: Corrections = CORRECTIONS,
) -> list[Prediction]:
    """Predicted time of each message size, with the algorithm and protocol NCCL would pick.

    Args:
        cluster: The topology.
        world_size: Ranks.
        sizes_bytes: Message sizes (nccl-tests' ``size`` column).
        collective: One of ``COLLECTIVES``.
        algorithms: Restrict the algorithms (``NCCL_ALGO``); None: NCCL's choice.
        corrections: Which corrections apply (default: all, the declared model).

    Returns:
        One prediction per size, in order. The algorithm and protocol are NCCL's choice by its
        own model; the time adds the corrections that NCCL's model does not know.
    """
    if world_size < 2:
        raise ValueError(f"--world-size {world_size}: a collective needs >= 2 ranks")
    entries = table(cluster, world_size, collective, algorithms, corrections)
    n = cluster.nodes_for(world_size)
    channels = search(cluster, n).runtime_channels
    fill_bytes = channels * NCCL_BUFFSIZE_BYTES
    fill = corrections.two_node_fill and n == 2 and collective == "all_reduce"
    factor = bus_factor(collective, world_size)
    out = []
    for size in sizes_bytes:
        if size <= 0:
            raise ValueError(f"message size {size} must be > 0 bytes")
        best = min(
            (
                algo_time_us(e, a, pr, int(size), collective=collective, num_nodes=n,
                             world_size=world_size, num_channels=channels),
                a,
                pr,
            )
            for (a, pr), e in entries.items()
        )  # fmt: skip
        time_us = best[0]
        if fill:  # NCCL chose by its model; the buffers' fill is paid on top of it
            time_us += min(int(size), fill_bytes) / (1000.0 * entries[(best[1], best[2])][1])
        algbw = int(size) / time_us / 1e3
        out.append(
            Prediction(
                num_bytes=int(size),
                time_us=time_us,
                algorithm=best[1],
                protocol=best[2],
                algbw_gbps=algbw,
                busbw_gbps=algbw * factor,
            )
        )
    return out
