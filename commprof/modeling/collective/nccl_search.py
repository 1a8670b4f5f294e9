"""NCCL's topology search in closed form: channels and per-channel bandwidth of each graph.

NCCL does not plan a collective on a node's aggregate bandwidth. At start-up its search
(``ncclTopoCompute`` in NVIDIA/nccl src/graph/search.cc) finds, per algorithm, a graph of
``nChannels`` channels each carrying ``bwIntra`` GB/s inside a node and ``bwInter`` GB/s on the
network, and the tuning model (``ncclTopoTuneModel``, src/graph/tuning.cc) then reads
``busBw = nChannels * bw`` and caps it per channel (``perChMaxTreeBw``, ``perChMaxRingLL128Bw``,
...). The channel count therefore matters on its own: a DGX A100 pair (8 NICs of 25 GB/s) gets
8 ring channels at 24 GB/s, and 8 x 20 GB/s caps its LL128 protocols, where a node with 16 NICs
of 12.5 GB/s gets 16 channels at 12 GB/s and no cap binds. This module reproduces the search's
outcome for the topologies a :class:`~commprof.modeling.collective.clusters.Cluster` describes
(identical
GPUs on one fabric, NICs shared evenly). Line numbers are of NVIDIA/nccl at
b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2 (v2.20.3); the same rules hold through v2.30.

The search, as emulated here (``ncclTopoCompute``, search.cc lines 849 to 1033):

1. Speeds come from fixed arrays (``speedArrayIntra`` / ``speedArrayInter`` and their sm90
   variants, lines 839 to 845): the inter array when the system has a NIC, else the intra one.
   The first speed tried is the largest not above ``maxBw`` (the best GPU-to-NIC path, or GPU to
   GPU on one node) with ``speed * minChannels <= totalBw`` (a GPU's NVLink total; times
   ``g / (g - 1)`` for trees, line 910).
2. Pass 1 keeps the graph with the most ``nChannels * bw`` (``ncclTopoCompareGraphs``: NVLS
   prefers more channels first), stops once ``nChannels * bwInter >= totalBw`` (line 935), and
   lowers the speed while the next one is above 0.49 of the best found (line 980).
3. ``ncclTopoDupChannels`` (lines 824 to 837) doubles the channels at half the speed when
   ``bwIntra >= 25`` (not on sm90 below 50 GB/s with more than 4 channels).
4. Pass 1 also decides ``sameChannels`` (:func:`same_channels`): channels replaying one GPU order
   first, channels free of it kept where they carry more (lines 940 to 946).
5. Pass 2 (lines 1003 to 1019) raises a ring's speed while it still fits, a tree's ``bwIntra``
   while it is below twice ``bwInter`` (the two-node tree: the network carries half a ring's
   bytes), and NVLS's ``bwInter`` while below twice ``bwIntra``.

Capacity of one channel at speed ``s`` (``followPath`` subtracts ``s`` from every link a channel
crosses): a ring or tree crosses each GPU's NVLink once, except, on several nodes, at the GPU
where it leaves for its NIC (share ``(g - 1) / g`` per GPU with exits spread over the GPUs); a
NIC of rate ``r`` carries ``floor(r / s)`` channels; an NVLS channel (``ncclTopoSearchTryNvls``,
search.cc lines 332 to 364) loads every GPU's NVSwitch link once and its head GPU's
twice, so ``g`` heads fit where ``(g + 1) * s <= totalBw``. Rings may use at most
``MAXCHANNELS / 2`` = 16 channels, trees exactly the rings' count (init.cc lines 1013 to
1023), NVLS one a GPU (search.cc line 884).

What it leaves out: the search's PCI paths (a GPU and its NICs are taken to sit under one PCIe
switch, path PXB, so the NIC's rate, not PCIe, bounds ``maxBw``; a description whose NICs sit
behind the CPU, ``nic_path: phb``, keeps that rate and loses only LL128 across nodes,
``Cluster.ll128_on``); crossNic and timeouts (no effect on these symmetric topologies); RCCL's own
search (AMD meshes are searched as NCCL would).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from commprof.modeling.collective.clusters import Cluster

SPEEDS_INTRA_GBPS = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
"""``speedArrayIntra`` (search.cc line 839): one-node speeds before sm90."""
SPEEDS_INTER_GBPS = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0,
                     4.0, 3.0, 2.4, 1.2, 0.24, 0.12)  # fmt: skip
"""``speedArrayInter`` (line 840): speeds with a NIC before sm90."""
SM90_SPEEDS_INTRA_GBPS = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0)
"""``sm90SpeedArrayIntra`` (line 844)."""
SM90_SPEEDS_INTER_GBPS = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                          3.0, 2.4, 1.2, 0.24, 0.12)  # fmt: skip
"""``sm90SpeedArrayInter`` (line 845)."""
MAXCHANNELS = 32
"""``MAXCHANNELS`` (src/include/device.h): runtime channels at most."""
MAX_RING_CHANNELS = MAXCHANNELS // 2
"""``ringGraph.maxChannels = MAXCHANNELS/2`` (src/init.cc line 1015)."""
NEXT_SPEED_RATIO = 0.49
"""Pass 1 tries a lower speed only while it is above this share of the best found (line 980)."""
_ROUND = 1e-3
"""``SUB_ROUND``: the search subtracts bandwidths rounded to 1/1000 GB/s."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Graph:
    """One graph of NCCL's search (``struct ncclTopoGraph``'s fields the tuning reads)."""

    num_channels: int
    """``nChannels``."""
    bw_intra_gbps: float
    """``bwIntra``: GB/s a channel carries inside a node."""
    bw_inter_gbps: float
    """``bwInter``: GB/s a channel carries on the network (equal to ``bwIntra`` on one node)."""
    same_channels: bool = True
    """``sameChannels``: every channel follows channel 0's GPU order (:func:`same_channels`; a
    ring broadcast's latency in the tuning model depends on it). Decided for the ring graph, the
    one the tuning reads it from; True on the others."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Graphs:
    """The search's graphs for one communicator, and the channels it runs."""

    ring: Graph
    """``ringGraph``."""
    tree: Graph
    """``treeGraph``."""
    nvls: Graph | None
    """``nvlsGraph`` (None without NVLink SHARP)."""
    runtime_channels: int
    """``comm->nChannels`` after ``ncclTopoPostset`` (src/graph/connect.cc lines 442, 456):
    twice the graphs' channels (at most ``MAXCHANNELS``), twice again on multi-node sm90 rings
    above 45 GB/s a channel with fewer than 16."""


