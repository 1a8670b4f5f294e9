"""Modelled columns beside measured ones, and the prediction error of the model per cell.

Calibration (``commprof.modeling.collective.dataset_fits.fit_table``, method ``alpha-beta``):
the ring all-reduce model T(n, p) = 2(p-1) alpha + 2((p-1)/p) n beta (Patarasuk and Yuan 2009) is
fitted per (backend, regime, world size) to the ``microbench`` table, the all-reduces measured
alone after training (time p50 over iterations, max over ranks). The fit is then used out of sample:

- per gradient bucket of every ok cell: modelled T(bucket bytes, p) beside the bucket's measured
  median service time during training, over measured steps and ranks: ``transfer_ns = done_ns -
  max(ready_ns, d)``, with ``d`` the latest completion of an earlier bucket of the step that
  finished before it (``commprof.profiling.comm_hooks``). The model predicts one collective's
  own time; ``latency_ns = done_ns - ready_ns`` also holds the wait behind the step's earlier
  buckets, which the model does not describe, so it is kept beside but never compared;
- per cell: ``allreduce_sum`` = the sum over its buckets of those times (measured: of the
  per-bucket median service times, which do not count a bucket twice where another waited
  behind it, as a sum of latencies would), for cells that never ran with the bucket sizes
  ``commprof.modeling.buckets.assign_buckets`` gives for the model and cap.

Prediction error, signed: ``error_pct = 100 (modelled - measured) / measured``; MAPE is the mean
of its absolute value (``calibration.mape``).

This module imports no torch and no ray.
"""

from __future__ import annotations

import warnings
from typing import Any, cast

import numpy as np
import pandas as pd

from commprof.caps import cap_mb
from commprof.catalog import parameter_sizes
from commprof.modeling.buckets import assign_buckets
from commprof.modeling.collective.cost_model import bus_bandwidth_factor
from commprof.modeling.collective.dataset_fits import fit_table
from commprof.modeling.collective.ring_fit import CalibrationWarning, Fit, RingFit
from commprof.query import only_ok

FitKey = tuple[str, str, int]
"""(backend, regime, world_size), as ``dataset_fits.GROUP_KEYS``."""


def _error_pct(modelled: pd.Series, measured: pd.Series) -> pd.Series:
    return 100.0 * (modelled - measured) / measured.where(measured > 0)


def calibrate(
    status: pd.DataFrame, microbench: pd.DataFrame
) -> tuple[dict[FitKey, Fit], list[str]]:
    """Fit the ring model per (backend, regime, world size) to the microbenchmark of ok cells.

    Rows with ``num_wrong > 0`` (a rank's result differed from the expected sum) are dropped,
    with a ``CalibrationWarning`` and a line in the returned warnings, as
    :func:`microbench_points` drops them.

    Args:
        status: ``per_cell.cell_status`` output.
        microbench: the dataset's ``microbench`` table.

    Returns:
        The fits and the calibration warnings as text (e.g. a parameter clamped to 0).
    """
    ok = only_ok(status)[["cell_id", "attempt", "backend", "regime", "world_size"]]
    points = microbench.merge(ok, on=["cell_id", "attempt"])
    notes = []
    wrong = points["num_wrong"] > 0
    if wrong.any():
        # A wrong all-reduce result makes its time meaningless; microbench_points drops it too.
        notes.append(f"dropped {int(wrong.sum())} microbenchmark rows with num_wrong > 0")
        warnings.warn(notes[-1], CalibrationWarning, stacklevel=2)
        points = points[~wrong]
    if points.empty:
        return {}, [*notes, "no microbenchmark rows: nothing to calibrate"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CalibrationWarning)
        fits = fit_table(points, time_column="time_p50_ns", method="alpha-beta")
    notes += [str(w.message) for w in caught if issubclass(w.category, CalibrationWarning)]
    return fits, notes


