"""What ``commprof analyze`` prints: tables in ms and %, and the same as one JSON document.

Durations print in milliseconds with three decimals (microsecond resolution), shares in
percent; the JSON document keeps integer nanoseconds and ratios, as the Parquet tables do.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from commprof.traces.analyze import Analysis
    from commprof.traces.crossrank import CrossRank

JSON_FIELDS = (
    "rank", "step", "window_ns", "comm_ns", "compute_ns", "overlap_ns", "exposed_ns",
    "idle_ns", "other_ns", "overlap_efficiency", "comm_overhead_fraction",
)  # fmt: skip
"""Fields of each ``analyze --json`` step record (docs/design.md, Definitions)."""
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


BASIC_TABLES = ("steps", "ranks", "traces", "collectives", "collective_types", "type_totals",
                "counted", "possible_comm", "possible_ranges")  # fmt: skip
"""Tables printed in their own places; any other per-rank table prints after them."""
TRACE_COLUMNS = (
    "rank", "world_size", "regime", "window_source", "num_collectives", "num_outside",
    "outside_comm_ns", "num_duplicates", "num_unlaunched", "unlaunched_ns", "num_possible_comm",
    "possible_comm_ns", "num_possible_ranges", "possible_range_host_ns",
)  # fmt: skip
"""Columns of the printed traces table (``--json`` and ``--out`` hold every column)."""
MAX_COUNTED_RANKS = 8
"""Ranks whose "what was counted" table prints (all go to ``--json`` and ``--out``)."""
NAME_WIDTH = 70
"""Characters of an event name printed (kernel names run to hundreds)."""


def _short(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 3] + "..."


def counted_text(counted: pd.DataFrame) -> list[str]:
    """The "what was counted" section: per rank the names with the most time in each class."""
    if counted.empty:
        return []
    ranks = sorted(counted["rank"].unique())
    shown = counted[counted["rank"].isin(ranks[:MAX_COUNTED_RANKS])].assign(
        name=lambda f: f["name"].map(_short)
    )
    lines = [
        "\nWhat was counted (per rank and class: the event names with the most time, "
        "summed over their events):",
        _table(shown),
    ]
    if len(ranks) > MAX_COUNTED_RANKS:
        lines.append(f"({len(ranks) - MAX_COUNTED_RANKS} more ranks in --json and --out)")
    return lines


def possible_text(possible: pd.DataFrame) -> list[str]:
    """The "possible communication, not counted" section: kernels counted as compute that may
    be communication, with the rule-file line that would count each."""
    if possible.empty:
        return []
    shown = possible.assign(name=possible["name"].map(_short))
    lines = [
        "\nPossible communication, not counted (kernels no rule claims, counted as compute; "
        "time summed over their events):",
        _table(shown[["rank", "name", "num_events", "time_ns", "why"]]),
        "To count one, add its line to a rule file (docs/analyze_rules.md) and pass it with "
        "--rules FILE or COMMPROF_RULES=FILE:",
        *(f"  {line}" for line in dict.fromkeys(possible["rule_line"])),
    ]
    return lines


def ranges_text(ranges: pd.DataFrame) -> list[str]:
    """The "possible communication (host ranges), not counted" section: host ranges named like
    communication that no counted kernel accounts for, with their host (CPU) time."""
    if ranges.empty:
        return []
    shown = ranges.assign(name=ranges["name"].map(_short))
    return [
        "\nPossible communication (host ranges), not counted (ranges named like communication "
        "that no counted communication kernel was launched in or ran during; host_ms: CPU "
        "time summed over the ranges, not kernel time):",
        _table(shown[["rank", "name", "num_ranges", "host_ns"]]),
    ]


def types_text(types: pd.DataFrame, totals: pd.DataFrame) -> list[str]:
    """The per-type section with the rule it counts by and how it adds up to the steps."""
    from commprof.traces.metrics import SPAN_RULE

    if types.empty:
        return []
    lines = ["\nPer collective type (durations in ms, shares in %):", _table(types)]
    lines.append(f"Rule: {SPAN_RULE}.")
    concurrent = totals["types_sum_ns"] - totals["collective_ns"]
    other = totals["comm_ns"] - totals["collective_ns"]
    if not concurrent.any() and not other.any():
        lines.append("Each step's comm_ms is the sum of its types' comm_ms.")
        return lines
    parts = []
    if concurrent.any():
        parts.append(
            f"{concurrent.sum() / NS_PER_MS:.3f} ms when two types ran at once (counted under "
            f"each; {int((concurrent > 0).sum())} rank-steps)"
        )
    if other.any():
        parts.append(
            f"{other.sum() / NS_PER_MS:.3f} ms of communication that is no collective "
            f"({int((other > 0).sum())} rank-steps)"
        )
    lines.append(
        "The types' comm_ms add up to the steps' comm_ms but for: " + "; ".join(parts) + "."
    )
    return lines


def _extras(analysis: Analysis) -> dict[str, pd.DataFrame]:
    return {k: v for k, v in analysis.per_rank.items() if k not in BASIC_TABLES and not v.empty}


def analysis_text(analysis: Analysis, step_columns: list[str]) -> str:
    """The printed report of ``commprof analyze``."""
    ranks = analysis.ranks.drop(columns=["regime", "window_source"], errors="ignore")
    traces = analysis.per_rank["traces"]
    traces = traces[[c for c in TRACE_COLUMNS if c in traces.columns]]
    empty = pd.DataFrame()
    lines = [
        "Per step (durations in ms, shares in %):",
        _table(analysis.steps[step_columns]),
        "\nPer rank (durations in ms, shares in %):",
        _table(ranks),
        "\nTraces (regime: the rule table used; window_source: where the step windows came "
        "from; outside: collectives in no step):",
        _table(traces),
        *counted_text(analysis.per_rank.get("counted", empty)),
        *possible_text(analysis.per_rank.get("possible_comm", empty)),
        *ranges_text(analysis.per_rank.get("possible_ranges", empty)),
        *types_text(
            analysis.per_rank.get("collective_types", empty),
            analysis.per_rank.get("type_totals", empty),
        ),
    ]
    for name, table in _extras(analysis).items():
        label = name.replace("_", " ").removesuffix("s")
        lines += [f"\nPer {label} (durations in ms, shares in %):", _table(table)]
    if analysis.cross is not None:
        lines += cross_text(analysis.cross)
    else:
        lines.append(f"\nAcross ranks: none ({analysis.cross_note}).")
    if analysis.notes:
        lines += ["\nNotes:", *(f"  {note}" for note in analysis.notes)]
    return "\n".join(lines)


def analysis_json(analysis: Analysis, step_records: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``--json`` document: steps, ranks, traces, the cross-rank section (ns and ratios)."""
    cross: dict[str, Any] | None = None
    if analysis.cross is not None:
        c = analysis.cross
        cross = {
            "reference_rank": c.reference_rank,
            "matched_by": dict(c.matched_by),
            **c.summary(),
            "clock_offsets": json_rows(c.offsets),
            "stragglers": json_rows(c.stragglers),
        }
    shown = ("collective_types", "type_totals", "counted", "possible_comm", "possible_ranges")
    return {
        "steps": step_records,
        "ranks": json_rows(analysis.ranks),
        "traces": json_rows(analysis.per_rank["traces"]),
        **{n: json_rows(analysis.per_rank[n]) for n in shown if n in analysis.per_rank},
        **{name: json_rows(table) for name, table in _extras(analysis).items()},
        "cross_rank": cross,
        "cross_rank_note": analysis.cross_note,
        "notes": list(analysis.notes),
    }


def _plain(v: Any) -> Any:
    """A JSON value: NaN as None, numpy scalars as Python ones."""
    if isinstance(v, float):
        return None if math.isnan(v) else v
    if isinstance(v, str | bool) or v is None:
        return v
    if v is pd.NA or v is pd.NaT:
        return None
    if hasattr(v, "item"):
        return _plain(v.item())
    return int(v)


def json_rows(frame: pd.DataFrame, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN as None)."""
    part = frame if columns is None else frame[columns]
    return [{str(k): _plain(v) for k, v in row.items()} for row in part.to_dict("records")]


def step_json_rows(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """The ``--json`` step records: one per (rank, step), fields JSON_FIELDS, NaN as None."""
    return json_rows(steps, list(JSON_FIELDS))
