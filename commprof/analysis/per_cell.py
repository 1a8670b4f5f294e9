"""Raw runs -> per-cell tables: cell status, per-cell statistics, merged repeats.

Statistics are over measured steps and ranks: a cell's sample of a metric holds one value per
(rank, measured step); its summary is the median with the 25th and 75th percentile, min and max
(the spread). Repeats of one configuration (equal config but ``repeat``) are merged by pooling
their samples; how far the repeats disagree is kept apart (``repeatability``).

Every cell of the dataset stays visible in :func:`cell_status`, whatever became of it: rejected
cells with the memory guard's arithmetic, failed cells with the grouped rank errors, and cells
that succeeded only after failed attempts with those errors.

This module imports no torch and no ray.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from commprof import matrix
from commprof.analysis.breakdown import BREAKDOWN_COLUMNS, STEP_KEYS
from commprof.matrix import CELL_COLUMNS
from commprof.query import latest_attempts, only_ok
from commprof.units import format_bytes

CONFIG_COLUMNS = [
    *(name for name, _ in CELL_COLUMNS if name != "repeat"),
    "num_params",
    "regime",
]
"""Configuration columns carried into every processed per-cell table (``repeat`` aside): the
cell fields with a ``cells`` column, the model's parameter count and the regime."""

STATS = ("median", "p25", "p75", "min", "max")
"""Statistics of each metric, as column suffixes ``<metric>_<stat>``."""

REASON_CHARS = 90
"""Length of the one-line reason shown in tables (full text stays in ``reason``)."""


def config_key(config_json: str) -> str:
    """Id of a configuration without its repeat index: equal for repeats of one cell.

    Args:
        config_json: the cell's ``config_json`` (``Cell.config()`` as JSON).

    Returns:
        12 hex digits (:func:`commprof.matrix.config_key`).
    """
    return matrix.config_key(json.loads(config_json))