def fits_frame(fits: dict[FitKey, Fit]) -> pd.DataFrame:
    """The fitted parameters, one row per group (ring fits; piecewise ones are skipped).

    Args:
        fits: :func:`calibrate` output.

    Returns:
        Columns ``backend, regime, world_size, alpha_ns, alpha_lo_ns, alpha_hi_ns,
        beta_ns_per_byte, bandwidth_bytes_per_s, num_points, min_bytes, max_bytes,
        fit_mape_pct`` (in-sample mean absolute relative residual, percent).
    """
    rows = []
    for (backend, regime, ws), fit in sorted(fits.items()):
        if not isinstance(fit, RingFit):
            continue
        rows.append(
            {
                "backend": backend,
                "regime": regime,
                "world_size": ws,
                "alpha_ns": fit.alpha_ns,
                "alpha_lo_ns": fit.alpha_ci_ns[0],
                "alpha_hi_ns": fit.alpha_ci_ns[1],
                "beta_ns_per_byte": fit.beta_ns_per_byte,
                "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
                "num_points": fit.num_points,
                "min_bytes": fit.min_bytes,
                "max_bytes": fit.max_bytes,
                "fit_mape_pct": 100.0 * float(np.mean(np.abs(fit.residuals_rel))),
            }
        )
    columns = ["backend", "regime", "world_size", "alpha_ns", "alpha_lo_ns", "alpha_hi_ns"]
    columns += ["beta_ns_per_byte", "bandwidth_bytes_per_s", "num_points", "min_bytes"]
    return pd.DataFrame(rows, columns=[*columns, "max_bytes", "fit_mape_pct"])


def _predict(fits: dict[FitKey, Fit], frame: pd.DataFrame) -> np.ndarray:
    """Modelled ns per row of ``frame`` (backend, regime, world_size, num_bytes); NaN: no fit."""
    out = np.full(len(frame), np.nan)
    if frame.empty:
        return out
    num_bytes = frame["num_bytes"].to_numpy(dtype=np.float64)
    # one vectorised prediction per fitted group, not one call per row
    for key, rows in frame.groupby(["backend", "regime", "world_size"]).indices.items():
        backend, regime, world_size = cast(tuple[Any, Any, Any], key)
        fit = fits.get((str(backend), str(regime), int(world_size)))
        if fit is not None:
            out[rows] = fit.predict_ns(num_bytes[rows], int(world_size))
    return out


def microbench_points(
    status: pd.DataFrame, microbench: pd.DataFrame, fits: dict[FitKey, Fit]
) -> pd.DataFrame:
    """Measured all-reduce time and busbw per (group, size) beside the model.

    Args:
        status: ``per_cell.cell_status`` output.
        microbench: the dataset's ``microbench`` table.
        fits: :func:`calibrate` output.

    Returns:
        Columns ``backend, regime, world_size, num_bytes, num_cells, time_ns`` (median of the
        cells' p50), ``time_min_ns``, ``time_max_ns``, ``busbw_gbps`` (median),
        ``modelled_ns``, ``modelled_busbw_gbps`` and ``error_pct``.
    """
    cols = ["cell_id", "attempt", "backend", "regime", "world_size"]
    ok = only_ok(status)[cols]
    points = microbench[microbench["num_wrong"] == 0].merge(ok, on=["cell_id", "attempt"])
    keys = ["backend", "regime", "world_size", "num_bytes"]
    out = (
        points.groupby(keys)
        .agg(
            num_cells=("cell_id", "nunique"),
            time_ns=("time_p50_ns", "median"),
            time_min_ns=("time_min_ns", "min"),
            time_max_ns=("time_max_ns", "max"),
            busbw_gbps=("busbw_gbps", "median"),
        )
        .reset_index()
    )
    out["modelled_ns"] = _predict(fits, out)
    factor = bus_bandwidth_factor(out["world_size"].to_numpy())
    out["modelled_busbw_gbps"] = out["num_bytes"] / out["modelled_ns"] * factor
    out["error_pct"] = _error_pct(out["modelled_ns"], out["time_ns"])
    return out


