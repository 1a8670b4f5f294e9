"""Analytical cost models of all-reduce: latency-bandwidth (alpha-beta-gamma) form.

All models share one parameterisation (Hockney's): sending a message of ``n``
bytes between two processes costs ``alpha + n * beta``, and reducing ``n``
bytes costs ``n * gamma``. Here ``alpha`` is in nanoseconds, ``beta`` and
``gamma`` in nanoseconds per byte, so ``1 / beta`` (times 1e9) is the
per-direction link bandwidth in bytes/s. Predictions are float64 nanoseconds:
they are model outputs, not measurements; round once where they are stored.

Every function is vectorised: ``num_bytes`` and ``world_size`` broadcast
against each other with numpy rules, so a whole grid of sizes and world sizes
is one call.

The primary model is the ring all-reduce of Patarasuk and Yuan, used
unmodified (no gamma term unless a caller passes one). The others, from Thakur,
Rabenseifner and Gropp, are here so users can compare which one fits their
measurements best.

References:
    P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for
    clusters of workstations", J. Parallel Distrib. Comput. 69(2):117-124,
    2009, doi:10.1016/j.jpdc.2008.09.002.

    R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of collective
    communication operations in MPICH", Int. J. High Perform. Comput. Appl.
    19(1):49-66, 2005, doi:10.1177/1094342005051521.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkParams:
    """Hockney parameters of one link, as used by every model in this module."""

    alpha_ns: float
    """Per-message latency in nanoseconds (startup cost of one send)."""
    beta_ns_per_byte: float
    """Transfer time per byte in nanoseconds (1e9 / per-direction bytes/s)."""
    gamma_ns_per_byte: float = 0.0
    """Reduction (add) time per byte in nanoseconds; 0 ignores compute."""
    algorithm: str = "ring"
    """The all-reduce model :meth:`predict_ns` uses (one of ``ALGORITHMS``)."""

    def __post_init__(self) -> None:
        for name in ("alpha_ns", "beta_ns_per_byte", "gamma_ns_per_byte"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"unknown algorithm {self.algorithm!r}; choose one of {sorted(ALGORITHMS)}"
            )

    @classmethod
    def from_bandwidth(
        cls, *, bandwidth_bytes_per_s: float, alpha_ns: float = 0.0, algorithm: str = "ring"
    ) -> LinkParams:
        """Build link parameters from a per-direction bandwidth.

        Args:
            bandwidth_bytes_per_s: Per-direction bandwidth in bytes/s (> 0).
            alpha_ns: Per-message latency in nanoseconds.
            algorithm: The all-reduce model (one of ``ALGORITHMS``).

        Returns:
            LinkParams with ``beta = 1e9 / bandwidth`` ns per byte.
        """
        if not bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s!r}")
        return cls(
            alpha_ns=alpha_ns, beta_ns_per_byte=1e9 / bandwidth_bytes_per_s, algorithm=algorithm
        )

    # the Link protocol (commprof.modeling.collective.link)
    def predict_ns(self, num_bytes: ArrayLike, world_size: ArrayLike) -> FloatArray:
        """All-reduce time (ns) under this link's ``algorithm`` (:func:`allreduce_ns`)."""
        return allreduce_ns(num_bytes, world_size, self, algorithm=self.algorithm)

    def label(self, world_size: int) -> str:
        """Its latency, bandwidth and algorithm (the same at every world size)."""
        bandwidth = 1.0 / self.beta_ns_per_byte if self.beta_ns_per_byte > 0 else float("inf")
        return (
            f"alpha {self.alpha_ns / 1e3:g} us, {bandwidth:.1f} GB/s a direction, {self.algorithm}"
        )

    def interval(self) -> None:
        """None: published parameters carry no interval."""
        return None

    @property
    def backend(self) -> None:
        """None: the times are the calibration's backend's (a published link names none)."""
        return None