def _speeds(cluster: Cluster, multi_node: bool) -> tuple[float, ...]:
    sm90 = cluster.gpu_generation in ("hopper", "blackwell")
    if multi_node:
        return SM90_SPEEDS_INTER_GBPS if sm90 else SPEEDS_INTER_GBPS
    return SM90_SPEEDS_INTRA_GBPS if sm90 else SPEEDS_INTRA_GBPS


def _fit(capacity_gbps: float, load_gbps: float) -> int:
    """Channels of ``load_gbps`` each that fit in ``capacity_gbps`` (SUB_ROUND tolerance)."""
    if load_gbps <= 0:
        return MAXCHANNELS
    return math.floor(capacity_gbps / load_gbps + _ROUND)


def _intra_total_gbps(cluster: Cluster) -> float:
    """A GPU's links inside its node as NCCL counts them (``getTotalBw``: NVLink links times
    ``SM80/SM90_NVLINK_BW``, or its PCIe link): the description's per-GPU rate times its
    efficiency."""
    return cluster.intra_bytes_per_s * cluster.intra_efficiency / 1e9


def _path_max_gbps(cluster: Cluster, multi_node: bool) -> float:
    """``maxBw``: the best path's bandwidth from a GPU to a NIC (several nodes: the NIC's rate
    times ``net_efficiency``, the speed step NCCL reaches under it) or to another GPU (one node:
    through an NVSwitch or PCIe the whole link, in a mesh one peer's share)."""
    if multi_node:
        return cluster.nic_bytes_per_s * cluster.net_efficiency / 1e9
    total = _intra_total_gbps(cluster)
    mesh = cluster.intra_fabric in ("nvlink-mesh", "xgmi-mesh")
    return total / (cluster.gpus_per_node - 1) if mesh and cluster.gpus_per_node > 1 else total


def _chain_channels(
    cluster: Cluster, multi_node: bool, intra_gbps: float, inter_gbps: float
) -> int:
    """Ring or tree channels that fit at these speeds (see the module docstring)."""
    g = cluster.gpus_per_node
    out = MAX_RING_CHANNELS
    if g > 1:
        share = (g - 1) / g if multi_node else 1.0
        out = min(out, _fit(_intra_total_gbps(cluster), intra_gbps * share))
    if multi_node:
        if inter_gbps > _path_max_gbps(cluster, True) + _ROUND:
            return 0
        out = min(out, cluster.nics_per_node * _fit(cluster.nic_bytes_per_s / 1e9, inter_gbps))
    return out


