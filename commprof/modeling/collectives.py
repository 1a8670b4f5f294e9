"""A collective-time model over a cluster's topology, after NCCL's own tuning model.

NCCL picks, for every call, the algorithm and protocol with the least predicted time
``lat + bytes / (1000 * algbw)`` (microseconds, GB/s), from a table it fills at start-up
(``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` in NVIDIA/nccl src/graph/tuning.cc; the
constants below are those of commit b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2, NCCL 2.19/2.20).
This module fills the same table from a :class:`~commprof.modeling.clusters.Cluster` instead of
NCCL's topology search, and makes the same choice. Pure functions, no state.

Hierarchy. ``p`` ranks fill ``N = p / g`` nodes of ``g`` GPUs. Two bandwidths bound everything
(bytes/s per GPU, per direction):

    B_intra = intra_bytes_per_s * intra_efficiency        (NVSwitch / mesh / PCIe of one GPU)
    B_net   = nics_per_node * nic_bytes_per_s * net_efficiency   (all NICs of one node)

``B_net`` is a node's: NCCL runs one ring (channel) or more per NIC, each ring leaving the node
through its own NIC, so a ring's inter-node hop carries ``1/nics`` of the data on each NIC.
NCCL's "bus bandwidth" of each algorithm (busBw) is then:

    ring:      min(B_intra, B_net)                     (B_intra on one node)
    tree:      0.92 * (B_intra on one node, min(B_intra, 2 B_net) on two, min(B_intra, B_net) past
               two), capped at nCh * perChMaxTree
    NVLS:      B_intra (one node, NVLink SHARP switch)
    NVLSTree:  min(B_intra, B_net if N <= 2 else B_net / 2)

and per protocol: LL divides the ring's by 4 and the tree's by 3.8 (capped at ``LL_MAX_BW``),
LL128 takes 0.92 of the ring's (0.7 with one rank a node) and 7/9 (one node) or 120/128 of the
tree's, capped per channel. The algorithm bandwidth is ``busBw * p / nsteps`` for a ring
(``nsteps`` = 2(p-1) for all-reduce, p-1 for all-gather and reduce-scatter, p for broadcast),
``busBw / 2`` for a tree and ``busBw * 5/6`` for NVLS.

Latency (us) per algorithm, with ``intra``/``inter`` the hardware latencies ``HW_LAT_US`` of the
link kind inside a node and of the network:

    ring:      base + (nsteps - nInter) * intra + nInter * inter,  nInter = 2N (all-reduce, N>1)
    tree:      base + 2 ((g - 1) intra + log2(N) inter)            (latency grows with log N)
    NVLS:      intra (+ inter on several nodes);  NVLSTree: base + intra + 2 log2(N) inter

On several nodes a ring step costs at least the network post overhead (1 us, 3 us for Simple),
and the multi-node Simple ring all-reduce pays NCCL's "plateau" factor 1.4. Tree bandwidths at
mid sizes take NCCL's ``TREE_CORRECTION`` factors.

Corrections (:class:`Corrections`, each with an ablation row in benchmarks/README.md; all off is
NCCL's tuning model as the first version of this module had it):

- ``two_node_tree_cap``: on two nodes NCCL's search raises a tree's intra-node bandwidth only while
  it is below twice the network's (``bwIntra < bwInter*2`` in ``ncclTopoCompute``, NVIDIA/nccl
  src/graph/search.cc), so a two-node tree's bus bandwidth is ``min(B_intra, 2 B_net)``, not
  ``B_intra`` (the "tree effect": a tree sends half a ring's bytes between two nodes).
- ``two_node_fill``: an all-reduce spanning exactly two nodes takes ``min(S, nCh * BUFFSIZE) /
  algbw`` longer than NCCL's model (``BUFFSIZE`` = ``NCCL_BUFFSIZE_BYTES``, NCCL's default
  network buffer of a channel): the transfer reaches its rate only once every channel's buffer
  has filled, so the first ``nCh * BUFFSIZE`` bytes move at about half of it. Chosen on
  development logs (every two-node log ramps up this way over 1 MiB to 1 GiB; the one log past two
  nodes does not), the constant NCCL's own, not fitted.

What it leaves out (limits): NCCL's search may find fewer channels or slower rings than the
description allows (a misconfigured NIC, PCIe switches shared by two GPUs); CollNet (SHARP in the
IB switches) is not modelled (it needs the switch plugin, which a description cannot tell);
NVLS for all-gather and reduce-scatter is left out (ring only); RCCL's tuning differs from NCCL's
and is approximated by the same table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from commprof.modeling.clusters import Cluster

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

    two_node_tree_cap: bool = True
    """Two-node trees at most twice the network's bus bandwidth (NCCL's search.cc)."""
    two_node_fill: bool = True
    """Two-node all-reduce pays its channels' buffer fill (``min(S, nCh BUFFSIZE) / algbw``)."""