def bucket_table(
    summary: pd.DataFrame, measured_buckets: pd.DataFrame, fits: dict[FitKey, Fit]
) -> pd.DataFrame:
    """Per bucket of every ok cell: measured median service time, latency, exposed; modelled.

    Args:
        summary: ``per_cell.cell_summary`` output.
        measured_buckets: ``per_cell.bucket_samples`` output.
        fits: :func:`calibrate` output.

    Returns:
        Columns ``cell_id, attempt, bucket_index, num_bytes, transfer_ns, latency_ns,
        exposed_ns`` (medians over measured steps and ranks), ``backend, regime, world_size,
        model, bucket_cap_mb, modelled_ns, error_pct`` (of ``modelled_ns`` against
        ``transfer_ns``, the bucket's own service time: see the module docstring).
    """
    keys = ["cell_id", "attempt"]
    config = summary[[*keys, "backend", "regime", "world_size", "model", "bucket_cap_mb"]]
    rows = measured_buckets.merge(summary[keys], on=keys)
    out = (
        rows.groupby([*keys, "bucket_index"])
        .agg(
            num_bytes=("num_bytes", "median"),
            transfer_ns=("transfer_ns", "median"),
            latency_ns=("latency_ns", "median"),
            exposed_ns=("exposed_ns", "median"),
        )
        .reset_index()
        .merge(config, on=keys)
    )
    out["modelled_ns"] = _predict(fits, out)
    out["error_pct"] = _error_pct(out["modelled_ns"], out["transfer_ns"])
    return out


def cell_model(
    status: pd.DataFrame, buckets: pd.DataFrame, fits: dict[FitKey, Fit]
) -> pd.DataFrame:
    """Modelled columns of every cell, with the measured sum and the prediction error.

    Args:
        status: ``per_cell.cell_status`` output (every cell, whatever its status).
        buckets: :func:`bucket_table` output.
        fits: :func:`calibrate` output.

    Returns:
        Columns ``cell_id, num_buckets_modelled, allreduce_sum_modelled_ns,
        allreduce_sum_measured_ns`` (the sum over buckets of their median ``transfer_ns``; NaN
        for cells without data) and ``allreduce_error_pct``.
    """
    measured = buckets.groupby("cell_id").agg(
        allreduce_sum_measured_ns=("transfer_ns", "sum"),
        allreduce_sum_modelled_ns=("modelled_ns", "sum"),
        num_buckets_modelled=("bucket_index", "size"),
    )
    rows = []
    cells: list[Any] = list(status.itertuples(index=False))
    for cell in cells:
        if cell.cell_id in measured.index:
            values: dict[str, Any] = {str(k): v for k, v in measured.loc[cell.cell_id].items()}
            rows.append({"cell_id": cell.cell_id, **values})
            continue
        sizes = [
            b.num_bytes
            for b in assign_buckets(
                parameter_sizes(cell.model), bucket_cap_mb=cap_mb(cell.bucket_cap_mb)
            )
        ]
        frame = pd.DataFrame(
            {
                "backend": cell.backend,
                "regime": cell.regime,
                "world_size": int(cell.world_size),
                "num_bytes": sizes,
            }
        )
        rows.append(
            {
                "cell_id": cell.cell_id,
                "allreduce_sum_measured_ns": np.nan,
                "allreduce_sum_modelled_ns": float(np.sum(_predict(fits, frame))),
                "num_buckets_modelled": len(sizes),
            }
        )
    out = pd.DataFrame(
        rows,
        columns=[
            "cell_id",
            "num_buckets_modelled",
            "allreduce_sum_modelled_ns",
            "allreduce_sum_measured_ns",
        ],
    )
    out["allreduce_error_pct"] = _error_pct(
        out["allreduce_sum_modelled_ns"], out["allreduce_sum_measured_ns"]
    )
    return out


def accuracy(points: pd.DataFrame, buckets: pd.DataFrame) -> pd.DataFrame:
    """Model accuracy per (backend, regime, world size): in sample and out of sample.

    Args:
        points: :func:`microbench_points` output (the data the model was fitted to).
        buckets: :func:`bucket_table` output (buckets during training: out of sample).

    Returns:
        Columns ``backend, regime, world_size, microbench_mape_pct, num_points,
        bucket_mape_pct, bucket_median_error_pct, num_buckets``.
    """
    keys = ["backend", "regime", "world_size"]
    a = points.dropna(subset=["error_pct"]).groupby(keys)["error_pct"]
    b = buckets.dropna(subset=["error_pct"]).groupby(keys)["error_pct"]
    out = pd.DataFrame(
        {
            "microbench_mape_pct": a.apply(lambda s: float(np.mean(np.abs(s)))),
            "num_points": a.size(),
            "bucket_mape_pct": b.apply(lambda s: float(np.mean(np.abs(s)))),
            "bucket_median_error_pct": b.median(),
            "num_buckets": b.size(),
        }
    )
    return out.reset_index()
