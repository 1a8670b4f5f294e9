"""Main's calibration of the collective model before issue #41, frozen for the benchmark's
comparison (``bench_collective_scale.py``: "main's model"). Not the project's calibration, which
is :mod:`commprof.modeling.collective.calibration`.

A copy of main's code at 1b177ce (``commprof/modeling/collectives.py``'s ``Calibration``,
``_bus_bw``, ``table`` with its latency terms (``_latency_us``) and ``predict``, and
``nccl_tests.calibrate``), NCCL's constants and helpers imported from the model:
:func:`calibrate` fits three scales (intra-node bandwidth, network bandwidth, every latency) by
least squares on ``log(predicted / measured)``, the scales applied inside the ``min()`` of the
bus bandwidth, so a side that does not bind gets no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from commprof.modeling.collective.clusters import Cluster
from commprof.modeling.collective.collectives import (
    ALGORITHMS,
    BASE_LAT_US,
    COLLECTIVES,
    CORRECTIONS,
    HW_LAT_US,
    LL_MAX_BW_GBPS,
    NCCL_BUFFSIZE_BYTES,
    NET_OVERHEAD_US,
    PER_CHANNEL_CAPS_GBPS,
    PROTOCOLS,
    Corrections,
    Prediction,
    _algorithms,
    _check_collective,
    _generation_row,
    _node_index,
    _steps,
    algo_time_us,
    bus_factor,
)
from commprof.modeling.collective.nccl_search import Graphs, search
from commprof.modeling.collective.nccl_tests import NcclTestsLog, check_collective, log_world_size

FIT_MIN_BYTES = 1 << 20
"""Smallest size calibration fits."""
SCALE_BOUNDS = (0.1, 10.0)
"""Bounds of a fitted scale."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Scales fitted to a cluster's nccl-tests logs (``calibration.calibrate``); 1.0 is the
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


def _bus_bw(
    algo: str, graphs: Graphs, cluster: Cluster, num_nodes: int, calibration: Calibration
) -> float:
    """``graphs[a]->nChannels * bw`` (tuning.cc lines 175 to 178), the calibration's scales on
    the intra-node and network sides of each channel.

    One node: ``nChannels * bwIntra``. Two nodes: NCCL reads ``bwIntra`` of every graph (a
    tree's raised to at most twice ``bwInter`` by the search, so its network side, twice
    ``nChannels * bwInter``, bounds it once scaled). Past two: ``bwInter``. On several nodes a
    ring or tree is also bounded by the NVLink its channels cross (``B_intra * g / (g - 1)``),
    which only binds once ``intra_scale`` is below 1.
    """
    g = cluster.gpus_per_node
    si, sn = calibration.intra_scale, calibration.net_scale
    b_intra = cluster.intra_bytes_per_s * cluster.intra_efficiency / 1e9 * si
    intra_room = b_intra * g / (g - 1) if g > 1 else math.inf
    if algo in ("ring", "tree"):
        graph = graphs.ring if algo == "ring" else graphs.tree
        n = graph.num_channels
        if num_nodes == 1:
            return n * graph.bw_intra_gbps * si
        net = n * graph.bw_inter_gbps * sn
        if num_nodes == 2:
            intra = n * graph.bw_intra_gbps * si
            return min(intra, 2.0 * net if algo == "tree" else net, intra_room)
        return min(net, intra_room)
    nvls = graphs.nvls
    assert nvls is not None  # _algorithms offers NVLS only where the search found it
    # NVLink SHARP's own rate: nvls_scale, not the links' intra_scale (Calibration).
    intra = nvls.bw_intra_gbps * calibration.nvls_scale
    if algo == "nvls":  # tuning.cc line 176: min(bwIntra, bwInter), bwInter >= bwIntra here
        return nvls.num_channels * intra
    inter = nvls.bw_inter_gbps * sn * (1.0 if num_nodes <= 2 else 0.5)  # line 177
    return nvls.num_channels * min(intra, inter)