CORRECTIONS = Corrections()
"""The declared model: every correction on."""
NO_CORRECTIONS = Corrections(two_node_tree_cap=False, two_node_fill=False)
"""NCCL's tuning model alone (the ablation's baseline)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Scales fitted to a cluster's nccl-tests logs (``nccl_tests.calibrate``); 1.0 is the
    description alone."""

    intra_scale: float = 1.0
    """Multiplies ``B_intra``."""
    net_scale: float = 1.0
    """Multiplies ``B_net``."""
    latency_scale: float = 1.0
    """Multiplies every latency."""
    nvls_scale: float = 1.0
    """Multiplies the NVLS and NVLSTree bus bandwidth in place of ``intra_scale`` (NVLink SHARP's
    own reduction rate, which the switch sets, not the ring's use of the links): a correction,
    off by default: on development data it did not help (benchmarks/README.md, its ablation)."""

    def __post_init__(self) -> None:
        for name in ("intra_scale", "net_scale", "latency_scale", "nvls_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")


NO_CALIBRATION = Calibration()
"""The description alone."""


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


def table(
    cluster: Cluster,
    world_size: int,
    collective: str = "all_reduce",
    calibration: Calibration = NO_CALIBRATION,
    algorithms: Sequence[str] | None = None,
    corrections: Corrections = CORRECTIONS,
) -> dict[tuple[str, str], tuple[float, float]]:
    """NCCL's tuning table for one communicator: (algorithm, protocol) -> (latency us, algbw GB/s).

    Args:
        cluster: The topology.
        world_size: Ranks (fills whole nodes, see ``Cluster.nodes_for``).
        collective: One of ``COLLECTIVES``.
        calibration: Scales on the two bandwidths and on latency.
        algorithms: Restrict the choice (as ``NCCL_ALGO`` does); None: every one enabled.
        corrections: Which corrections apply (``two_node_tree_cap`` acts here).

    Returns:
        The entries enabled on this hardware.
    """
    _check_collective(collective)
    n = cluster.nodes_for(world_size)
    p = world_size
    g = p // n
    if algorithms is not None:
        bad = sorted(set(algorithms) - set(ALGORITHMS))
        if bad:
            raise ValueError(f"unknown algorithms {bad}; choose from {list(ALGORITHMS)}")
    b_intra = cluster.intra_bytes_per_s * cluster.intra_efficiency * calibration.intra_scale / 1e9
    b_net = (
        cluster.nics_per_node * cluster.nic_bytes_per_s * cluster.net_efficiency / 1e9
        * calibration.net_scale
    )  # fmt: skip
    ni = _node_index(n)
    gen = _generation_row(cluster)
    caps = PER_CHANNEL_CAPS_GBPS[gen]
    nch = cluster.num_channels
    if n == 1:
        ll_max = LL_MAX_BW_GBPS["one_node"][0 if gen == "volta" else 1]
    else:
        ll_max = LL_MAX_BW_GBPS["intel_host"][ni]
    intra_kind = "pci" if cluster.intra_fabric == "pcie" else "nvlink"
    nsteps, ninter = _steps(collective, p, n)
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for algo in _algorithms(collective, cluster, n):
        if algorithms is not None and algo not in algorithms:
            continue
        for pi, proto in enumerate(PROTOCOLS):
            if algo.startswith("nvls") and proto != "Simple":
                continue
            if proto == "LL128" and not cluster.ll128:
                continue
            if algo == "ring":
                bus = b_intra if n == 1 else min(b_intra, b_net)
            elif algo == "tree":
                bus = b_intra if n <= 2 else min(b_intra, b_net)
                if n == 2 and corrections.two_node_tree_cap:
                    bus = min(bus, 2.0 * b_net)  # search.cc: bwIntra < bwInter*2
            elif algo == "nvls":  # the switch reduces: its own scale, not the links' intra_scale
                bus = b_intra / calibration.intra_scale * calibration.nvls_scale
            else:  # nvls_tree
                bus = min(b_intra / calibration.intra_scale, b_net if n <= 2 else b_net / 2.0)
                bus *= calibration.nvls_scale
            if algo == "ring" and proto == "LL":
                bus = min(ll_max, bus / 4.0)
            if algo == "ring" and proto == "LL128":
                bus = min(bus * (0.7 if g < 2 else 0.92), nch * caps["ring_ll128"][ni])
            if algo == "tree":
                bus = min(bus * 0.92, nch * caps["tree"][ni])
                if proto == "LL":
                    bus = min(bus / 3.8, ll_max)
                if proto == "LL128":
                    factor = 7.0 / 9.0 if n == 1 else 120.0 / 128.0
                    bus = min(bus * factor, nch * caps["tree_ll128"][ni])
            ratio = p / nsteps if algo == "ring" else 5.0 / 6.0 if algo.startswith("nvls") else 0.5
            algbw = bus * ratio
            intra_lat = HW_LAT_US[intra_kind][algo][pi]
            inter_lat = HW_LAT_US["net"][algo][pi]
            lat = BASE_LAT_US[algo][pi]
            if algo == "ring":
                if n > 1:
                    intra_lat = max(
                        intra_lat, NET_OVERHEAD_US * (3.0 if proto == "Simple" else 1.0)
                    )
                lat += (nsteps - ninter) * intra_lat + ninter * inter_lat
            elif algo == "tree":
                lat += 2.0 * ((g - 1) * intra_lat + math.floor(math.log2(n)) * inter_lat)
            elif algo == "nvls":
                lat = intra_lat + (inter_lat if n > 1 else 0.0)
            else:
                lat += intra_lat + 2.0 * math.floor(math.log2(n)) * inter_lat
            out[(algo, proto)] = (lat * calibration.latency_scale, algbw)
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
        num_channels: Channels (for the plateau's per-channel size).

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
    calibration: Calibration = NO_CALIBRATION,
    algorithms: Sequence[str] | None = None,
    corrections: Corrections = CORRECTIONS,
) -> list[Prediction]:
    """Predicted time of each message size, with the algorithm and protocol NCCL would pick.

    Args:
        cluster: The topology.
        world_size: Ranks.
        sizes_bytes: Message sizes (nccl-tests' ``size`` column).
        collective: One of ``COLLECTIVES``.
        calibration: Fitted scales (default: the description alone).
        algorithms: Restrict the algorithms (``NCCL_ALGO``); None: NCCL's choice.
        corrections: Which corrections apply (default: all, the declared model).

    Returns:
        One prediction per size, in order. The algorithm and protocol are NCCL's choice by its
        own model; the time adds the corrections that NCCL's model does not know.
    """
    if world_size < 2:
        raise ValueError(f"--world-size {world_size}: a collective needs >= 2 ranks")
    entries = table(cluster, world_size, collective, calibration, algorithms, corrections)
    n = cluster.nodes_for(world_size)
    fill_bytes = cluster.num_channels * NCCL_BUFFSIZE_BYTES
    fill = corrections.two_node_fill and n == 2 and collective == "all_reduce"
    factor = bus_factor(collective, world_size)
    out = []
    for size in sizes_bytes:
        if size <= 0:
            raise ValueError(f"message size {size} must be > 0 bytes")
        best = min(
            (
                algo_time_us(e, a, pr, int(size), collective=collective, num_nodes=n,
                             world_size=world_size, num_channels=cluster.num_channels),
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
