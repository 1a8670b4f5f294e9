"""Overlap metrics of parsed traces: per step, per bucket, across ranks.

Definitions (docs/design.md): in a step window W, C is the union of
communication intervals and K the union of compute intervals;
comm = |C|, overlap = |C and K|, exposed = |C minus K|,
overlap efficiency = overlap / comm (undefined where comm = 0),
communication overhead fraction = exposed / |W|. Here
other = |O minus (C or K)| with O the union of the memcpy, memset, sync and other
classes, and idle = |W minus (C or K or O)|, so that
compute + exposed + idle + other = |W| holds exactly; it is checked.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from commprof.traces.intervals import (
    IntervalSet,
    clip,
    difference,
    intersection,
    total_length,
    union,
    union_all,
)
from commprof.traces.trace_parser import ParsedTrace

STEP_COLUMNS = (
    "rank", "step", "window_ns", "comm_ns", "compute_ns", "overlap_ns", "exposed_ns",
    "idle_ns", "other_ns", "overlap_efficiency", "comm_overhead_fraction", "window_source",
)  # fmt: skip
COLLECTIVE_TYPE_COLUMNS = (
    "rank", "step", "collective_type", "num_collectives", "comm_ns", "overlap_ns", "exposed_ns",
    "overlap_efficiency",
)  # fmt: skip
OTHER_CLASSES = ("memcpy", "memset", "sync", "other")


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN (undefined, not 0) where the denominator is 0."""
    return float(numerator) / float(denominator) if denominator else float("nan")


def window_metrics(
    comm: IntervalSet, compute: IntervalSet, others: IntervalSet, lo: int, hi: int
) -> dict[str, Any]:
    """Metrics of one window [lo, hi) (see the module docstring for the formulas).

    Raises:
        AssertionError: If compute + exposed + idle + other != window (a bug, not input).
    """
    c, k, o = clip(comm, lo, hi), clip(compute, lo, hi), clip(others, lo, hi)
    busy = union(c, k)
    comm_ns, compute_ns = total_length(c), total_length(k)
    overlap_ns = total_length(intersection(c, k))
    exposed_ns = total_length(difference(c, k))
    other_ns = total_length(difference(o, busy))
    window_ns = hi - lo
    idle_ns = window_ns - total_length(union(busy, o))
    if compute_ns + exposed_ns + idle_ns + other_ns != window_ns or idle_ns < 0:
        raise AssertionError(
            f"identity violated in [{lo}, {hi}): compute {compute_ns} + exposed {exposed_ns} "
            f"+ idle {idle_ns} + other {other_ns} != window {window_ns}"
        )
    return {
        "window_ns": window_ns, "comm_ns": comm_ns, "compute_ns": compute_ns,
        "overlap_ns": overlap_ns, "exposed_ns": exposed_ns, "idle_ns": idle_ns,
        "other_ns": other_ns, "overlap_efficiency": ratio(overlap_ns, comm_ns),
        "comm_overhead_fraction": ratio(exposed_ns, window_ns),
    }  # fmt: skip


def step_metrics(parsed: ParsedTrace) -> pd.DataFrame:
    """One row per step window of one rank's trace (columns STEP_COLUMNS).

    Args:
        parsed: A parsed trace.

    Returns:
        DataFrame with int64 ``*_ns`` columns and float ratios (NaN where comm = 0).
    """
    others = union_all([parsed.classes[c] for c in OTHER_CLASSES])
    comm, compute = parsed.classes["communication"], parsed.classes["compute"]
    rows = [
        {"rank": parsed.rank, "step": int(step)}
        | window_metrics(comm, compute, others, int(lo), int(hi))
        | {"window_source": parsed.step_source}
        for step, lo, hi in zip(
            parsed.step_ids, parsed.step_start_ns, parsed.step_end_ns, strict=True
        )
    ]
    frame = pd.DataFrame(rows, columns=list(STEP_COLUMNS))
    int_cols = [c for c in STEP_COLUMNS if c.endswith("_ns") or c in ("rank", "step")]
    return frame.astype({c: np.int64 for c in int_cols})


