"""Everything the reports need, computed once from the collected dataset.

:func:`process` turns the raw tables of ``commprof.results.load`` into :class:`Processed`:
cell status, per-step breakdowns, per-cell and merged statistics, repeatability, the calibrated
model beside the measurements, per-layer attribution and the measured overheads. It reads only
the dataset, never a live run. This module imports no torch and no ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from commprof.analysis import attribution, modelled, per_cell
from commprof.analysis.breakdown import STEP_KEYS, step_breakdown, trace_breakdown
from commprof.analysis.hook_cost import hook_cost_summary
from commprof.analysis.repeatability import repeatability
from commprof.modeling.collective.ring_fit import Fit
from commprof.results import SCHEMAS, load


@dataclass(frozen=True, kw_only=True)
class Processed:
    """The processed tables of one dataset (all pandas DataFrames, possibly empty)."""

    tables: dict[str, pd.DataFrame]
    """The raw tables as loaded (``commprof.results.load``)."""
    status: pd.DataFrame
    """Every cell: final status, attempts and why (``per_cell.cell_status``)."""
    breakdown: pd.DataFrame
    """Every measured (cell, attempt, rank, step): the step-time breakdown."""
    summary: pd.DataFrame
    """Per ok cell: configuration, statistics and modelled columns."""
    merged: pd.DataFrame
    """Per configuration, repeats pooled (``per_cell.merged_summary``)."""
    repeatability: pd.DataFrame
    """Disagreement of repeats (``repeatability.repeatability``)."""
    buckets: pd.DataFrame
    """Per bucket of ok cells: measured medians and modelled time."""
    microbench: pd.DataFrame
    """All-reduce microbenchmark per (group, size), measured and modelled."""
    fits: dict[tuple[str, str, int], Fit]
    """Calibrated ring fits per (backend, regime, world size)."""
    fit_params: pd.DataFrame
    """The fits as a table (``modelled.fits_frame``)."""
    accuracy: pd.DataFrame
    """Model accuracy per group (``modelled.accuracy``)."""
    attribution: pd.DataFrame
    """Per-layer communication attribution (``attribution.layer_attribution``)."""
    guard: pd.DataFrame
    """The memory guard's need and budget per (cell, pool)."""
    hook_overhead: pd.DataFrame
    """Hook critical-path time per cell."""
    hook_cost: pd.DataFrame
    """The timing hook's cost against plain DDP per configuration, where cells measured it
    (``hook_cost.hook_cost_summary``; empty where none did)."""
    profiler_overhead: pd.DataFrame
    """Step-time ratio profiled / plain, where both exist."""
    trace: pd.DataFrame
    """Trace metrics per step, ``trace_``-prefixed (empty when nothing was profiled)."""
    notes: list[str] = field(default_factory=list)
    """Things a reader must know (calibration warnings, missing tables)."""


def process(tables: dict[str, pd.DataFrame]) -> Processed:
    """Compute every processed table from the raw dataset tables.

    Args:
        tables: ``commprof.results.load`` output.

    Returns:
        The processed dataset.
    """
    missing = [name for name in ("cells", "steps", "buckets") if name not in tables]
    if missing:
        raise ValueError(f"dataset lacks tables {missing}; load it with commprof.results.load")
    notes: list[str] = []
    status = per_cell.cell_status(tables["cells"])
    breakdown = step_breakdown(tables["steps"], tables["buckets"])
    measured = per_cell.bucket_samples(tables["buckets"], tables["steps"])
    summary = per_cell.cell_summary(status, breakdown, measured)
    fits, warnings = modelled.calibrate(status, tables["microbench"])
    notes.extend(f"calibration: {w}" for w in warnings)
    buckets = modelled.bucket_table(summary, measured, fits)
    points = modelled.microbench_points(status, tables["microbench"], fits)
    cell_models = modelled.cell_model(status, buckets, fits)
    status = status.merge(cell_models, on="cell_id", how="left")
    summary = summary.merge(cell_models, on="cell_id", how="left")
    trace = trace_breakdown(tables["trace_metrics"])
    if trace.empty:
        notes.append("no trace metrics in this dataset: no cell was profiled")
    return Processed(
        tables=tables,
        status=status,
        breakdown=breakdown,
        summary=summary,
        merged=per_cell.merged_summary(summary, breakdown, measured),
        repeatability=repeatability(summary),
        buckets=buckets,
        microbench=points,
        fits=fits,
        fit_params=modelled.fits_frame(fits),
        accuracy=modelled.accuracy(points, buckets),
        attribution=attribution.layer_attribution(buckets, tables["bucket_params"]),
        guard=per_cell.guard_pools(tables["cells"]),
        hook_overhead=attribution.hook_overhead(measured),
        hook_cost=hook_cost_summary(
            tables.get("hook_cost", SCHEMAS["hook_cost"].empty_table().to_pandas()),
            summary[["cell_id", "attempt", "config_key"]],
        ),
        profiler_overhead=attribution.profiler_overhead(summary),
        trace=trace,
        notes=notes,
    )


def load_processed(results_dir: str | Path) -> Processed:
    """Load a dataset folder and process it.

    Args:
        results_dir: the dataset folder (``commprof.results.load``).

    Returns:
        The processed dataset.
    """
    return process(load(results_dir))


def write_csv_tables(data: Processed, out_dir: str | Path) -> list[Path]:
    """Write the processed tables as CSV files (one per table) for other tools.

    Args:
        data: :func:`process` output.
        out_dir: folder to write into (created).

    Returns:
        The files written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frames = {
        "status": data.status,
        "breakdown": data.breakdown,
        "summary": data.summary,
        "merged": data.merged,
        "repeatability": data.repeatability,
        "buckets": data.buckets,
        "microbench": data.microbench,
        "fits": data.fit_params,
        "accuracy": data.accuracy,
        "attribution": data.attribution,
        "guard": data.guard,
        "hook_overhead": data.hook_overhead,
        "hook_cost": data.hook_cost,
        "profiler_overhead": data.profiler_overhead,
        "trace": data.trace,
    }
    paths = []
    for name, frame in frames.items():
        path = out / f"{name}.csv"
        frame.to_csv(path, index=False)
        paths.append(path)
    return paths


def rows(frame: pd.DataFrame) -> list[Any]:
    """The rows of ``frame`` as named tuples, typed ``Any`` (column access by attribute)."""
    return list(frame.itertuples(index=False))


__all__ = ["STEP_KEYS", "Processed", "load_processed", "process", "rows", "write_csv_tables"]