def _latency_us(cluster: Cluster, world_size: int, collective: str, algo: str, proto: str) -> float:
    """An algorithm's latency (us) as main's ``table`` computed it, frozen (summed from the
    same three terms, ``baseLat``, intra-node hops, network hops, as the model's
    ``collectives.latency_parts`` before it moved: a ring broadcast without NCCL's
    ``sameChannels`` pays a hop a rank there now, and main's calibration must not move with
    it)."""
    n = cluster.nodes_for(world_size)
    g = world_size // n
    pi = PROTOCOLS.index(proto)
    intra_kind = "pci" if cluster.intra_fabric == "pcie" else "nvlink"
    intra_lat = HW_LAT_US[intra_kind][algo][pi]
    inter_lat = HW_LAT_US["net"][algo][pi]
    base = BASE_LAT_US[algo][pi]
    if algo == "ring" and collective == "broadcast":
        # main's reading of lines 234 to 236: a broadcast pipelines, one hop's latency
        return sum((base, 0.0, inter_lat) if n > 1 else (base, intra_lat, 0.0))
    if algo == "ring":
        nsteps, ninter = _steps(collective, world_size, n)
        if n > 1:
            intra_lat = max(intra_lat, NET_OVERHEAD_US * (3.0 if proto == "Simple" else 1.0))
        return sum((base, (nsteps - ninter) * intra_lat, ninter * inter_lat))
    levels = math.floor(math.log2(n))
    if algo == "tree":
        return sum((base, 2.0 * (g - 1) * intra_lat, 2.0 * levels * inter_lat))
    if algo == "nvls":
        return sum((0.0, intra_lat, inter_lat if n > 1 else 0.0))
    return sum((base, intra_lat, 2.0 * levels * inter_lat))


def table(
    cluster: Cluster,
    world_size: int,
    collective: str = "all_reduce",
    calibration: Calibration = NO_CALIBRATION,
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
        calibration: Scales on the two bandwidths and on latency.
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
            if proto == "LL128" and not cluster.ll128:
                continue
            bus = _bus_bw(algo, graphs, cluster, n, calibration)
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
            lat = _latency_us(cluster, world_size, collective, algo, proto)
            out[(algo, proto)] = (lat * calibration.latency_scale, algbw)
    if not out:
        raise ValueError(
            f"no algorithm of {list(algorithms or ())} is available for {collective} on "
            f"{cluster.name!r} at {world_size} ranks"
        )
    return out


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


def calibrate(
    cluster: Cluster,
    logs: Sequence[NcclTestsLog],
    collective: str = "all_reduce",
    *,
    min_bytes: int = FIT_MIN_BYTES,
    algorithms: Sequence[str] | None = None,
    nvls_correction: bool = False,
    corrections: Corrections = CORRECTIONS,
) -> Calibration:
    """Fit the model's scales to nccl-tests logs of ``cluster``.

    Least squares on ``log(predicted / measured)`` (relative error, so small and large sizes
    weigh alike) over every row >= ``min_bytes`` of every log. The network scale is fitted only
    where a log spans several nodes; otherwise it stays 1.0 (the logs say nothing of it).

    Args:
        cluster: The description to calibrate.
        logs: Logs of that cluster (any world sizes it allows).
        collective: The logs' collective.
        min_bytes: Smallest size fitted.
        algorithms: Restrict the algorithms as the runs did (``NCCL_ALGO``), or None.
        nvls_correction: Fit NVLS's own scale on NVLink SHARP clusters (the correction of
            ``Calibration.nvls_scale``); False: the ablation without it.
        corrections: The model's corrections the fit is made with (``collectives.Corrections``).

    Returns:
        The fitted calibration.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"--collective {collective!r}: choose one of {', '.join(COLLECTIVES)}")
    points: list[tuple[int, list[int], np.ndarray]] = []
    multi_node = False
    for log in logs:
        check_collective(log, collective, COLLECTIVES)
        p = log_world_size(log)
        multi_node |= cluster.nodes_for(p) > 1
        kept = [r for r in log.rows if r.num_bytes >= min_bytes]
        if kept:
            points.append((p, [r.num_bytes for r in kept], np.array([r.time_us for r in kept])))
    if not points:
        raise ValueError(f"no row of {len(logs)} log(s) is >= {min_bytes} bytes; nothing to fit")
    names = ["intra_scale", "latency_scale"] + (["net_scale"] if multi_node else [])
    if nvls_correction and cluster.nvls:
        names.append("nvls_scale")

    def residuals(log_scales: np.ndarray) -> np.ndarray:
        cal = Calibration(**dict(zip(names, np.exp(log_scales).tolist(), strict=True)))
        out = []
        for p, sizes, measured in points:
            pred = np.array([r.time_us for r in predict(cluster, p, sizes, collective, cal,
                                                        algorithms, corrections)])  # fmt: skip
            out.append(np.log(pred / measured))
        return np.concatenate(out)

    bounds = (math.log(SCALE_BOUNDS[0]), math.log(SCALE_BOUNDS[1]))
    fit = least_squares(residuals, np.zeros(len(names)), bounds=bounds, diff_step=1e-3)
    return Calibration(**dict(zip(names, np.exp(fit.x).tolist(), strict=True)))