SPAN_RULE = (
    "a collective counts in the step that launched it (else the window it starts in); its time "
    "counts in the window where it runs, so one that runs past its window's end adds that part "
    "to the next window, in the step and the per-type tables alike"
)
"""The one rule for a collective across step windows (docs/design.md, Definitions)."""
TYPE_TOTAL_COLUMNS = ("rank", "step", "comm_ns", "collective_ns", "types_sum_ns")


def _type_sets(parsed: ParsedTrace) -> dict[str, IntervalSet]:
    colls = parsed.collectives
    return {
        str(kind): IntervalSet.from_arrays(
            group["start_ns"].to_numpy(np.int64), group["end_ns"].to_numpy(np.int64)
        )
        for kind, group in colls.groupby("collective_type", sort=True)
    }


def collective_type_metrics(parsed: ParsedTrace) -> pd.DataFrame:
    """Per step and collective type (all_reduce, all_gather, reduce_scatter, all_to_all,
    send_recv, ...): how many collectives, and comm, overlap and exposed time of that type.

    For type T in window W: C_T is the union of T's collective intervals; comm = |C_T and W|,
    overlap = |C_T and K and W|, exposed = comm - overlap with K the compute union (the step
    definitions of docs/design.md restricted to one type). SPAN_RULE decides where a
    collective counts: num_collectives by the step that launched it, time by the window it
    runs in, as the step table counts it. So with one type the type's comm is the step's
    (where all communication is collectives); types that run at once add up to more
    (:func:`type_totals` says how much).

    Returns:
        One row per (step, type) with a collective or time of one (COLLECTIVE_TYPE_COLUMNS).
    """
    colls, rows = parsed.collectives, []
    compute = parsed.classes["compute"]
    sets = _type_sets(parsed)
    counts = colls.dropna(subset=["step"]).groupby(["step", "collective_type"]).size()
    for step, lo, hi in zip(parsed.step_ids, parsed.step_start_ns, parsed.step_end_ns, strict=True):
        for kind, spans_all in sets.items():
            spans = clip(spans_all, int(lo), int(hi))
            num = int(counts.get((int(step), kind), 0))
            if not num and not len(spans):
                continue
            comm_ns = total_length(spans)
            overlap_ns = total_length(intersection(spans, compute))
            rows.append({
                "rank": parsed.rank, "step": int(step), "collective_type": kind,
                "num_collectives": num, "comm_ns": comm_ns, "overlap_ns": overlap_ns,
                "exposed_ns": comm_ns - overlap_ns,
                "overlap_efficiency": ratio(overlap_ns, comm_ns),
            })  # fmt: skip
    return pd.DataFrame(rows, columns=list(COLLECTIVE_TYPE_COLUMNS))