def _validated(num_bytes: ArrayLike, world_size: ArrayLike) -> tuple[FloatArray, FloatArray]:
    n = np.asarray(num_bytes, dtype=np.float64)
    p = np.asarray(world_size, dtype=np.float64)
    if np.any(n < 0) or not np.all(np.isfinite(n)):
        raise ValueError("num_bytes must be finite and >= 0")
    if np.any(p < 1) or np.any(p != np.round(p)):
        raise ValueError(f"world_size must be integers >= 1, got {np.unique(p).tolist()}")
    return n, p


def ring_coefficients(num_bytes: ArrayLike, world_size: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Coefficients of alpha and beta in the ring model (the fit's design matrix).

    Args:
        num_bytes: Message sizes in bytes.
        world_size: Number of processes p.

    Returns:
        ``(2(p-1), 2((p-1)/p) n)``, broadcast to a common shape.
    """
    n, p = _validated(num_bytes, world_size)
    c_alpha = 2.0 * (p - 1.0)
    c_beta = 2.0 * (p - 1.0) / p * n
    return np.broadcast_arrays(c_alpha, c_beta)  # type: ignore[return-value]


def ring_allreduce_ns(num_bytes: ArrayLike, world_size: ArrayLike, link: LinkParams) -> FloatArray:
    """Ring all-reduce time (Patarasuk and Yuan 2009), unmodified.

    T(n, p) = 2(p-1) alpha + 2((p-1)/p) n beta [+ ((p-1)/p) n gamma].

    A reduce-scatter then an all-gather, each of p-1 steps moving n/p bytes;
    it is bandwidth optimal: each process sends 2((p-1)/p) n bytes.

    Args:
        num_bytes: Message sizes in bytes.
        world_size: Number of processes p (p = 1 costs 0).
        link: Link parameters.

    Returns:
        Predicted time in nanoseconds (float64), broadcast shape of the inputs.
    """
    n, p = _validated(num_bytes, world_size)
    frac = (p - 1.0) / p
    return (
        2.0 * (p - 1.0) * link.alpha_ns
        + 2.0 * frac * n * link.beta_ns_per_byte
        + frac * n * link.gamma_ns_per_byte
    )


def _pow2_split(p: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Largest power of two p' <= p, and 1.0 where p is not a power of two."""
    p_prime = np.exp2(np.floor(np.log2(p)))
    return p_prime, (p != p_prime).astype(np.float64)


def recursive_doubling_allreduce_ns(
    num_bytes: ArrayLike, world_size: ArrayLike, link: LinkParams
) -> FloatArray:
    """Recursive-doubling all-reduce (Thakur et al. 2005, section 4.5).

    For p a power of two: lg p alpha + n lg p beta + n lg p gamma. For other p,
    MPICH first folds the p - p' extra processes into the p' = 2^floor(lg p)
    others and sends the result back afterwards: two more full-message steps,
    2 alpha + 2 n beta + n gamma.

    Args:
        num_bytes: Message sizes in bytes.
        world_size: Number of processes p.
        link: Link parameters.

    Returns:
        Predicted time in nanoseconds (float64).
    """
    n, p = _validated(num_bytes, world_size)
    p_prime, extra = _pow2_split(p)
    lg = np.log2(p_prime)
    steps = lg + 2.0 * extra
    return (
        steps * link.alpha_ns
        + n * steps * link.beta_ns_per_byte
        + n * (lg + extra) * link.gamma_ns_per_byte
    )


def rabenseifner_allreduce_ns(
    num_bytes: ArrayLike, world_size: ArrayLike, link: LinkParams
) -> FloatArray:
    """Rabenseifner's all-reduce: reduce-scatter by recursive halving, then
    all-gather by recursive doubling (Thakur et al. 2005, section 4.5).

    For p a power of two: 2 lg p alpha + 2((p-1)/p) n beta + ((p-1)/p) n gamma.
    Other p fold into p' = 2^floor(lg p) first, as for recursive doubling
    (2 alpha + 2 n beta + n gamma extra).

    Args:
        num_bytes: Message sizes in bytes.
        world_size: Number of processes p.
        link: Link parameters.

    Returns:
        Predicted time in nanoseconds (float64).
    """
    n, p = _validated(num_bytes, world_size)
    p_prime, extra = _pow2_split(p)
    lg = np.log2(p_prime)
    frac = (p_prime - 1.0) / p_prime
    return (
        (2.0 * lg + 2.0 * extra) * link.alpha_ns
        + (2.0 * frac + 2.0 * extra) * n * link.beta_ns_per_byte
        + (frac + extra) * n * link.gamma_ns_per_byte
    )


def binary_tree_allreduce_ns(
    num_bytes: ArrayLike, world_size: ArrayLike, link: LinkParams
) -> FloatArray:
    """Binomial-tree reduce followed by a binomial-tree broadcast.

    Thakur et al. 2005 (sections 4.1 and 4.3): reduce costs
    ceil(lg p)(alpha + n beta + n gamma) and broadcast ceil(lg p)(alpha + n beta),
    so all-reduce = 2 ceil(lg p) alpha + 2 ceil(lg p) n beta + ceil(lg p) n gamma.

    Args:
        num_bytes: Message sizes in bytes.
        world_size: Number of processes p.
        link: Link parameters.

    Returns:
        Predicted time in nanoseconds (float64).
    """
    n, p = _validated(num_bytes, world_size)
    lg = np.ceil(np.log2(p))
    return 2.0 * lg * (link.alpha_ns + n * link.beta_ns_per_byte) + lg * n * (
        link.gamma_ns_per_byte
    )


AllReduceModel = Callable[[ArrayLike, ArrayLike, LinkParams], FloatArray]

ALGORITHMS: dict[str, AllReduceModel] = {
    "ring": ring_allreduce_ns,
    "recursive-doubling": recursive_doubling_allreduce_ns,
    "rabenseifner": rabenseifner_allreduce_ns,
    "binary-tree": binary_tree_allreduce_ns,
}
"""All-reduce models by name; ``ring`` is the project's primary model."""


def allreduce_ns(
    num_bytes: ArrayLike, world_size: ArrayLike, link: LinkParams, *, algorithm: str = "ring"
) -> FloatArray:
    """All-reduce time under the named algorithm model.

    Args:
        num_bytes: Message sizes in bytes.
        world_size: Number of processes p.
        link: Link parameters.
        algorithm: One of ``ALGORITHMS``.

    Returns:
        Predicted time in nanoseconds (float64).
    """
    try:
        model = ALGORITHMS[algorithm]
    except KeyError:
        raise ValueError(
            f"unknown algorithm {algorithm!r}; choose one of {sorted(ALGORITHMS)}"
        ) from None
    return model(num_bytes, world_size, link)


def bus_bandwidth_factor(world_size: ArrayLike) -> FloatArray:
    """nccl-tests all-reduce bus-bandwidth factor 2(p-1)/p (doc/PERFORMANCE.md).

    Args:
        world_size: Number of processes p.

    Returns:
        ``busbw / algbw`` for all-reduce.
    """
    p = np.asarray(world_size, dtype=np.float64)
    return 2.0 * (p - 1.0) / p


def nonnegative_line(x: npt.ArrayLike, y: npt.ArrayLike) -> tuple[float, float]:
    """``(intercept, slope)`` of the least-squares line of ``y`` on ``x``, kept >= 0: a negative
    slope (``y`` does not grow with ``x`` here) gives the median of ``y`` as a constant, a
    negative intercept the least-squares line through the origin. Needs two distinct ``x``."""
    xs, ys = np.asarray(x, np.float64), np.asarray(y, np.float64)
    slope, intercept = np.polyfit(xs, ys, 1)
    if slope <= 0:
        return max(0.0, float(np.median(ys))), 0.0
    if intercept < 0:
        return 0.0, float(xs @ ys / (xs @ xs))
    return float(intercept), float(slope)
