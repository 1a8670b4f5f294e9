"""How well a ring fit predicts: MAPE, leave-one-out errors and the fixed half split of sizes.

The fits are :mod:`commprof.modeling.collective.ring_fit`; these score them out of sample.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from commprof.modeling.collective.ring_fit import Fit


def mape(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> float:
    """Mean absolute percentage error, 100 * mean(|pred - meas| / meas)."""
    pred = np.asarray(predicted, dtype=np.float64)
    meas = np.asarray(measured, dtype=np.float64)
    if pred.shape != meas.shape or meas.size == 0 or np.any(meas <= 0):
        raise ValueError("mape needs equal-length, non-empty inputs with measured > 0")
    return float(100.0 * np.mean(np.abs(pred - meas) / meas))


def leave_one_out_errors(
    num_bytes: npt.ArrayLike,
    times_ns: npt.ArrayLike,
    world_size: int,
    fit: Callable[[np.ndarray, np.ndarray, int], Fit],
) -> np.ndarray:
    """Leave-one-out cross-validation: each point predicted by a fit on all the others.

    Unlike a fixed half split it does not depend on which sizes are held out, which matters
    where the time has structure aligned with the size grid (on loopback gloo a power of two
    can take as long as the size sqrt 2 above it; benchmarks/README.md).

    Args:
        num_bytes: Message sizes.
        times_ns: Measured times, one per size.
        world_size: Ranks p.
        fit: ``(num_bytes, times_ns, world_size) -> Fit``, e.g. :func:`fit_alpha_beta`.

    Returns:
        Signed relative errors (predicted - measured) / measured, in input order;
        ``100 * mean(|errors|)`` is the leave-one-out MAPE.
    """
    n = np.asarray(num_bytes, dtype=np.float64)
    t = np.asarray(times_ns, dtype=np.float64)
    if n.shape != t.shape or np.any(t <= 0):
        raise ValueError(
            f"leave_one_out_errors needs one measured time > 0 per size: got {n.size} sizes, "
            f"{t.size} times, {int(np.sum(t <= 0))} of them <= 0"
        )
    predicted = np.array(
        [
            fit(np.delete(n, i), np.delete(t, i), world_size).predict_ns(n[i : i + 1], world_size)[
                0
            ]
            for i in range(n.size)
        ]
    )
    return (predicted - t) / t


def holdout_split(num_bytes: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Masks (fit, held out): even-indexed distinct sizes fit, odd-indexed held out."""
    n = np.asarray(num_bytes)
    rank = np.searchsorted(np.unique(n), n)
    return rank % 2 == 0, rank % 2 == 1
