"""A measured backward timeline: when each parameter's gradient became ready, from a cell.

The timing hook records when each bucket became ready (``buckets.ready_ns``), the steps table
when each step started and how long its forward took, and ``bucket_params`` which parameters
each bucket holds, in the order DDP put them (the first-ready parameter first). So, per
measured (rank, step), a bucket's ready offset from backward start is
``ready_ns - (start_ns + forward_ns)``; its median over ranks and steps is the bucket's
measured ready time.

Inside a bucket only the last parameter's time is observed. The others are placed between the
previous bucket's ready time and this one's, in proportion to the cumulative bytes before them
(backward cost grows with parameter size, the same assumption as
``estimate.backward_ready_ns``). That gives every parameter a ready time, which is what
:func:`commprof.commands.estimate.estimate` needs to re-bucket the model at another cap.

This module imports no torch and no ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from commprof.modeling.buckets import ParamSize
from commprof.query import cell_steps, keys_of, ok_cell, resolve_cell


def bucket_ready_offsets(tables: dict[str, pd.DataFrame], cell_id: str) -> pd.Series:
    """Median ready offset (ns from backward start) of each bucket of a cell's latest ok attempt.

    Args:
        tables: the dataset (``commprof.results.load``).
        cell_id: the cell, or a unique prefix of its id.

    Returns:
        Offsets indexed by bucket index.
    """
    row = ok_cell(tables["cells"], cell_id)
    key = ["cell_id", "attempt", "rank", "step"]
    steps = cell_steps(tables, keys_of([row]))
    if steps.empty or steps["start_ns"].isna().any():
        raise ValueError(
            f"cell {row['cell_id']} has no step start times (a dataset from before they were "
            "recorded); rerun the cell"
        )
    buckets = tables["buckets"].merge(steps[[*key, "start_ns", "forward_ns"]], on=key)
    offset = buckets["ready_ns"] - (buckets["start_ns"] + buckets["forward_ns"])
    return offset.groupby(buckets["bucket_index"]).median()


def parameter_ready_ns(
    tables: dict[str, pd.DataFrame], cell_id: str, param_sizes: Sequence[ParamSize]
) -> np.ndarray:
    """Per-parameter ready times (ns from backward start) measured in a cell.

    Args:
        tables: the dataset.
        cell_id: the cell (or a unique id prefix) whose model has these parameters.
        param_sizes: ``(name, numel[, element_size])`` in registration order.

    Returns:
        Ready times indexed by registration order, as ``estimate(ready_ns=...)`` takes them.
    """
    offsets = bucket_ready_offsets(tables, cell_id)
    params = tables["bucket_params"]
    cell = resolve_cell(tables["cells"], cell_id)
    return spread_to_parameters(offsets, params[params["cell_id"] == cell], param_sizes)


def spread_to_parameters(
    offsets: pd.Series, params: pd.DataFrame, param_sizes: Sequence[ParamSize]
) -> np.ndarray:
    """Per-parameter times from per-bucket ones, by cumulative bytes inside each bucket.

    Args:
        offsets: a time per bucket index (e.g. :func:`bucket_ready_offsets`).
        params: the cell's ``bucket_params`` rows.
        param_sizes: ``(name, numel[, element_size])`` in registration order.

    Returns:
        Times indexed by registration order.
    """
    index = {str(p[0]): i for i, p in enumerate(param_sizes)}
    missing = sorted(set(params["param_name"]) ^ set(index))
    if missing:
        raise ValueError(
            f"the cell's parameters differ from the model's (e.g. {missing[:3]}); "
            "use the cell's own model"
        )
    ready = np.zeros(len(param_sizes), dtype=np.float64)
    previous = 0.0
    for bucket_index in sorted(offsets.index):
        members = params[params["bucket_index"] == bucket_index].sort_values("position")
        end = max(float(offsets[bucket_index]), previous)
        share = members["num_bytes"].cumsum().to_numpy(np.float64) / members["num_bytes"].sum()
        for name, fraction in zip(members["param_name"], share, strict=True):
            ready[index[str(name)]] = previous + (end - previous) * fraction
        previous = end
    return ready


def load_parameter_ready_ns(
    root: str | Path, cell_id: str, param_sizes: Sequence[ParamSize]
) -> np.ndarray:
    """:func:`parameter_ready_ns` for a dataset folder."""
    from commprof.results import load

    return parameter_ready_ns(load(root), cell_id, param_sizes)
