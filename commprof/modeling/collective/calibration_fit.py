"""What a calibration of the collective model gives: factors on the description's terms and anchors.

:class:`Fit` holds the factors (1.0: the description alone; the terms are in the docstring of
:mod:`commprof.modeling.collective.calibration`) and the fit's spread; each :class:`Anchor`
holds one world size's measured times as the fitted model's residual, which a prediction at that
world size follows (in sample only). :func:`commprof.modeling.collective.calibration.calibrate`
makes them; :func:`commprof.modeling.collective.fitted_model.predict` uses them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
PARAMETERS = tuple(PRIOR_WIDTH)
"""The factors a calibration may fit, in :class:`Fit`'s order."""


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
    """Chunk size (bytes a channel) of the efficiency ``eta(S)`` (the docstring of
    :mod:`commprof.modeling.collective.calibration`); 0: none."""
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
