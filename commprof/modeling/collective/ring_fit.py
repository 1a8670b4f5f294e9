"""Fit the ring all-reduce model to measured all-reduce times.

Three fits of T(n, p) = 2(p-1) alpha + 2((p-1)/p) n beta (Patarasuk and Yuan
2009; see ``cost_model``):

* ``fit_alpha_only``: the seed's fit. Plain least squares of alpha, with beta
  fixed from a (published) bandwidth. Meaningful only when the bandwidth is
  the link's real one.
* ``fit_alpha_beta``: joint fit for a measured link, weighted by 1/t so that
  the squared RELATIVE error is minimised (small messages, which carry the
  latency, count as much as large ones; plain least squares lets the large
  messages dominate and alpha go negative; nccl-tests doc/PERFORMANCE.md).
  Gives 95 % confidence intervals (Student t) and relative residuals.
* ``fit_piecewise``: ring fits on contiguous size ranges with breakpoints chosen
  to minimise the total squared relative error, for transports that switch
  algorithm or protocol by size (NCCL, and gloo on loopback).

A fit's scores (MAPE, leave-one-out) are :mod:`commprof.modeling.collective.fit_scores`; the
fits of a dataset, per link, and their JSON file are
:mod:`commprof.modeling.collective.dataset_fits`.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
from scipy import stats

from commprof.modeling.collective.cost_model import LinkParams, ring_allreduce_ns, ring_coefficients

CONFIDENCE = 0.95
"""Confidence level of the reported intervals."""
MIN_POINTS = 3
"""Fewest measurements a fit accepts (two parameters plus one degree of freedom)."""


class CalibrationWarning(UserWarning):
    """A fit succeeded but its result needs care (for example a clamped parameter)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RingFit:
    """A fitted ring model on one size range."""

    method: str
    """``alpha-only`` or ``alpha-beta``."""
    alpha_ns: float
    """Fitted per-message latency in ns."""
    beta_ns_per_byte: float
    """Fitted (or fixed) ns per byte; 1e9 / beta is the bandwidth in bytes/s."""
    alpha_ci_ns: tuple[float, float]
    """95 % confidence interval of alpha."""
    beta_ci_ns_per_byte: tuple[float, float]
    """95 % confidence interval of beta (a point interval when beta was fixed)."""
    num_points: int
    """Measurements used."""
    min_bytes: int
    """Smallest size fitted."""
    max_bytes: int
    """Largest size fitted."""
    residuals_rel: tuple[float, ...]
    """(measured - predicted) / measured, per point, in input order."""

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Per-direction bandwidth implied by beta (inf when beta is 0)."""
        return 1e9 / self.beta_ns_per_byte if self.beta_ns_per_byte > 0 else float("inf")

    def link(self) -> LinkParams:
        """The fit as cost-model link parameters."""
        return LinkParams(alpha_ns=self.alpha_ns, beta_ns_per_byte=self.beta_ns_per_byte)

    def predict_ns(self, num_bytes: npt.ArrayLike, world_size: npt.ArrayLike) -> np.ndarray:
        """Ring-model prediction in ns for sizes and world sizes."""
        return ring_allreduce_ns(num_bytes, world_size, self.link())

    # the Link protocol (commprof.modeling.collective.link)
    def label(self, world_size: int) -> str:
        """The fit's method, latency and bandwidth."""
        return (
            f"ring fit ({self.method}: alpha {self.alpha_ns / 1e3:g} us, "
            f"{self.bandwidth_bytes_per_s / 1e9:.3g} GB/s) at p={world_size}"
        )

    def interval(self) -> tuple[RingFit, RingFit]:
        """The fit with alpha and beta at the lower, then the upper, ends of their intervals."""
        return self.bound(0), self.bound(1)

    def bound(self, side: int) -> RingFit:
        """The fit with alpha and beta at the lower (side 0) or upper (1) end of their
        intervals (an end that is not finite keeps the fitted value; a negative one is 0)."""
        alpha, beta = self.alpha_ci_ns[side], self.beta_ci_ns_per_byte[side]
        return replace(
            self,
            alpha_ns=max(0.0, alpha) if math.isfinite(alpha) else self.alpha_ns,
            beta_ns_per_byte=max(0.0, beta) if math.isfinite(beta) else self.beta_ns_per_byte,
        )

    @property
    def backend(self) -> None:
        """None: a fit's times are its calibration's backend's."""
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class PiecewiseFit:
    """Ring fits on contiguous size ranges."""

    upper_bytes: tuple[float, ...]
    """Exclusive upper size of each segment but the last (geometric midpoints)."""
    segments: tuple[RingFit, ...]
    """One fit per segment, increasing size."""

    @property
    def method(self) -> str:
        """Name of the fit method."""
        return f"piecewise-{len(self.segments)}"

    @property
    def alpha_ns(self) -> float:
        """The latency of the smallest sizes' segment (what one small message pays), in ns."""
        return self.segments[0].alpha_ns

    def predict_ns(self, num_bytes: npt.ArrayLike, world_size: npt.ArrayLike) -> np.ndarray:
        """Prediction in ns; each size uses the segment its size falls in."""
        n, p = np.broadcast_arrays(
            np.asarray(num_bytes, dtype=np.float64), np.asarray(world_size, dtype=np.float64)
        )
        which = np.searchsorted(np.asarray(self.upper_bytes), n, side="right")
        out = np.empty(n.shape, dtype=np.float64)
        for k, seg in enumerate(self.segments):
            mask = which == k
            out[mask] = seg.predict_ns(n[mask], p[mask])
        return out

    # the Link protocol (commprof.modeling.collective.link)
    def label(self, world_size: int) -> str:
        """The number of segments and their size ranges."""
        return f"piecewise ring fit ({len(self.segments)} segments) at p={world_size}"

    def interval(self) -> tuple[PiecewiseFit, PiecewiseFit]:
        """Each segment at the lower, then the upper, ends of its intervals."""
        return self.bound(0), self.bound(1)

    def bound(self, side: int) -> PiecewiseFit:
        """Each segment at the lower (side 0) or upper (1) end of its intervals."""
        return replace(self, segments=tuple(s.bound(side) for s in self.segments))

    @property
    def backend(self) -> None:
        """None: a fit's times are its calibration's backend's."""
        return None


