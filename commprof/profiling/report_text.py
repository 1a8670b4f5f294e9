"""What ``commprof analyze`` prints: tables in ms and %, and the same as one JSON document.

Durations print in milliseconds with three decimals (microsecond resolution), shares in
percent; the JSON document keeps integer nanoseconds and ratios, as the Parquet tables do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from commprof.profiling.analyze import Analysis
    from commprof.profiling.crossrank import CrossRank

NS_PER_MS = 1_000_000
SHARES = {"overlap_efficiency": "overlap_%", "comm_overhead_fraction": "overhead_%"}
"""Ratio columns and their printed names (percent)."""


def readable(frame: pd.DataFrame) -> pd.DataFrame:
    """``*_ns`` columns as ``*_ms`` floats, ratio columns as percent, the rest unchanged."""
    out = pd.DataFrame(index=frame.index)
    for col in frame.columns:
        if col.endswith("_ns"):
            out[col[: -len("_ns")] + "_ms"] = frame[col].astype(float) / NS_PER_MS
        elif col in SHARES or col == "last_share":
            out[SHARES.get(col, "last_%")] = frame[col].astype(float) * 100
        else:
            out[col] = frame[col]
    return out


def _table(frame: pd.DataFrame) -> str:
    return readable(frame).to_string(index=False, float_format="{:.3f}".format, na_rep="n/a")


def cross_text(cross: CrossRank) -> list[str]:
    """The cross-rank section: clock offsets and residual, stragglers, skew summary."""
    s = cross.summary()
    how = ", ".join(f"{g}: {h}" for g, h in sorted(cross.matched_by.items()))
    lines = [
        f"\nAcross ranks: {s['num_collectives']} collectives matched on {s['num_ranks']} ranks "
        f"({how}); {s['num_unmatched']} seen on one rank only, "
        f"{s['num_name_mismatches']} with names that differ between ranks.",
        f"Clock offsets (ms, each rank's clock minus rank {cross.reference_rank}'s; "
        "residual: |aligned end - the collective's median end|):",
        _table(cross.offsets),
    ]
    if s["matching_doubtful"]:
        lines.append(
            "note: after alignment the ends of matched collectives still disagree by "
            f"{s['residual_p50_ns'] / NS_PER_MS:.3f} ms (median): they are probably not the "
            "same calls (no sequence numbers in the traces, or collectives whose ends need not "
            "meet, such as all-to-all over more ranks than these)"
        )
    lines += [
        "Stragglers (last to arrive, and the wait that caused the others):",
        _table(cross.stragglers),
        f"Arrival skew (ms): median {s['skew_p50_ns'] / NS_PER_MS:.3f}, "
        f"p95 {s['skew_p95_ns'] / NS_PER_MS:.3f}, max {s['skew_max_ns'] / NS_PER_MS:.3f}; "
        f"transfer {s['transfer_ns'] / NS_PER_MS:.3f} ms and wait "
        f"{s['wait_ns'] / NS_PER_MS:.3f} ms over all collectives and ranks.",
    ]
    return lines


BASIC_TABLES = ("steps", "ranks", "traces", "collectives")
"""Tables printed in their own places; any other per-rank table prints after them."""


def _extras(analysis: Analysis) -> dict[str, pd.DataFrame]:
    return {k: v for k, v in analysis.per_rank.items() if k not in BASIC_TABLES and not v.empty}


def analysis_text(analysis: Analysis, step_columns: list[str]) -> str:
    """The printed report of ``commprof analyze``."""
    ranks = analysis.ranks.drop(columns=["regime", "window_source"], errors="ignore")
    traces = analysis.per_rank["traces"].drop(columns=["source"])
    lines = [
        "Per step (durations in ms, shares in %):",
        _table(analysis.steps[step_columns]),
        "\nPer rank (durations in ms, shares in %):",
        _table(ranks),
        "\nTraces (regime: the rule table used; window_source: where the step windows came from):",
        _table(traces),
    ]
    for name, table in _extras(analysis).items():
        label = name.replace("_", " ").removesuffix("s")  # "collective_types": per type
        lines += [f"\nPer {label} (durations in ms, shares in %):", _table(table)]
    if analysis.cross is not None:
        lines += cross_text(analysis.cross)
    else:
        lines.append(f"\nAcross ranks: none ({analysis.cross_note}).")
    return "\n".join(lines)


def analysis_json(analysis: Analysis, step_records: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``--json`` document: steps, ranks, traces, the cross-rank section (ns and ratios)."""
    from commprof.profiling.analyze import records

    cross: dict[str, Any] | None = None
    if analysis.cross is not None:
        c = analysis.cross
        cross = {
            "reference_rank": c.reference_rank,
            "matched_by": dict(c.matched_by),
            **c.summary(),
            "clock_offsets": records(c.offsets),
            "stragglers": records(c.stragglers),
        }
    return {
        "steps": step_records,
        "ranks": records(analysis.ranks),
        "traces": records(analysis.per_rank["traces"]),
        **{name: records(table) for name, table in _extras(analysis).items()},
        "cross_rank": cross,
        "cross_rank_note": analysis.cross_note,
    }
