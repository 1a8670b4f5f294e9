"""How far repeats of one configuration disagree.

Each repeat (a cell with its own ``repeat`` index, otherwise the same configuration) gives one
median per metric (over its measured steps and ranks). Across the repeats of a configuration:

- coefficient of variation ``cv = s / mean`` of those medians (s with Bessel's correction,
  ddof = 1);
- ``max_min_ratio = max / min`` of those medians (1 means the repeats agree exactly).

Only configurations with at least two ok repeats appear. This module imports no torch and no
ray.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

REPEATABILITY_METRICS = (
    "step_ns",
    "compute_ns",
    "exposed_ns",
    "comm_ns",
    "bucket_latency_ns",
    "overlap_efficiency",
)
"""Metrics whose repeatability is reported (their per-repeat medians)."""

MIN_REPEATS = 2
"""Fewest ok repeats a configuration needs to have a repeatability row."""


def repeatability(summary: pd.DataFrame) -> pd.DataFrame:
    """Disagreement of repeats, per configuration and metric.

    Args:
        summary: ``per_cell.cell_summary`` output (one row per ok cell, with ``config_key``
            and ``<metric>_median`` columns).

    Returns:
        Columns ``config_key, model, world_size, bucket_cap_mb, profile, metric, num_repeats, mean,
        min, max, cv, max_min_ratio``; one row per configuration with >= ``MIN_REPEATS``
        repeats and metric. ``cv`` is NaN where the mean is 0, ``max_min_ratio`` where the
        minimum is 0.
    """
    rows = []
    for key, group in summary.groupby("config_key", sort=True):
        if len(group) < MIN_REPEATS:
            continue
        first = group.iloc[0]
        for metric in REPEATABILITY_METRICS:
            column = f"{metric}_median"
            if column not in group:
                continue
            values = group[column].to_numpy(np.float64)
            values = values[np.isfinite(values)]
            if values.size < MIN_REPEATS:
                continue
            mean = float(values.mean())
            lo, hi = float(values.min()), float(values.max())
            rows.append(
                {
                    "config_key": key,
                    "model": first["model"],
                    "world_size": int(first["world_size"]),
                    "bucket_cap_mb": float(first["bucket_cap_mb"]),
                    "profile": bool(first.get("profile", False)),
                    "metric": metric,
                    "num_repeats": int(values.size),
                    "mean": mean,
                    "min": lo,
                    "max": hi,
                    "cv": float(values.std(ddof=1) / mean) if mean != 0 else np.nan,
                    "max_min_ratio": hi / lo if lo > 0 else np.nan,
                }
            )
    columns = ["config_key", "model", "world_size", "bucket_cap_mb", "profile", "metric"]
    columns.append("num_repeats")
    return pd.DataFrame(rows, columns=[*columns, "mean", "min", "max", "cv", "max_min_ratio"])
