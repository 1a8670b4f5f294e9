"""``commprof analyze TRACE_DIR``: per-step and per-rank overlap tables of a folder of traces.

Works on any folder of Kineto rank traces (``*.json`` / ``*.json.gz``), commprof's
or a user's own; JSON files that are not traces are skipped with a note on stderr.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from commprof.profiling.metrics import (
    STEP_COLUMNS,
    collective_type_metrics,
    ratio,
    step_metrics,
    transfer_wait,
)
from commprof.profiling.trace_parser import ParsedTrace, parse_trace

JSON_FIELDS = (
    "rank", "step", "window_ns", "comm_ns", "compute_ns", "overlap_ns", "exposed_ns",
    "idle_ns", "overlap_efficiency", "comm_overhead_fraction",
)  # fmt: skip
"""Fields of each ``analyze --json`` record (docs/design.md, Definitions)."""
SUM_COLUMNS = (
    "window_ns",
    "comm_ns",
    "compute_ns",
    "overlap_ns",
    "exposed_ns",
    "idle_ns",
    "other_ns",
)


def trace_files(trace_dir: Path) -> list[Path]:
    """Candidate trace files in ``trace_dir`` (not recursive), sorted by name."""
    if not trace_dir.is_dir():
        raise ValueError(f"TRACE_DIR {trace_dir} is not a directory")
    return sorted(
        p for p in trace_dir.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz"))
    )


def parse_dir(
    trace_dir: Path, *, regime: str | None = None, unlaunched: str = "keep"
) -> list[ParsedTrace]:
    """Parse every trace in ``trace_dir``; non-trace JSON files are skipped.

    Raises:
        ValueError: If the folder holds no trace.
    """
    parsed = []
    for path in trace_files(trace_dir):
        try:  # streamed: bounded memory however large the trace
            parsed.append(parse_trace(path, regime=regime, source=str(path), unlaunched=unlaunched))
        except ValueError as exc:
            if "not a Chrome trace" in str(exc):
                print(f"commprof analyze: skipping {path.name}: not a trace", file=sys.stderr)
                continue
            raise
    if not parsed:
        raise ValueError(f"no trace files (*.json, *.json.gz with traceEvents) in {trace_dir}")
    return parsed


def rank_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per-rank sums of the step table, with ratios recomputed from the sums."""
    ranks = steps.groupby("rank", as_index=False).agg(
        num_steps=("step", "size"), **{c: (c, "sum") for c in SUM_COLUMNS}
    )
    ranks["overlap_efficiency"] = [
        ratio(o, c) for o, c in zip(ranks["overlap_ns"], ranks["comm_ns"], strict=True)
    ]
    ranks["comm_overhead_fraction"] = [
        ratio(e, w) for e, w in zip(ranks["exposed_ns"], ranks["window_ns"], strict=True)
    ]
    return ranks


def trace_table(parsed: list[ParsedTrace]) -> pd.DataFrame:
    """One row per trace: its rank, regime, window source and launch-less device activities."""
    return pd.DataFrame([{
        "rank": p.rank, "source": p.source, "regime": p.regime, "window_source": p.step_source,
        "unlaunched_rule": p.unlaunched_rule, "num_unlaunched": p.num_unlaunched,
        "unlaunched_ns": p.unlaunched_ns, "unlaunched_comm_ns": p.unlaunched_comm_ns,
    } for p in parsed])  # fmt: skip