def type_totals(parsed: ParsedTrace) -> pd.DataFrame:
    """Per step, how the per-type table adds up to the step table.

    comm_ns is the step's communication |C and W|; collective_ns = |(union of the
    collectives) and W|; types_sum_ns = sum over types of |C_T and W|. So types_sum_ns -
    collective_ns is time two types ran at once (counted under each), and comm_ns -
    collective_ns is communication that is no collective (gloo's staging copies in cuda-gloo).

    Returns:
        One row per step (TYPE_TOTAL_COLUMNS).
    """
    sets = _type_sets(parsed)
    every = union_all(list(sets.values()))
    comm = parsed.classes["communication"]
    rows = []
    for step, lo, hi in zip(parsed.step_ids, parsed.step_start_ns, parsed.step_end_ns, strict=True):
        lo, hi = int(lo), int(hi)
        rows.append({
            "rank": parsed.rank, "step": int(step),
            "comm_ns": total_length(clip(comm, lo, hi)),
            "collective_ns": total_length(clip(every, lo, hi)),
            "types_sum_ns": sum(total_length(clip(c, lo, hi)) for c in sets.values()),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(TYPE_TOTAL_COLUMNS))


def trace_overlap(parsed: ParsedTrace) -> tuple[int, int]:
    """Communication time and its overlap with compute over the whole trace (ns).

    100 * overlap / comm is HolisticTraceAnalysis's communication/computation
    overlap on GPU traces: the share of communication-kernel time during which a
    compute kernel also runs (HTA, ``get_comm_comp_overlap``).

    Returns:
        (comm_ns, overlap_ns).
    """
    comm = parsed.classes["communication"]
    return total_length(comm), total_length(intersection(comm, parsed.classes["compute"]))


def bucket_exposure(parsed: ParsedTrace, bucket_records: pd.DataFrame) -> pd.DataFrame:
    """Match each hook bucket record to its collective and measure its exposed time.

    Within each step, records are taken in launch order (``launch_ns``, else
    ``bucket_index``) and collectives in start order; a record takes the next
    unmatched collective of the same size where both sizes are known (``num_bytes``),
    else the next one in order. exposed_ns = |bucket interval minus compute|.

    Args:
        parsed: One rank's parsed trace.
        bucket_records: Hook records with at least step, bucket_index, num_bytes
            (and latency_ns, to compare the hook with the trace); rows of other
            ranks are ignored.

    Returns:
        One row per record of a traced step: the record's columns plus
        comm_start_ns, comm_end_ns, comm_ns, comm_exposed_ns, matched_by
        ("size", "order" or "none").
    """
    missing = {"step", "bucket_index", "num_bytes"} - set(bucket_records.columns)
    if missing:
        raise ValueError(f"bucket_records lacks columns {sorted(missing)}")
    recs = bucket_records
    if "rank" in recs.columns:
        recs = recs[recs["rank"] == parsed.rank]
    recs = recs[recs["step"].isin(parsed.step_ids)]
    order_col = "launch_ns" if "launch_ns" in recs.columns else "bucket_index"
    colls = parsed.collectives
    out = []
    for step, lo, hi in zip(parsed.step_ids, parsed.step_start_ns, parsed.step_end_ns, strict=True):
        step_recs = recs[recs["step"] == step].sort_values(order_col, kind="stable")
        step_colls = colls[colls["step"] == step]
        compute = clip(parsed.classes["compute"], int(lo), int(hi))
        taken = np.zeros(len(step_colls), bool)
        sizes = step_colls["num_bytes"].to_numpy(dtype=float, na_value=np.nan)
        for rec in step_recs.to_dict("records"):
            free = np.flatnonzero(~taken)
            same = free[sizes[free] == float(rec["num_bytes"])]
            pick, how = (
                (same[0], "size")
                if same.size
                else ((free[0], "order") if free.size else (-1, "none"))
            )
            row = dict(
                rec,
                comm_start_ns=pd.NA,
                comm_end_ns=pd.NA,
                comm_ns=pd.NA,
                comm_exposed_ns=pd.NA,
                matched_by=how,
            )
            if pick >= 0:
                taken[pick] = True
                s, e = int(step_colls["start_ns"].iat[pick]), int(step_colls["end_ns"].iat[pick])
                exposed = difference(IntervalSet.from_arrays([s], [e]), compute)
                row.update(
                    comm_start_ns=s,
                    comm_end_ns=e,
                    comm_ns=e - s,
                    comm_exposed_ns=total_length(exposed),
                )
            out.append(row)
        if len(step_recs) != len(step_colls):
            warnings.warn(
                f"rank {parsed.rank} step {step}: {len(step_recs)} bucket records but "
                f"{len(step_colls)} collectives in the trace", stacklevel=2,
            )  # fmt: skip
    frame = pd.DataFrame(out)
    for col in ("comm_start_ns", "comm_end_ns", "comm_ns", "comm_exposed_ns"):
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    return frame
