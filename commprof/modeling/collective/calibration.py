"""Calibration of the collective model on a cluster's nccl-tests logs.

The description's model (:mod:`commprof.modeling.collective.collectives`, NCCL's tuning model
over the graphs of its topology search) splits every (algorithm, protocol) time into physical
terms; a :class:`~commprof.modeling.collective.calibration_fit.Fit` multiplies each term by a
fitted factor, so the fitted model scales to other world sizes by each algorithm's own rule
(docs/collective_model.md):

- bandwidth: ``intra_bw`` on the intra-node side of a channel, ``net_bw`` on its network side,
  ``nvls_bw`` on NVLink SHARP's; the two sides combine by a smooth minimum
  (``fitted_model.SOFTMIN_POWER``), normalised so that the description's bus bandwidth is
  unchanged at factors of 1: a side that binds gets its gradient, and neither is stuck where the
  other binds;
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
(``calibration_fit.PRIOR_WIDTH``, log space) that decides what the logs cannot: a factor the logs
do not see stays 1.0, and where two sides are tied the looser prior (the network's, a vendor rate
through a plugin; the NVLink's is NCCL's own constant) takes the change.

At a world size and collective that a fitted log measured, a prediction follows that log
(:class:`~commprof.modeling.collective.calibration_fit.Anchor`, in sample only): the fitted
model times the log's own residual there, interpolated in log size between the sizes it measured.
Elsewhere the factors alone predict: what one world size measured beyond the model's terms does
not carry to another.

Every prediction has an 80 % interval: the fitted model's front door
(:func:`commprof.modeling.collective.fitted_model.predict`) widens it by
:data:`commprof.modeling.collective.scale_rule.RULE` (``collective_scale.yaml``, written by
``benchmarks/bench_collective_scale.py`` from the development systems only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from commprof.modeling.collective.calibration_fit import (
    PARAMETERS,
    PRIOR_WIDTH,
    Anchor,
    Fit,
    leave_one_out,
)
from commprof.modeling.collective.clusters import Cluster
from commprof.modeling.collective.collectives import COLLECTIVES, CORRECTIONS, Corrections
from commprof.modeling.collective.fitted_model import predict
from commprof.modeling.collective.nccl_log_collective import check_collective, log_world_size
from commprof.modeling.collective.nccl_log_runs import NcclTestsLog

CALIBRATED = Corrections(two_node_fill=False)
"""The corrections a calibration is made with: none. The two-node buffer fill of the description
(``collectives.CORRECTIONS``) is left to the fitted terms: fitted at two nodes it does not carry
to more (benchmarks/README.md, the scale benchmark's ablation on development systems)."""
FIT_MIN_BYTES = 1 << 20
"""Smallest size calibration fits (1 MiB: gradient buckets are larger; below it latency noise of
a few microseconds dominates)."""
FACTOR_BOUNDS = (0.02, 10.0)
"""Bounds of a fitted factor (the fill may go near 0: a log that does not ramp)."""
PRIOR_WEIGHT = 0.02
"""A factor ``exp(width)`` away from 1.0 costs as much as one size missed by 2 %."""
KNEE_SCALE_BYTES = 65536.0
"""``knee_bytes`` is fitted as ``KNEE_SCALE_BYTES x exp(x)``, its prior centred on
``KNEE_PRIOR_BYTES`` (no loss to speak of: the description)."""
KNEE_PRIOR_BYTES = 16.0
"""Where the prior holds ``knee_bytes`` (a 1 MiB message on 32 channels loses 1.6 % to it)."""
HELD = ("net_lat",)
"""Factors the declared calibration holds at the description (run 2 of the scale benchmark,
chosen on its development systems): a network hop's latency fitted on one or two nodes does not
carry to more nodes' rings and trees; a call's excess latency is ``base_lat``'s."""
FITTED = tuple(p for p in PARAMETERS if p not in HELD)
"""The factors :func:`calibrate` fits unless told otherwise."""
SEEN_SENSITIVITY = 0.01
"""A factor the logs see: doubling it moves some fitted size's time by more than 1 %."""


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