def analyze_dir(
    trace_dir: Path, *, regime: str | None = None, unlaunched: str = "keep"
) -> dict[str, pd.DataFrame]:
    """Metrics tables of a folder of rank traces.

    Args:
        trace_dir: Folder with one or more traces per rank.
        regime: Force a regime for every trace (detected per trace if None).
        unlaunched: "keep" or "drop" device activities with no launch event in the trace.

    Returns:
        Tables by name: "steps" (one row per rank and step, STEP_COLUMNS),
        "ranks" (per-rank sums), "collectives" (every collective with its rank),
        "collective_types" (per rank, step and collective type), "traces" (per trace:
        regime, window source, launch-less device activities kept or dropped),
        "transfer_wait" (see :func:`commprof.profiling.metrics.transfer_wait`).

    Raises:
        ValueError: If a (rank, step) appears in two traces, or no trace is found.
    """
    parsed = parse_dir(Path(trace_dir), regime=regime, unlaunched=unlaunched)
    steps = pd.concat([step_metrics(p) for p in parsed], ignore_index=True)
    dup = steps.duplicated(["rank", "step"])
    if dup.any():
        first = steps[dup].iloc[0]
        raise ValueError(
            f"rank {first['rank']} step {first['step']} appears in two traces in {trace_dir}; "
            "keep one trace per rank and step range"
        )
    steps = steps.sort_values(["rank", "step"]).reset_index(drop=True)
    colls = [p.collectives.assign(rank=p.rank) for p in parsed]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tw = transfer_wait(colls) if len({p.rank for p in parsed}) > 1 else pd.DataFrame()
    return {
        "steps": steps,
        "ranks": rank_table(steps),
        "collectives": pd.concat(colls, ignore_index=True),
        "collective_types": pd.concat(
            [collective_type_metrics(p) for p in parsed], ignore_index=True
        ),
        "traces": trace_table(parsed),
        "transfer_wait": tw,
    }


def records_from_steps(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """The ``--json`` records: one per (rank, step), fields JSON_FIELDS, NaN as None."""

    def plain(v: Any) -> Any:
        if isinstance(v, float):
            return None if math.isnan(v) else v
        return int(v)

    return [
        {str(k): plain(v) for k, v in row.items()}
        for row in steps[list(JSON_FIELDS)].to_dict("records")
    ]


def write_parquet(tables: dict[str, pd.DataFrame], out: Path) -> list[Path]:
    """Write each non-empty table as ``out/<name>.parquet`` (temp file + rename)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():
        if frame.empty:
            continue
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".parquet", dir=out)
        os.close(fd)
        try:
            frame.to_parquet(tmp, index=False)
            os.replace(tmp, out / f"{name}.parquet")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        written.append(out / f"{name}.parquet")
    return written


def run(
    trace_dir: Path,
    out: Path | None,
    as_json: bool,
    regime: str | None,
    *,
    unlaunched: str = "keep",
) -> int:
    """Entry point of ``commprof analyze``; returns the process exit code.

    Args:
        trace_dir: Folder of rank traces.
        out: Folder for Parquet tables (steps, ranks, collectives, transfer_wait), or None.
        as_json: Print only the JSON list of per-(rank, step) records on stdout.
        regime: Force a regime (cpu-gloo, cuda-nccl, cuda-gloo).
        unlaunched: "keep" or "drop" device kernels with no launch event in the trace.

    Returns:
        0 on success, 2 when the traces cannot be analysed (message on stderr).
    """
    try:
        tables = analyze_dir(Path(trace_dir), regime=regime, unlaunched=unlaunched)
    except ValueError as exc:
        print(f"commprof analyze: {exc}", file=sys.stderr)
        return 2
    if out is not None:
        for path in write_parquet(tables, Path(out)):
            print(f"wrote {path}", file=sys.stderr if as_json else sys.stdout)
    if as_json:
        json.dump(records_from_steps(tables["steps"]), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print("Per step (ns):")
        print(
            tables["steps"][list(STEP_COLUMNS)].to_string(index=False, float_format="{:.3f}".format)
        )
        print("\nPer rank (ns):")
        print(tables["ranks"].to_string(index=False, float_format="{:.3f}".format))
        if not tables["collective_types"].empty:
            print("\nPer collective type (ns):")
            print(tables["collective_types"].to_string(index=False, float_format="{:.3f}".format))
        print("\nTraces (device kernels without a launch event in the trace, kept or dropped):")
        print(tables["traces"].drop(columns="source").to_string(index=False))
    return 0
