"""The table a run prints when it ends: each selected cell's status and headline times."""

from __future__ import annotations

from typing import Any

from commprof.caps import cap_number
from commprof.query import latest_attempts


def summary_table(tables: dict[str, Any], cell_ids: list[str]) -> str:
    """A table of the selected cells: configuration (profiled or not), status, attempts, median
    step and bucket latency."""
    cells = tables["cells"]
    cells = cells[cells["cell_id"].isin(cell_ids)]
    if cells.empty:
        return "(no cells)"
    latest = latest_attempts(cells).set_index("cell_id")
    steps = tables["steps"]  # only ok attempts have step rows
    measured = steps[steps["measured"]]
    step_ms = measured.groupby("cell_id")["step_ns"].median() / 1e6
    buckets = tables["buckets"]
    lat_ms = buckets[buckets["step"] >= 1].groupby("cell_id")["latency_ns"].median() / 1e6
    view = latest[["model", "world_size", "bucket_cap_mb", "backend", "status", "attempt"]].copy()
    view["bucket_cap_mb"] = [cap_number(c) for c in view["bucket_cap_mb"]]
    # two cells of one configuration, one traced: tell them apart
    view.insert(3, "profiled", ["yes" if bool(p) else "no" for p in latest["profile"]])
    # a failed or rejected cell measured no step: "-", not NaN
    view["wall_s"] = _figures(latest["wall_s"], 2)
    view["step_ms"] = _figures(step_ms.reindex(view.index), 2)
    view["bucket_ms"] = _figures(lat_ms.reindex(view.index), 3)
    return view.to_string()


NOT_MEASURED = "-"
"""What the table shows where a cell has no figure (it failed, or was rejected)."""


def _figures(values: Any, decimals: int) -> list[str]:
    """``values`` to ``decimals`` places, :data:`NOT_MEASURED` where missing."""
    return [
        NOT_MEASURED if v is None or v != v else f"{float(v):.{decimals}f}"  # v != v: NaN
        for v in values
    ]