def same_channels(cluster: Cluster, multi_node: bool, num_channels: int, speed_gbps: float) -> bool:
    """Whether the ring graph pass 1 found keeps ``sameChannels`` (search.cc lines 861 to 946).

    The search first asks every channel to replay channel 0's GPU order (``FORCED_ORDER_REPLAY``,
    lines 578 to 584), then, unless that was already as fast as a GPU's links, searches again
    with each channel free (``sameChannels = 0``) and keeps that graph where it carries more
    (``ncclTopoCompareGraphs``: strictly more ``nChannels * bw``). Replayed channels enter and
    leave a node at the same GPU, so through the NICs local to that GPU only (every NIC where a
    node has one GPU, ``nics / g`` where NICs are spread evenly, else one); on one node an
    NVLink or xGMI mesh gives one GPU order one peer's links (``_path_max_gbps``) where an
    NVSwitch or PCIe gives every order the whole link.

    Args:
        cluster: The topology.
        multi_node: Several nodes (channels through the NICs).
        num_channels: The ring's channels after pass 1 (before ``ncclTopoDupChannels``).
        speed_gbps: Their speed.

    Returns:
        True where channels replaying one order carry as many channels at that speed.
    """
    g = cluster.gpus_per_node
    if multi_node:
        local = cluster.nics_per_node if g == 1 else max(1, cluster.nics_per_node // g)
        return num_channels <= local * _fit(cluster.nic_bytes_per_s / 1e9, speed_gbps)
    if cluster.intra_fabric in ("nvlink-mesh", "xgmi-mesh") and g > 2:
        return num_channels <= _fit(_path_max_gbps(cluster, False), speed_gbps)
    return True


def _first_index(speeds: Sequence[float], max_gbps: float, total_gbps: float, min_ch: int) -> int:
    """Search.cc line 911: the first speed not above ``maxBw`` nor ``totalBw / minChannels``."""
    i = 0
    while i < len(speeds) - 1 and (speeds[i] > max_gbps or speeds[i] * min_ch > total_gbps):
        i += 1
    return i


def _pass_one(speeds: Sequence[float], start: int, channels_at, total_gbps: float,
              min_ch: int, nvls: bool = False) -> tuple[int, float]:  # fmt: skip
    """Pass 1: the best (channels, speed) from ``start`` down (search.cc lines 915 to 988)."""
    best_n, best_s = 0, 0.0
    i = start
    while True:
        n = channels_at(speeds[i])
        if n >= min_ch and n > 0:
            if nvls:
                better = n > best_n or n * speeds[i] > best_n * best_s
            else:
                better = n * speeds[i] > best_n * best_s
            if better:
                best_n, best_s = n, speeds[i]
        if best_n and best_n * best_s >= total_gbps - _ROUND:
            break  # line 935: as fast as a GPU's links
        if i == len(speeds) - 1 or (best_n and speeds[i + 1] / best_s <= NEXT_SPEED_RATIO):
            break
        i += 1
    return best_n, best_s


def _dup(n: int, s: float, max_ch: int, sm90: bool) -> tuple[int, float]:
    """``ncclTopoDupChannels`` (search.cc lines 824 to 837)."""
    if s < 25.0 or (sm90 and s < 50.0 and n > 4):
        return n, s
    dup = min(2 * n, max_ch)
    return dup, s / math.ceil(dup / n)


def _raise(speeds: Sequence[float], s: float, fits, stop) -> float:
    """Pass 2: step the speed up while ``fits`` it and ``stop`` does not (lines 1003 to 1019)."""
    i = speeds.index(s) if s in speeds else next(j for j, v in enumerate(speeds) if v < s)
    while i > 0 and not stop(s) and fits(speeds[i - 1]):
        i -= 1
        s = speeds[i]
    return s


def search(cluster: Cluster, num_nodes: int) -> Graphs:
    """The graphs NCCL's search finds for ``num_nodes`` nodes of ``cluster`` (module docstring).

    A description's ``num_channels``, where given, overrides the ring's and tree's channel count
    (as ``NCCL_MIN_NCHANNELS`` / ``NCCL_MAX_NCHANNELS`` pin it), their speeds kept.
    """
    multi = num_nodes > 1
    g = cluster.gpus_per_node
    sm90 = cluster.gpu_generation in ("hopper", "blackwell")
    speeds = _speeds(cluster, multi)
    total = _intra_total_gbps(cluster)
    max_bw = _path_max_gbps(cluster, multi)

    # Ring (init.cc: minChannels 1, maxChannels MAXCHANNELS/2).
    def ring_at(s: float) -> int:
        return _chain_channels(cluster, multi, s, s)

    start = _first_index(speeds, max_bw, total, 1)
    n, s = _pass_one(speeds, start, ring_at, total, 1)
    if n == 0:  # NCCL falls back to one channel at 0.1 GB/s (line 1024); say so instead
        raise ValueError(
            f"cluster {cluster.name!r}: NCCL's search finds no ring at {num_nodes} node(s); "
            "check intra_bytes_per_s, nic_bytes_per_s and net_efficiency"
        )
    same = same_channels(cluster, multi, n, s)
    n, s = _dup(n, s, MAX_RING_CHANNELS, sm90)
    s = _raise(speeds, s, lambda v: ring_at(v) >= n, lambda v: False)
    ring = Graph(num_channels=n, bw_intra_gbps=s, bw_inter_gbps=s, same_channels=same)

    # Tree (init.cc: min = max = the ring's channels). Pass 1 at one speed for both sides, then
    # bwIntra alone is raised while below twice bwInter (and the NVLinks carry it).
    tree_total = total * g / (g - 1) if g > 1 else total
    tstart = _first_index(speeds, max_bw, tree_total, n)
    tn, ts = _pass_one(speeds, tstart, lambda v: min(ring_at(v), n), total, n)
    if tn == 0:
        tn, ts = n, s
    ts_intra = ts
    if multi and g > 1:
        ts_intra = _raise(
            speeds, ts, lambda v: _chain_channels(cluster, True, v, ts) >= tn,
            lambda v: v >= 2.0 * ts - _ROUND,
        )  # fmt: skip
    elif not multi:
        ts_intra = ts = _raise(speeds, ts, lambda v: ring_at(v) >= tn, lambda v: False)
    tree = Graph(num_channels=tn, bw_intra_gbps=ts_intra, bw_inter_gbps=ts)

    nvls = _nvls(cluster, num_nodes, speeds, total, max_bw) if _has_nvls(cluster) else None

    if cluster.num_channels is not None:
        ring = replace(ring, num_channels=cluster.num_channels)
        tree = Graph(num_channels=cluster.num_channels, bw_intra_gbps=tree.bw_intra_gbps,
                     bw_inter_gbps=tree.bw_inter_gbps)  # fmt: skip
    runtime = min(MAXCHANNELS, 2 * min(ring.num_channels, tree.num_channels))
    if sm90 and multi and ring.bw_intra_gbps > 45.0 and runtime < 16:  # connect.cc line 456
        runtime = min(MAXCHANNELS, 2 * runtime)
    return Graphs(ring=ring, tree=tree, nvls=nvls, runtime_channels=runtime)


def _has_nvls(cluster: Cluster) -> bool:
    """NVLS needs an NVSwitch and sm90 (search.cc line 882)."""
    return (
        cluster.nvls
        and cluster.intra_fabric == "nvswitch"
        and cluster.gpu_generation in ("hopper", "blackwell")
    )


def _nvls(cluster: Cluster, num_nodes: int, speeds: Sequence[float], total: float,
          max_bw: float) -> Graph | None:  # fmt: skip
    """The NVLS graph: one channel a head GPU, each loading every GPU's NVSwitch link once and
    its head's twice; on several nodes each head also sends ``bwInter`` to a NIC."""
    g = cluster.gpus_per_node
    multi = num_nodes > 1

    def heads_at(s: float) -> int:
        heads = min(g, _fit(total, s) - 1)
        if multi:
            if s > max_bw + _ROUND:
                return 0
            heads = min(heads, cluster.nics_per_node * _fit(cluster.nic_bytes_per_s / 1e9, s))
        return max(heads, 0)

    min_ch = 1 if multi else g  # search.cc line 890: one node pulls from every GPU
    start = _first_index(speeds, max_bw if multi else total, total * g / max(g - 1, 1), 1)
    n, s = _pass_one(speeds, start, heads_at, total, min_ch, nvls=True)
    if n == 0:
        return None
    # Pass 2 raises bwInter alone while it is below twice bwIntra (line 1010); with no NIC
    # nothing bounds it and the tuning's min(bwIntra, bwInter) is bwIntra.
    if multi:
        s_inter = _raise(
            speeds, s,
            lambda v: v <= max_bw + _ROUND
            and cluster.nics_per_node * _fit(cluster.nic_bytes_per_s / 1e9, v) >= n,
            lambda v: v >= 2.0 * s - _ROUND,
        )  # fmt: skip
    else:
        s_inter = s
    return Graph(num_channels=n, bw_intra_gbps=s, bw_inter_gbps=s_inter)
