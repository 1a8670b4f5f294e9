"""Calibration of the collective model on a cluster's nccl-tests logs, and its intervals.

The description's model (:mod:`commprof.modeling.collective.collectives`, NCCL's tuning model
over the graphs of its topology search) splits every (algorithm, protocol) time into physical
terms; a :class:`Fit` multiplies each term by a fitted factor, so the fitted model scales to
other world sizes by each algorithm's own rule (docs/collective_model.md):

- bandwidth: ``intra_bw`` on the intra-node side of a channel, ``net_bw`` on its network side,
  ``nvls_bw`` on NVLink SHARP's; the two sides combine by a smooth minimum (``SOFTMIN_POWER``),
  normalised so that the description's bus bandwidth is unchanged at factors of 1: a side that
  binds gets its gradient, and neither is stuck where the other binds;
- latency: ``base_lat`` on NCCL's ``baseLat``, ``intra_lat`` on every intra-node hop, ``net_lat``
  on every network hop (a ring's ``2 (p - 1)`` steps, a tree's ``2 log2 N`` levels; held at the
  description unless asked for, ``HELD``);
- protocol: ``ll128_bw`` on LL128's bandwidth, relative to Simple's (where a log shows both);
- a size-dependent efficiency where the logs bend: the bandwidth term is divided by
  ``eta(S) = 1 / (1 + sqrt(knee_bytes / (S / nCh)))`` (``nCh`` the communicator's channels):
  a channel's pipeline reaches its rate only for chunks well above ``knee_bytes``; 0 (the
  description) is no such loss;
- ``fill`` on the two-node buffer fill of ``collectives.Corrections.two_node_fill``
  (``min(S, fill x nCh x BUFFSIZE) / algbw``), fitted only where a calibration keeps that
  correction (off in the declared one, ``CALIBRATED``).

NCCL's choice of algorithm and protocol is the fitted model's (the least fitted time), so the time
of a size is one candidate's, smooth in its factors. :func:`calibrate` fits the factors by least
squares on ``log(predicted / measured)`` over sizes >= ``FIT_MIN_BYTES`` with a weak prior
(``PRIOR_WIDTH``, log space) that decides what the logs cannot: a factor the logs do not see stays
1.0, and where two sides are tied the looser prior (the network's, a vendor rate through a plugin;
the NVLink's is NCCL's own constant) takes the change.

At a world size and collective that a fitted log measured, a prediction follows that log
(:class:`Anchor`, in sample only): the fitted model times the log's own residual there,
interpolated in log size between the sizes it measured. Elsewhere the factors alone predict:
what one world size measured beyond the model's terms does not carry to another.

Every prediction has an 80 % interval: :func:`predict` widens it by :data:`RULE`
(``collective_scale.yaml``, written by ``benchmarks/bench_collective_scale.py`` from the
development systems only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from importlib import resources
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from commprof.modeling.collective.clusters import Cluster
from commprof.modeling.collective.collectives import (
    COLLECTIVES,
    CORRECTIONS,
    NCCL_BUFFSIZE_BYTES,
    Corrections,
    algo_time_us,
    bus_factor,
    bus_sides,
    latency_parts,
    table,
)
from commprof.modeling.collective.nccl_log_collective import check_collective, log_world_size
from commprof.modeling.collective.nccl_log_runs import NcclTestsLog
from commprof.modeling.collective.nccl_search import search
from commprof.yamlio import load_yaml

CALIBRATED = Corrections(two_node_fill=False)
"""The corrections a calibration is made with: none. The two-node buffer fill of the description
(``collectives.CORRECTIONS``) is left to the fitted terms: fitted at two nodes it does not carry
to more (benchmarks/README.md, the scale benchmark's ablation on development systems)."""
FIT_MIN_BYTES = 1 << 20
"""Smallest size calibration fits (1 MiB: gradient buckets are larger; below it latency noise of
a few microseconds dominates)."""
FACTOR_BOUNDS = (0.02, 10.0)
"""Bounds of a fitted factor (the fill may go near 0: a log that does not ramp)."""
SOFTMIN_POWER = 8.0
"""``k`` of the smooth minimum ``(x^-k + y^-k)^(-1/k)`` of a channel's two sides."""
PRIOR_WEIGHT = 0.02
"""A factor ``exp(width)`` away from 1.0 costs as much as one size missed by 2 %."""
PRIOR_WIDTH: dict[str, float] = {
    "intra_bw": 0.25,
    "net_bw": 1.0,
    "nvls_bw": 0.5,
    "base_lat": 1.0,
    "intra_lat": 1.0,
    "net_lat": 1.0,
    "ll128_bw": 0.5,
    "knee_bytes": 3.0,
    "fill": 2.0,
}
"""Width of each factor's prior (log space): NVLink's rate is NCCL's own constant, the network's a
vendor rate through a plugin, latencies and the fill are the least known."""
KNEE_SCALE_BYTES = 65536.0
"""``knee_bytes`` is fitted as ``KNEE_SCALE_BYTES x exp(x)``, its prior centred on
``KNEE_PRIOR_BYTES`` (no loss to speak of: the description)."""
KNEE_PRIOR_BYTES = 16.0
"""Where the prior holds ``knee_bytes`` (a 1 MiB message on 32 channels loses 1.6 % to it)."""
PARAMETERS = tuple(PRIOR_WIDTH)
"""The factors a calibration may fit, in :class:`Fit`'s order."""
HELD = ("net_lat",)
"""Factors the declared calibration holds at the description (run 2 of the scale benchmark,
chosen on its development systems): a network hop's latency fitted on one or two nodes does not
carry to more nodes' rings and trees; a call's excess latency is ``base_lat``'s."""
FITTED = tuple(p for p in PARAMETERS if p not in HELD)
"""The factors :func:`calibrate` fits unless told otherwise."""
SEEN_SENSITIVITY = 0.01
"""A factor the logs see: doubling it moves some fitted size's time by more than 1 %."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Anchor:
    """One world size's measured times as a fitted model's residual (in sample only)."""

    world_size: int
    """Ranks of the log(s)."""
    collective: str
    """Their collective."""
    num_bytes: tuple[int, ...]
    """Sizes measured, increasing."""
    log_residual: tuple[float, ...]
    """``log(measured / fitted model)`` at each size (the median over logs of one size)."""
    loo_log_q80: float
    """80th percentile, over sizes >= the fit's smallest, of ``|log error|`` when each size is
    left out and interpolated from its neighbours: the interval's half-width here."""

    def log_correction(self, num_bytes: int) -> float:
        """The residual at a size: interpolated in log size, held beyond the sizes measured."""
        xs = np.log2(np.asarray(self.num_bytes, dtype=float))
        return float(np.interp(math.log2(num_bytes), xs, self.log_residual))


def leave_one_out(
    num_bytes: Sequence[int], log_residual: Sequence[float], min_bytes: int
) -> np.ndarray:
    """``|log error|`` of each size >= ``min_bytes`` interpolated from the others (an anchor's
    accuracy between the sizes it measured)."""
    xs, res = np.log2(np.asarray(num_bytes, dtype=float)), np.asarray(log_residual)
    out = []
    for i, size in enumerate(num_bytes):
        if size >= min_bytes and len(xs) > 1:
            rest = np.delete(np.arange(len(xs)), i)
            out.append(abs(res[i] - float(np.interp(xs[i], xs[rest], res[rest]))))
    return np.array(out)


def _anchor(
    world_size: int, collective: str, rows: dict[int, list[float]], min_bytes: int
) -> Anchor:
    sizes = sorted(rows)
    res = [float(np.median(rows[b])) for b in sizes]
    loo = leave_one_out(sizes, res, min_bytes)
    return Anchor(
        world_size=world_size, collective=collective, num_bytes=tuple(sizes),
        log_residual=tuple(res), loo_log_q80=float(np.quantile(loo, 0.8)) if loo.size else 0.0,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Fit:
    """Factors on the description's terms (1.0: the description alone) and the fit's spread."""

    intra_bw: float = 1.0
    """Multiplies the intra-node side of a ring's or tree's bus bandwidth."""
    net_bw: float = 1.0
    """Multiplies the network side of every algorithm's bus bandwidth."""
    nvls_bw: float = 1.0
    """Multiplies NVLS's and NVLSTree's intra-node side (NVLink SHARP's reduction rate)."""
    base_lat: float = 1.0
    """Multiplies NCCL's ``baseLat``."""
    intra_lat: float = 1.0
    """Multiplies every intra-node hop's latency."""
    net_lat: float = 1.0
    """Multiplies every network hop's latency."""
    ll128_bw: float = 1.0
    """Multiplies LL128's bandwidth (relative to Simple's)."""
    knee_bytes: float = 0.0
    """Chunk size (bytes a channel) of the efficiency ``eta(S)`` (module docstring); 0: none."""
    fill: float = 1.0
    """Multiplies the two-node buffer fill (``nCh x NCCL_BUFFSIZE``)."""
    residual_log_q80: float = 0.0
    """80th percentile of ``|log(predicted / measured)|`` over the sizes fitted (0: no fit)."""
    calibrated_nodes: int = 0
    """Most nodes of a log fitted (0: the description alone)."""
    seen: tuple[str, ...] = ()
    """The factors the logs see (``SEEN_SENSITIVITY``); the others stay 1.0."""
    two_node_fill: bool = False
    """Whether the fit was made (and predicts) with the two-node buffer fill
    (``collectives.Corrections``); off in the declared calibration (``CALIBRATED``)."""
    anchors: tuple[Anchor, ...] = ()
    """The fitted logs' world sizes, whose predictions follow the logs (in sample only)."""

    def anchor(self, world_size: int, collective: str) -> Anchor | None:
        """The anchor of a world size and collective, if a fitted log measured them."""
        for a in self.anchors:
            if (a.world_size, a.collective) == (world_size, collective):
                return a
        return None

    def __post_init__(self) -> None:
        for name in PARAMETERS:
            value = getattr(self, name)
            least_ok = value >= 0 if name == "knee_bytes" else value > 0
            if not (math.isfinite(value) and least_ok):
                raise ValueError(f"Fit.{name} must be finite and > 0, got {value!r}")

    def factors(self) -> dict[str, float]:
        """The fitted factors by name."""
        return {name: getattr(self, name) for name in PARAMETERS}


DESCRIPTION = Fit()
"""The description alone."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleRule:
    """What the development systems fix (``collective_scale.yaml``): how wide an 80 % interval
    is, in ``|log(predicted / measured)|``, and the network's loss past the nodes fitted."""

    description_log: float
    """Half-width of the description alone (its 80th percentile on development systems)."""
    calibrated_floor_log: float
    """Least half-width of a calibrated prediction (added to nothing below its own in-sample
    80th percentile)."""
    per_doubling_log: float
    """Added per doubling of nodes past the most nodes fitted."""
    net_loss_per_doubling: float
    """The scale correction: past ``max(2, calibrated_nodes)`` nodes a calibrated network side
    (bandwidth and hop latency) runs at ``1 / (1 + c log2(N / max(2, calibrated_nodes)))`` of
    its fitted rate, ``c`` this value (a larger fabric's congestion and adaptive routing, which
    one or two nodes cannot show)."""
    description_loss_per_doubling: float
    """The same correction on the description alone, past two nodes: its published rates are
    a fabric's best, which a larger fabric's traffic does not reach either."""


def _load_rule() -> ScaleRule:
    text = resources.files("commprof.modeling.collective").joinpath("collective_scale.yaml")
    data = load_yaml(text.read_text("utf-8"), "collective_scale.yaml")
    names = {f.name for f in fields(ScaleRule)}
    if not isinstance(data, dict) or set(data) != names:
        raise ValueError(f"collective_scale.yaml: needs exactly the keys {sorted(names)}")
    return ScaleRule(**{k: float(v) for k, v in data.items()})


RULE = _load_rule()
"""The committed rule (fitted on development systems by benchmarks/bench_collective_scale.py)."""


def halfwidth_log(fit: Fit, num_nodes: int, rule: ScaleRule = RULE) -> float:
    """Half-width of the 80 % interval in log space at ``num_nodes``.

    Description alone: ``rule.description_log``. Calibrated: the fit's own in-sample 80th
    percentile (at least ``calibrated_floor_log``) plus ``per_doubling_log`` per doubling of nodes
    past the most nodes fitted: the validation's spread grows with extrapolation distance.
    """
    if fit.calibrated_nodes == 0:
        return rule.description_log
    base = max(fit.residual_log_q80, rule.calibrated_floor_log)
    return base + rule.per_doubling_log * max(0.0, math.log2(num_nodes / fit.calibrated_nodes))


def interval_basis(fit: Fit, world_size: int, collective: str, nodes: int) -> str:
    """Where a prediction and its interval come from, in words, for output."""
    if fit.anchor(world_size, collective) is not None:
        return (
            f"the fitted log(s) measured {world_size} ranks: their own times, interpolated "
            "between their sizes; the interval from leaving each size out"
        )
    if fit.calibrated_nodes == 0:
        return "the description's spread on the development systems' nccl-tests logs"
    return (
        f"the calibration's residuals on its logs, widened for {nodes} node(s) past the "
        f"{fit.calibrated_nodes} fitted (rule fitted on development systems)"
    )


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


def net_loss(fit: Fit, num_nodes: int, rule: ScaleRule) -> float:
    """The scale correction's factor on the network side at ``num_nodes``: past the nodes fitted
    (``ScaleRule.net_loss_per_doubling``), or past two nodes with no fit
    (``ScaleRule.description_loss_per_doubling``); 1.0 within them."""
    if fit.calibrated_nodes == 0:
        c, reach = rule.description_loss_per_doubling, 2
    else:
        c, reach = rule.net_loss_per_doubling, max(2, fit.calibrated_nodes)
    return 1.0 / (1.0 + c * max(0.0, math.log2(num_nodes / reach)))


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
    loss = net_loss(fit, n, RULE if rule is None else rule)
    if fit == DESCRIPTION and loss == 1.0:
        return entries
    net_bw, net_lat = fit.net_bw * loss, fit.net_lat / loss
    graphs = search(cluster, n)
    out = {}
    for (algo, proto), (_, algbw) in entries.items():
        intra, net = _physical_sides(algo, graphs, cluster, n)
        s_intra = fit.nvls_bw if algo.startswith("nvls") else fit.intra_bw
        ratio = _softmin(intra * s_intra, net * net_bw) / _softmin(intra, net)
        base, hops_intra, hops_net = latency_parts(cluster, world_size, collective, algo, proto)
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
        fit: Factors from :func:`calibrate` (default: the description alone).
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


def _points(
    cluster: Cluster, logs: Sequence[NcclTestsLog], collective: str, min_bytes: int
) -> list[tuple[int, list[int], np.ndarray]]:
    if collective not in COLLECTIVES:
        raise ValueError(f"--collective {collective!r}: choose one of {', '.join(COLLECTIVES)}")
    points = []
    for log in logs:
        check_collective(log, collective, COLLECTIVES)
        p = log_world_size(log)
        cluster.nodes_for(p)
        kept = [r for r in log.rows if r.num_bytes >= min_bytes]
        if kept:
            points.append((p, [r.num_bytes for r in kept], np.array([r.time_us for r in kept])))
    if not points:
        raise ValueError(f"no row of {len(logs)} log(s) is >= {min_bytes} bytes; nothing to fit")
    return points


def calibrate(
    cluster: Cluster,
    logs: Sequence[NcclTestsLog],
    collective: str = "all_reduce",
    *,
    min_bytes: int = FIT_MIN_BYTES,
    algorithms: Sequence[str] | None = None,
    corrections: Corrections = CALIBRATED,
    parameters: Sequence[str] | None = None,
    prior_weight: float = PRIOR_WEIGHT,
) -> Fit:
    """Fit the factors of :class:`Fit` to nccl-tests logs of ``cluster`` (module docstring).

    Args:
        cluster: The description to calibrate.
        logs: Logs of that cluster and collective (any world sizes it allows), all used.
        collective: The logs' collective.
        min_bytes: Smallest size fitted.
        algorithms: Restrict the algorithms as the runs did (``NCCL_ALGO``), or None.
        corrections: The model's corrections the fit is made with.
        parameters: The factors fitted (the others stay 1.0): an ablation's set; None:
            ``FITTED`` (``fill`` only with the two-node fill on).
        prior_weight: The prior's weight (``PRIOR_WEIGHT``; near 0: the ablation without it).

    Returns:
        The fit, its in-sample spread and the factors the logs see.
    """
    points = _points(cluster, logs, collective, min_bytes)
    nodes = max(cluster.nodes_for(p) for p, _, _ in points)
    if nodes == 1:  # no network to learn from: the description's network model stays whole
        corrections = replace(corrections, two_node_fill=CORRECTIONS.two_node_fill)
    if parameters is None:
        parameters = [p for p in FITTED if p != "fill" or corrections.two_node_fill]
    unknown = sorted(set(parameters) - set(PARAMETERS))
    if unknown:
        raise ValueError(f"unknown parameters {unknown}; choose from {list(PARAMETERS)}")
    names = [p for p in PARAMETERS if p in parameters]
    widths = np.array([PRIOR_WIDTH[p] for p in names])
    scale = np.array([KNEE_SCALE_BYTES if p == "knee_bytes" else 1.0 for p in names])
    centre = np.log(
        np.array([KNEE_PRIOR_BYTES if p == "knee_bytes" else 1.0 for p in names]) / scale
    )

    def fit_of(x: np.ndarray) -> Fit:
        factors = dict(zip(names, (scale * np.exp(x)).tolist(), strict=True))
        return Fit(**factors, two_node_fill=corrections.two_node_fill, calibrated_nodes=nodes)

    def errors(fit: Fit) -> np.ndarray:
        out = []
        for p, sizes, measured in points:
            rows = predict(cluster, p, sizes, collective, fit, algorithms, corrections)
            out.append(np.log(np.array([r.time_us for r in rows]) / measured))
        return np.concatenate(out)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.concatenate([errors(fit_of(x)), prior_weight * (x - centre) / widths])

    low = np.where(scale > 1, math.log(1e-5), math.log(FACTOR_BOUNDS[0]))
    high = np.where(scale > 1, math.log(1e2), math.log(FACTOR_BOUNDS[1]))
    bounds = (low, high)
    best = None
    for start in _starts(centre):
        res = least_squares(residuals, start, bounds=bounds, diff_step=1e-3, x_scale=1.0)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    x = best.x
    seen = tuple(n for n in names if _sensitivity(fit_of(x), n, errors) > SEEN_SENSITIVITY)
    if seen and len(seen) < len(names):  # what the logs cannot see goes back to the description
        free = np.array([n in seen for n in names])

        def partial(xs: np.ndarray) -> np.ndarray:
            return residuals(np.where(free, _put(free, xs), centre))

        res = least_squares(partial, x[free], bounds=(low[free], high[free]), diff_step=1e-3)
        x = np.where(free, _put(free, res.x), centre)
    fit = fit_of(x)
    err = np.abs(errors(fit))
    fit = replace(fit, residual_log_q80=float(np.quantile(err, 0.8)), seen=seen)
    return replace(fit, anchors=_anchors(cluster, logs, collective, fit, algorithms, min_bytes))


def _anchors(
    cluster: Cluster,
    logs: Sequence[NcclTestsLog],
    collective: str,
    fit: Fit,
    algorithms: Sequence[str] | None,
    min_bytes: int,
) -> tuple[Anchor, ...]:
    """Each fitted world size's residual against ``fit``, over every size its logs measured."""
    by_size: dict[int, dict[int, list[float]]] = {}
    for log in logs:
        p = log_world_size(log)
        rows = [r for r in log.rows if r.num_bytes > 0 and r.time_us > 0]
        if not rows:
            continue
        model = predict(cluster, p, [r.num_bytes for r in rows], collective, fit, algorithms)
        for r, m in zip(rows, model, strict=True):
            by_size.setdefault(p, {}).setdefault(r.num_bytes, []).append(
                math.log(r.time_us / m.time_us)
            )
    return tuple(_anchor(p, collective, rows, min_bytes) for p, rows in sorted(by_size.items()))


def _put(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.zeros(mask.shape)
    out[mask] = values
    return out


def _starts(centre: np.ndarray) -> list[np.ndarray]:
    """The prior's centre, and every factor halved and doubled together (the choice of algorithm
    is piecewise: another start leaves a kink the first stopped at)."""
    return [centre, centre - math.log(2.0), centre + math.log(2.0)]


def _sensitivity(fit: Fit, name: str, errors) -> float:
    """Largest change of a fitted size's log time when ``name`` doubles."""
    value: float = getattr(fit, name)
    change: dict[str, Any] = {name: value * 2.0 if value else KNEE_SCALE_BYTES}
    moved = replace(fit, **change)
    return float(np.max(np.abs(errors(moved) - errors(fit))))