Fit = RingFit | PiecewiseFit


def _check_inputs(
    num_bytes: npt.ArrayLike, time_ns: npt.ArrayLike, world_size: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = np.asarray(num_bytes, dtype=np.float64).ravel()
    t = np.asarray(time_ns, dtype=np.float64).ravel()
    p = np.broadcast_to(np.asarray(world_size, dtype=np.float64), n.shape).copy()
    if n.shape != t.shape:
        raise ValueError(f"num_bytes ({n.size}) and time_ns ({t.size}) differ in length")
    if n.size < MIN_POINTS:
        raise ValueError(f"need at least {MIN_POINTS} measurements to fit, got {n.size}")
    if np.any(t <= 0) or np.any(n <= 0):
        raise ValueError("times and sizes must be > 0; drop empty or failed measurements")
    if np.any(p < 2):
        raise ValueError("world_size must be >= 2: a one-rank all-reduce moves no data")
    return n, t, p


def _ci(estimate: float, std_err: float, dof: int) -> tuple[float, float]:
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2.0, dof)) * std_err if dof > 0 else np.inf
    return (estimate - half, estimate + half)


def fit_alpha_only(
    num_bytes: npt.ArrayLike,
    time_ns: npt.ArrayLike,
    world_size: npt.ArrayLike,
    *,
    beta_ns_per_byte: float,
) -> RingFit:
    """The seed's fit: least squares of alpha with beta fixed (e.g. 1e9 / published B/s).

    Args:
        num_bytes: Message sizes.
        time_ns: Measured times (e.g. microbench p50).
        world_size: World size per point (or one for all).
        beta_ns_per_byte: The fixed beta.

    Returns:
        The fit (unweighted, as the seed did).
    """
    n, t, p = _check_inputs(num_bytes, time_ns, world_size)
    c_alpha, c_beta = ring_coefficients(n, p)
    rest = t - c_beta * beta_ns_per_byte
    alpha = float(np.dot(c_alpha, rest) / np.dot(c_alpha, c_alpha))
    resid = rest - c_alpha * alpha
    dof = n.size - 1
    std_err = float(np.sqrt(np.dot(resid, resid) / dof / np.dot(c_alpha, c_alpha)))
    if alpha < 0:
        warnings.warn(
            f"alpha-only fit gave alpha={alpha:.0f} ns < 0: the fixed beta "
            f"({beta_ns_per_byte:.3g} ns/B) overstates the link's cost at these sizes",
            CalibrationWarning,
            stacklevel=2,
        )
    pred = c_alpha * alpha + c_beta * beta_ns_per_byte
    return RingFit(
        method="alpha-only",
        alpha_ns=alpha,
        beta_ns_per_byte=beta_ns_per_byte,
        alpha_ci_ns=_ci(alpha, std_err, dof),
        beta_ci_ns_per_byte=(beta_ns_per_byte, beta_ns_per_byte),
        num_points=int(n.size),
        min_bytes=int(n.min()),
        max_bytes=int(n.max()),
        residuals_rel=tuple(((t - pred) / t).tolist()),
    )


