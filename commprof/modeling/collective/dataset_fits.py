"""Ring fits of a collected dataset, one per link, and their JSON file.

Fits are made per (backend, regime, world size) from the ``microbench`` and ``buckets`` tables
(pandas DataFrames; see docs/design.md, "The dataset"), each by a fit of
:mod:`commprof.modeling.collective.ring_fit`; :func:`save_fits` and :func:`load_fits` keep them.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import pandas as pd

from commprof.matrix import LINK_FIELDS, regime_of
from commprof.modeling.collective.ring_fit import (
    CalibrationWarning,
    Fit,
    PiecewiseFit,
    RingFit,
    fit_alpha_beta,
    fit_alpha_only,
    fit_piecewise,
)

GROUP_KEYS = tuple("regime" if name == "device" else name for name in sorted(LINK_FIELDS))
"""Fits are made per link (``commprof.matrix.LINK_FIELDS``), the device read as its regime:
(backend, regime, world size), the key of every fit."""


def _with_regime(df: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in ("backend", "world_size", "device") if c not in df.columns]
    if missing and "regime" not in df.columns:
        raise ValueError(f"table lacks columns {missing}; join the cells table first")
    if "regime" in df.columns:
        return df
    out = df.copy()
    out["regime"] = [regime_of(b, d) for b, d in zip(out["backend"], out["device"], strict=True)]
    return out


STEP_KEYS = ("cell_id", "attempt", "rank", "step")
"""Columns that identify one step of one rank (the ``steps`` and ``buckets`` tables share them)."""


def bucket_latency_points(
    buckets: pd.DataFrame, steps: pd.DataFrame, *, time_column: str = "latency_ns"
) -> pd.DataFrame:
    """One time per (cell, attempt, step, bucket) of measured steps: the max over ranks.

    Only steps whose ``steps.measured`` is true are kept: the hook records every step, warm-up
    included, and step 0 (where DDP reduces the whole model as one bucket before it rebuilds its
    buckets) is never measured.

    Args:
        buckets: The ``buckets`` table joined with cell columns.
        steps: The dataset's ``steps`` table (``STEP_KEYS`` and ``measured``).
        time_column: ``latency_ns`` (hook entry to completion) or ``transfer_ns`` (the
            bucket's own service time, see ``commprof.profiling.comm_hooks``).

    Returns:
        Columns of the group keys plus num_bytes and ``time_column``.
    """
    keys = list(STEP_KEYS)
    measured = steps.loc[steps["measured"].astype(bool), keys].drop_duplicates()
    df = _with_regime(buckets).merge(measured, on=keys, how="inner")
    keys = [*GROUP_KEYS, "cell_id", "attempt", "step", "bucket_index"]
    keys = [k for k in keys if k in df.columns]
    agg = df.groupby(keys, as_index=False).agg(
        num_bytes=("num_bytes", "first"), **{time_column: (time_column, "max")}
    )
    return agg


def fit_table(
    table: pd.DataFrame,
    *,
    time_column: str = "time_p50_ns",
    method: str = "alpha-beta",
    beta_ns_per_byte: float | None = None,
    num_segments: int = 2,
) -> dict[tuple[str, str, int], Fit]:
    """Fit each (backend, regime, world size) group of a microbench or bucket table.

    Args:
        table: ``microbench`` rows (time_p50_ns) or ``bucket_latency_points``
            output (pass its ``time_column``), with cell columns.
        time_column: Column of measured times.
        method: ``alpha-beta``, ``alpha-only`` (needs beta) or ``piecewise``.
        beta_ns_per_byte: Fixed beta for ``alpha-only``.
        num_segments: Segments for ``piecewise``.

    Returns:
        Fits keyed by (backend, regime, world_size).
    """
    if method == "alpha-only" and beta_ns_per_byte is None:
        raise ValueError("method 'alpha-only' needs beta_ns_per_byte (e.g. 1e9 / bytes_per_s)")
    if method not in ("alpha-beta", "alpha-only", "piecewise"):
        raise ValueError(f"method {method!r} is not alpha-beta, alpha-only or piecewise")
    df = _with_regime(table)
    if "num_wrong" in df.columns and (df["num_wrong"] > 0).any():
        warnings.warn("dropping rows with num_wrong > 0", CalibrationWarning, stacklevel=2)
        df = df[df["num_wrong"] == 0]
    fits: dict[tuple[str, str, int], Fit] = {}
    for group_key, group in df.groupby(list(GROUP_KEYS)):
        backend, regime, ws_raw = group_key  # type: ignore[misc]
        ws = int(cast(int, ws_raw))
        n, t = group["num_bytes"].to_numpy(), group[time_column].to_numpy()
        key = (str(backend), str(regime), ws)
        try:
            if method == "alpha-only":
                assert beta_ns_per_byte is not None
                fits[key] = fit_alpha_only(n, t, ws, beta_ns_per_byte=beta_ns_per_byte)
            elif method == "piecewise":
                fits[key] = fit_piecewise(n, t, ws, num_segments=num_segments)
            else:
                fits[key] = fit_alpha_beta(n, t, ws)
        except ValueError as err:
            raise ValueError(
                f"group backend={backend} regime={regime} world_size={ws}: {err}"
            ) from err
    return fits


def fit_to_dict(fit: Fit) -> dict[str, Any]:
    """JSON-ready form of a fit."""
    if isinstance(fit, RingFit):
        return {"kind": "ring", **asdict(fit)}
    return {
        "kind": "piecewise",
        "upper_bytes": list(fit.upper_bytes),
        "segments": [fit_to_dict(s) for s in fit.segments],
    }


def fit_from_dict(data: dict[str, Any]) -> Fit:
    """Inverse of ``fit_to_dict``."""
    if data.get("kind") == "piecewise":
        return PiecewiseFit(
            upper_bytes=tuple(float(x) for x in data["upper_bytes"]),
            segments=tuple(fit_from_dict(s) for s in data["segments"]),  # type: ignore[misc]
        )
    fields = {k: v for k, v in data.items() if k != "kind"}
    for key in ("alpha_ci_ns", "beta_ci_ns_per_byte", "residuals_rel"):
        fields[key] = tuple(fields[key])
    return RingFit(**fields)


def save_fits(fits: dict[tuple[str, str, int], Fit], path: str | Path) -> None:
    """Write fits as JSON (a list of records with backend, regime, world_size, fit)."""
    records = [
        {"backend": b, "regime": r, "world_size": ws, "fit": fit_to_dict(f)}
        for (b, r, ws), f in sorted(fits.items())
    ]
    Path(path).write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")


def load_fits(path: str | Path) -> dict[tuple[str, str, int], Fit]:
    """Read fits written by ``save_fits``."""
    records: Sequence[dict[str, Any]] = json.loads(Path(path).read_text(encoding="utf-8"))
    return {
        (str(r["backend"]), str(r["regime"]), int(r["world_size"])): fit_from_dict(r["fit"])
        for r in records
    }


FIT_SOURCES = ("microbench", "buckets")
"""What a dataset fit reads: the all-reduces measured alone, or the buckets during training."""


def fits_from_dataset(
    root: str | Path, *, method: str = "alpha-beta", source: str = "microbench"
) -> dict[tuple[str, str, int], Fit]:
    """Fit every (backend, regime, world size) group of a collected dataset.

    ``microbench`` fits the link alone (time p50 per size). ``buckets`` fits the buckets' service
    times during training (``transfer_ns``, max over ranks, measured steps): it includes what
    training adds, contention with backward compute for the same cores, the hook and gloo's
    queueing, so it predicts in-training bucket times better on hosts where they share.

    Args:
        root: the dataset folder (``commprof.results.load``).
        method: as :func:`fit_table`.
        source: one of ``FIT_SOURCES``.

    Returns:
        Fits keyed by (backend, regime, world_size).
    """
    from commprof.results import load  # torch-free, like this module

    if source not in FIT_SOURCES:
        raise ValueError(f"fit source {source!r} is not one of {', '.join(FIT_SOURCES)}")
    tables = load(root)
    cells = tables["cells"][["cell_id", "attempt", "backend", "device", "world_size"]]
    if source == "buckets":
        joined = tables["buckets"].merge(cells, on=["cell_id", "attempt"])
        if joined.empty:
            raise ValueError(f"{root}: no bucket rows to fit")
        points = bucket_latency_points(joined, tables["steps"], time_column="transfer_ns")
        points = points.dropna(subset=["transfer_ns"])  # null in datasets older than the column
        if points.empty:
            raise ValueError(f"{root}: no bucket transfer_ns of measured steps to fit")
        return fit_table(points, time_column="transfer_ns", method=method)
    micro = tables["microbench"].merge(cells, on=["cell_id", "attempt"])
    if micro.empty:
        raise ValueError(
            f"{root}: no microbenchmark rows to fit; run a sweep with microbench sizes"
        )
    return fit_table(micro, method=method)