def _first_line(text: object, limit: int = REASON_CHARS) -> str:
    if not isinstance(text, str) or not text.strip():
        return ""
    line = next(ln.strip() for ln in text.strip().splitlines() if ln.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _guard_reason(guard_json: object) -> str:
    """``pool needs 1.2 GiB > budget 1 GiB`` for each pool over budget, from the guard record."""
    if not isinstance(guard_json, str):
        return ""
    pools = [p for p in json.loads(guard_json).get("pools", []) if not p.get("ok", True)]
    return "; ".join(
        f"{p['pool']} needs {format_bytes(int(p['need_bytes']))} > budget "
        f"{format_bytes(int(p['budget_bytes']))}"
        for p in pools
    )


def cell_status(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per cell id: its final status and why, across all its attempts.

    Args:
        cells: the dataset's ``cells`` table (one row per attempt).

    Returns:
        Columns ``cell_id, config_key, repeat, sweep``, ``CONFIG_COLUMNS``, ``status`` (of
        the latest attempt), ``attempt`` (latest), ``num_attempts``, ``error_kind``,
        ``reason`` (full error or guard arithmetic of the latest attempt; for an ok cell the
        errors of its earlier failed attempts), ``reason_short`` and ``wall_s`` (all attempts).
    """
    if cells.empty:
        cols = ["cell_id", "config_key", "repeat", "sweep", *CONFIG_COLUMNS, "status"]
        return pd.DataFrame(columns=[*cols, "attempt", "num_attempts", "reason", "wall_s"])
    ordered = cells.sort_values(["cell_id", "attempt"])
    rows = []
    for cell_id, group in ordered.groupby("cell_id", sort=True):
        last = group.iloc[-1]
        earlier = group.iloc[:-1]
        if last["status"] == "ok":
            failed = earlier[earlier["status"] == "failed"]
            reason = "\n".join(
                f"attempt {int(a)} failed: {e}"
                for a, e in zip(failed["attempt"], failed["error"], strict=True)
            )
        else:
            reason = str(last["error"] or "")
        row = {
            "cell_id": cell_id,
            "config_key": config_key(last["config_json"]),
            "repeat": int(last["repeat"]),
            "sweep": last["sweep"],
            **{c: last[c] for c in CONFIG_COLUMNS},
            "status": last["status"],
            "attempt": int(last["attempt"]),
            "num_attempts": len(group),
            "error_kind": last["error_kind"] if isinstance(last["error_kind"], str) else "",
            "reason": reason,
            "reason_short": _guard_reason(last["guard_json"])
            if last["status"] == "rejected"
            else _first_line(reason),
            "wall_s": float(group["wall_s"].sum(min_count=1)),  # NaN: none recorded
        }
        rows.append(row)
    out = pd.DataFrame(rows)
    return out.sort_values(
        ["status", "model", "world_size", "bucket_cap_mb", "repeat"]
    ).reset_index(drop=True)


def summarize(samples: pd.DataFrame, keys: list[str], metrics: list[str]) -> pd.DataFrame:
    """Median, quartiles, min and max of each metric per group, in wide form.

    Args:
        samples: one row per sample (e.g. per rank and measured step).
        keys: grouping columns.
        metrics: metric columns (NaN samples, e.g. an undefined overlap efficiency, are
            skipped).

    Returns:
        One row per group: ``keys``, ``num_samples`` and ``<metric>_<stat>`` for ``STATS``.
    """
    grouped = samples.groupby(keys, sort=True)
    parts: dict[str, pd.Series] = {"num_samples": grouped.size()}
    for metric in metrics:
        col = grouped[metric]
        parts[f"{metric}_median"] = col.median()
        parts[f"{metric}_p25"] = col.quantile(0.25)
        parts[f"{metric}_p75"] = col.quantile(0.75)
        parts[f"{metric}_min"] = col.min()
        parts[f"{metric}_max"] = col.max()
    return pd.DataFrame(parts).reset_index()


def bucket_samples(buckets: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Bucket rows of measured steps only (the hook records every step, warm-up included).

    Args:
        buckets: the dataset's ``buckets`` table.
        steps: the dataset's ``steps`` table.

    Returns:
        The ``buckets`` rows whose (cell, attempt, rank, step) is a measured step.
    """
    measured = steps.loc[steps["measured"].astype(bool), STEP_KEYS]
    return buckets.merge(measured, on=STEP_KEYS, how="inner")


def cell_summary(
    status: pd.DataFrame, breakdown: pd.DataFrame, measured_buckets: pd.DataFrame
) -> pd.DataFrame:
    """Per ok cell: configuration and the statistics of every breakdown metric.

    Args:
        status: :func:`cell_status`.
        breakdown: ``breakdown.step_breakdown`` output.
        measured_buckets: :func:`bucket_samples` output.

    Returns:
        One row per ok cell (its final attempt): ``cell_id``, ``attempt``, ``config_key``,
        ``repeat``, ``CONFIG_COLUMNS``, ``num_samples``, ``num_buckets`` (median per step) and
        ``<metric>_<stat>`` for every metric, ``bucket_latency_ns`` included.
    """
    ok = only_ok(status)[["cell_id", "attempt", "config_key", "repeat"]]
    ok = ok.join(status.set_index("cell_id")[CONFIG_COLUMNS], on="cell_id")
    keys = ["cell_id", "attempt"]
    steps = breakdown.merge(ok[keys], on=keys)
    stats = summarize(steps, keys, list(BREAKDOWN_COLUMNS))
    lat = summarize(measured_buckets.merge(ok[keys], on=keys), keys, ["latency_ns"])
    lat = lat.rename(columns=lambda c: c.replace("latency_ns", "bucket_latency_ns"))
    lat = lat.drop(columns="num_samples")
    nb = steps.groupby(keys)["num_buckets"].median().rename("num_buckets").reset_index()
    out = ok.merge(stats, on=keys, how="left").merge(nb, on=keys, how="left")
    return out.merge(lat, on=keys, how="left").reset_index(drop=True)


def merged_summary(
    summary: pd.DataFrame, breakdown: pd.DataFrame, measured_buckets: pd.DataFrame
) -> pd.DataFrame:
    """Repeats of one configuration merged: statistics over their pooled samples.

    Args:
        summary: :func:`cell_summary` (gives each ok cell's attempt and config key).
        breakdown: ``breakdown.step_breakdown`` output.
        measured_buckets: :func:`bucket_samples` output.

    Returns:
        One row per config key: ``CONFIG_COLUMNS``, ``num_repeats``, ``num_samples`` and
        ``<metric>_<stat>`` as in :func:`cell_summary`.
    """
    keys = ["cell_id", "attempt"]
    index = summary[[*keys, "config_key"]]
    steps = breakdown.merge(index, on=keys)
    stats = summarize(steps, ["config_key"], list(BREAKDOWN_COLUMNS))
    lat = summarize(measured_buckets.merge(index, on=keys), ["config_key"], ["latency_ns"])
    lat = lat.rename(columns=lambda c: c.replace("latency_ns", "bucket_latency_ns"))
    config = summary.groupby("config_key")[CONFIG_COLUMNS].first()
    repeats = summary.groupby("config_key").size().rename("num_repeats")
    out = config.join(repeats).reset_index().merge(stats, on="config_key", how="left")
    out = out.merge(lat.drop(columns="num_samples"), on="config_key", how="left")
    return out.sort_values(["model", "world_size", "bucket_cap_mb"]).reset_index(drop=True)


def guard_pools(cells: pd.DataFrame) -> pd.DataFrame:
    """The memory guard's decision per (cell, pool), from ``guard_json`` of the latest attempt.

    Args:
        cells: the dataset's ``cells`` table.

    Returns:
        Columns ``cell_id, model, world_size, bucket_cap_mb, status, pool, need_bytes,
        budget_bytes, ratio`` (need / budget) and ``ok``; empty if no cell has a record.
    """
    rows = []
    latest = latest_attempts(cells)
    records: list[Any] = list(latest.itertuples(index=False))
    for cell in records:
        if not isinstance(cell.guard_json, str):
            continue
        for pool in json.loads(cell.guard_json).get("pools", []):
            budget = float(pool["budget_bytes"])
            rows.append(
                {
                    "cell_id": cell.cell_id,
                    "model": cell.model,
                    "world_size": int(cell.world_size),
                    "bucket_cap_mb": float(cell.bucket_cap_mb),
                    "status": cell.status,
                    "pool": str(pool["pool"]),
                    "need_bytes": int(pool["need_bytes"]),
                    "budget_bytes": int(budget),
                    "ratio": float(pool["need_bytes"]) / budget if budget > 0 else np.inf,
                    "ok": bool(pool["ok"]),
                }
            )
    cols = ["cell_id", "model", "world_size", "bucket_cap_mb", "status", "pool"]
    return pd.DataFrame(rows, columns=[*cols, "need_bytes", "budget_bytes", "ratio", "ok"])