def fit_alpha_beta(
    num_bytes: npt.ArrayLike, time_ns: npt.ArrayLike, world_size: npt.ArrayLike
) -> RingFit:
    """Joint alpha-beta fit minimising the squared relative error.

    Weighted least squares: rows of [2(p-1), 2((p-1)/p) n] and t divided by t.
    A negative parameter is clamped to 0 (the other refitted) with a
    ``CalibrationWarning``: it means the sizes cannot identify it.

    Args:
        num_bytes: Message sizes (at least two distinct).
        time_ns: Measured times.
        world_size: World size per point (or one for all).

    Returns:
        The fit with confidence intervals and relative residuals.
    """
    n, t, p = _check_inputs(num_bytes, time_ns, world_size)
    if np.unique(n).size < 2:
        raise ValueError(
            f"all measurements have one size ({int(n[0])} B): alpha and beta cannot be "
            "separated; measure at least two sizes"
        )
    c_alpha, c_beta = ring_coefficients(n, p)
    design = np.column_stack([c_alpha, c_beta]) / t[:, None]
    target = np.ones_like(t)
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    alpha, beta = float(coef[0]), float(coef[1])
    if alpha < 0 or beta < 0:
        which = "alpha" if alpha < 0 else "beta"
        warnings.warn(
            f"alpha-beta fit gave {which} < 0 (alpha={alpha:.1f} ns, beta={beta:.3g} ns/B); "
            f"clamped {which} to 0 and refitted the other. Include smaller messages for "
            "alpha, larger ones for beta.",
            CalibrationWarning,
            stacklevel=2,
        )
        col = 1 if alpha < 0 else 0
        only = design[:, col]
        value = max(0.0, float(np.dot(only, target) / np.dot(only, only)))
        alpha, beta = (0.0, value) if alpha < 0 else (value, 0.0)
        coef = np.array([alpha, beta])
    resid_w = target - design @ coef
    dof = n.size - 2
    sigma2 = float(np.dot(resid_w, resid_w) / dof) if dof > 0 else np.inf
    cov = sigma2 * np.linalg.pinv(design.T @ design)
    return RingFit(
        method="alpha-beta",
        alpha_ns=alpha,
        beta_ns_per_byte=beta,
        alpha_ci_ns=_ci(alpha, float(np.sqrt(cov[0, 0])), dof),
        beta_ci_ns_per_byte=_ci(beta, float(np.sqrt(cov[1, 1])), dof),
        num_points=int(n.size),
        min_bytes=int(n.min()),
        max_bytes=int(n.max()),
        residuals_rel=tuple(resid_w.tolist()),
    )


def _sse_rel(fit: RingFit) -> float:
    return float(np.sum(np.square(fit.residuals_rel)))


def fit_piecewise(
    num_bytes: npt.ArrayLike,
    time_ns: npt.ArrayLike,
    world_size: npt.ArrayLike,
    *,
    num_segments: int = 2,
    min_sizes_per_segment: int = MIN_POINTS,
) -> PiecewiseFit:
    """Ring fits on contiguous size ranges, breakpoints by exhaustive search.

    Every way to cut the sorted distinct sizes into ``num_segments`` runs of at
    least ``min_sizes_per_segment`` sizes is tried; the cut with the smallest
    total squared relative error wins. A boundary sits at the geometric mean
    of the sizes either side of it.

    Args:
        num_bytes: Message sizes.
        time_ns: Measured times.
        world_size: World size per point (or one for all).
        num_segments: 1 to 3 segments.
        min_sizes_per_segment: Fewest distinct sizes in a segment (>= 3).

    Returns:
        The best piecewise fit.
    """
    if not 1 <= num_segments <= 3 or min_sizes_per_segment < MIN_POINTS:
        raise ValueError(
            f"num_segments must be 1..3 and min_sizes_per_segment >= {MIN_POINTS}, got "
            f"{num_segments}, {min_sizes_per_segment}"
        )
    n, t, p = _check_inputs(num_bytes, time_ns, world_size)
    sizes = np.unique(n)
    if sizes.size < num_segments * min_sizes_per_segment:
        raise ValueError(
            f"{sizes.size} distinct sizes cannot make {num_segments} segments of "
            f"{min_sizes_per_segment}; use fewer segments or measure more sizes"
        )
    best: tuple[float, tuple[float, ...], tuple[RingFit, ...]] | None = None
    for cuts in _cut_positions(sizes.size, num_segments, min_sizes_per_segment):
        bounds = [float(np.sqrt(sizes[c - 1] * sizes[c])) for c in cuts]
        edges = [0.0, *bounds, np.inf]
        fits = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            for lo, hi in itertools.pairwise(edges):
                mask = (n >= lo) & (n < hi)
                fits.append(fit_alpha_beta(n[mask], t[mask], p[mask]))
        total = sum(_sse_rel(f) for f in fits)
        if best is None or total < best[0]:
            best = (total, tuple(bounds), tuple(fits))
    assert best is not None
    return PiecewiseFit(upper_bytes=best[1], segments=best[2])


def _cut_positions(num_sizes: int, num_segments: int, min_len: int) -> list[tuple[int, ...]]:
    if num_segments == 1:
        return [()]
    out: list[tuple[int, ...]] = []
    for first in range(min_len, num_sizes - min_len * (num_segments - 1) + 1):
        for rest in _cut_positions(num_sizes - first, num_segments - 1, min_len):
            out.append((first, *(first + r for r in rest)))
    return out
