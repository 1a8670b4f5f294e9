"""The collective model with a calibration's factors on its terms: the model's front door.

:func:`predict` gives each size's time with its 80 % interval and the algorithm and protocol
NCCL would pick; :func:`fitted_table` is ``collectives.table`` with the factors of a
:class:`~commprof.modeling.collective.calibration_fit.Fit` on each term (the terms are in the
docstring of :mod:`commprof.modeling.collective.calibration`). The interval and the scale correction
are :mod:`commprof.modeling.collective.scale_rule`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from commprof.modeling.collective.calibration_fit import DESCRIPTION, Fit
from commprof.modeling.collective.clusters import Cluster
from commprof.modeling.collective.collectives import (
    CORRECTIONS,
    NCCL_BUFFSIZE_BYTES,
    Corrections,
    algo_time_us,
    bus_factor,
    bus_sides,
    latency_parts,
    table,
)
from commprof.modeling.collective.nccl_search import search
from commprof.modeling.collective.scale_rule import RULE, ScaleRule, halfwidth_log, net_loss

SOFTMIN_POWER = 8.0
"""``k`` of the smooth minimum ``(x^-k + y^-k)^(-1/k)`` of a channel's two sides."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectivePrediction:
    """A predicted collective time with its 80 % interval and what NCCL would pick."""

    num_bytes: int
    """Message size as nccl-tests prints it."""
    time_us: float
    """Predicted time (us)."""
    time_us_low: float
    """Low end of the 80 % interval (us)."""
    time_us_high: float
    """High end of the 80 % interval (us)."""
    algorithm: str
    """``collectives.ALGORITHMS``."""
    protocol: str
    """``collectives.PROTOCOLS``."""
    algbw_gbps: float
    """``num_bytes / time`` (GB/s)."""
    busbw_gbps: float
    """``algbw x bus_factor``."""


def _softmin(x: float, y: float) -> float:
    if math.isinf(y):
        return x
    k = SOFTMIN_POWER
    return float((x**-k + y**-k) ** (-1.0 / k))


def _physical_sides(algo: str, graphs, cluster: Cluster, num_nodes: int) -> tuple[float, float]:
    """The two sides a factor scales: ``collectives.bus_sides``, except that on several nodes a
    ring's or tree's intra-node side is the NVLink its channels cross (``B_intra g / (g - 1)``),
    not the search's channel speed (which the NIC set: NCCL reads it on two nodes, but it is the
    network's rate, so the network's factor must move it)."""
    intra, net = bus_sides(algo, graphs, cluster, num_nodes)
    if num_nodes > 1 and algo in ("ring", "tree"):
        g = cluster.gpus_per_node
        b_intra = cluster.intra_bytes_per_s * cluster.intra_efficiency / 1e9
        intra = b_intra * g / (g - 1) if g > 1 else math.inf
    return intra, net


def fitted_table(
    cluster: Cluster,
    world_size: int,
    collective: str,
    fit: Fit,
    algorithms: Sequence[str] | None = None,
    rule: ScaleRule | None = None,
) -> dict[tuple[str, str], tuple[float, float]]:
    """``collectives.table`` with the fit's factors on each term: (latency us, algbw GB/s)."""
    entries = table(cluster, world_size, collective, algorithms=algorithms)
    n = cluster.nodes_for(world_size)
    rule = RULE if rule is None else rule
    losses = {algo: net_loss(fit, n, rule, algo) for algo, _ in entries}
    if fit == DESCRIPTION and set(losses.values()) == {1.0}:
        return entries
    graphs = search(cluster, n)
    out = {}
    for (algo, proto), (_, algbw) in entries.items():
        net_bw, net_lat = fit.net_bw * losses[algo], fit.net_lat / losses[algo]
        intra, net = _physical_sides(algo, graphs, cluster, n)
        s_intra = fit.nvls_bw if algo.startswith("nvls") else fit.intra_bw
        ratio = _softmin(intra * s_intra, net * net_bw) / _softmin(intra, net)
        base, hops_intra, hops_net = latency_parts(
            cluster, world_size, collective, algo, proto, graphs=graphs
        )
        lat = base * fit.base_lat + hops_intra * fit.intra_lat + hops_net * net_lat
        out[(algo, proto)] = (lat, algbw * ratio * (fit.ll128_bw if proto == "LL128" else 1.0))
    return out


def predict(
    cluster: Cluster,
    world_size: int,
    sizes_bytes: Sequence[int],
    collective: str = "all_reduce",
    fit: Fit = DESCRIPTION,
    algorithms: Sequence[str] | None = None,
    corrections: Corrections = CORRECTIONS,
    rule: ScaleRule = RULE,
) -> list[CollectivePrediction]:
    """Predicted time of each size with its 80 % interval (the front door of the model).

    With ``fit`` the description alone, the times are ``collectives.predict``'s on up to two
    nodes; past them the description's scale loss applies (``ScaleRule``).

    Args:
        cluster: The topology.
        world_size: Ranks.
        sizes_bytes: Message sizes (nccl-tests' ``size`` column).
        collective: One of ``COLLECTIVES``.
        fit: Factors from :func:`~commprof.modeling.collective.calibration.calibrate`
            (default: the description alone).
        algorithms: Restrict the algorithms (``NCCL_ALGO``); None: the model's choice.
        corrections: Which corrections apply (default: all, the declared model).
        rule: The interval rule (default: the committed one).

    Returns:
        One prediction per size, in order.
    """
    if world_size < 2:
        raise ValueError(f"--world-size {world_size}: a collective needs >= 2 ranks")
    entries = fitted_table(cluster, world_size, collective, fit, algorithms, rule)
    n = cluster.nodes_for(world_size)
    channels = search(cluster, n).runtime_channels
    fill_bytes = fit.fill * channels * NCCL_BUFFSIZE_BYTES
    if fit.calibrated_nodes:  # a fit predicts with the corrections it was fitted with
        corrections = replace(corrections, two_node_fill=fit.two_node_fill)
    fill = corrections.two_node_fill and n == 2 and collective == "all_reduce"
    factor = bus_factor(collective, world_size)
    half = math.exp(halfwidth_log(fit, n, rule))
    anchor = fit.anchor(world_size, collective)
    if anchor is not None:  # the log's own spread between the sizes it measured
        half = math.exp(max(anchor.loo_log_q80, rule.calibrated_floor_log))
    out = []
    for size in sizes_bytes:
        if size <= 0:
            raise ValueError(f"message size {size} must be > 0 bytes")
        eta = 1.0 / (1.0 + math.sqrt(fit.knee_bytes * channels / size))
        sized = {k: (lat, bw * eta) for k, (lat, bw) in entries.items()}
        best = min(
            (algo_time_us(e, a, pr, int(size), collective=collective, num_nodes=n,
                          world_size=world_size, num_channels=channels), a, pr)
            for (a, pr), e in sized.items()
        )  # fmt: skip
        time_us = best[0]
        if fill:  # chosen by the model; the buffers' fill is paid on top of it
            time_us += min(float(size), fill_bytes) / (1000.0 * sized[(best[1], best[2])][1])
        if anchor is not None:
            time_us *= math.exp(anchor.log_correction(int(size)))
        algbw = int(size) / time_us / 1e3
        out.append(
            CollectivePrediction(
                num_bytes=int(size), time_us=time_us, time_us_low=time_us / half,
                time_us_high=time_us * half, algorithm=best[1], protocol=best[2],
                algbw_gbps=algbw, busbw_gbps=algbw * factor,
            )
        )  # fmt: skip
    return out
