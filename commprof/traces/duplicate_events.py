"""Duplicate events: those that repeat an earlier one, exactly or within the trace's rounding,
dropped and counted.

A trace whose events were written twice (a merge gone wrong) would count each collective twice
and move every cross-rank figure; no two real events of one thread or stream share category, name,
start, end and thread, nor overlap with both ends within a microsecond.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.trace_columns import TraceColumns, drop_events

_HASH = tuple(np.uint64(k) for k in (
    0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5,
    0x85EBCA77C2B2AE63,
))  # fmt: skip
"""Odd 64-bit multipliers (xxHash's primes) of the duplicate check's key hash."""


def _duplicated(columns: list[npt.NDArray[Any]]) -> npt.NDArray[np.bool_]:
    """Rows equal to an earlier row in every column (the first of each group is kept).

    A 64-bit hash of each row, sorted, finds in a few milliseconds a million rows without
    a repeated hash (the usual case); only where hashes repeat are the rows compared exactly.
    """
    n = columns[0].size
    if n < 2:
        return np.zeros(n, bool)
    key = np.zeros(n, np.uint64)
    for col, mult in zip(columns, _HASH, strict=False):
        key ^= col.astype(np.int64, copy=False).view(np.uint64) * mult
    ordered = np.sort(key)
    if not (ordered[1:] == ordered[:-1]).any():
        return np.zeros(n, bool)
    frame = pd.DataFrame({str(i): c for i, c in enumerate(columns)})
    return frame.duplicated(keep="first").to_numpy()


NEAR_DUPLICATE_NS = 1000
"""Two events of one category, name and thread (or stream) that overlap and whose starts and
ends are each at most this far apart are one event written twice (a copy with its times
shifted by rounding, or by a merge): 1 us, the resolution of the trace's timestamps."""


def _near_duplicated(
    cols: TraceColumns, candidates: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """Events (among ``candidates``) that repeat an earlier one of the same category, name and
    thread: overlapping it, start and end each within ``NEAR_DUPLICATE_NS``.

    Real events never match: kernels of one stream and collectives of one thread run one at
    a time (never overlap), and events of one name nested on a CPU thread end apart by more
    than the rounding of their times. Events back to back (a short kernel run twice) do not
    overlap, and are kept.
    """
    n = cols.start_ns.size
    out = np.zeros(n, bool)
    idx = np.flatnonzero(candidates)
    if idx.size < 2:
        return out
    order = idx[np.lexsort((cols.start_ns[idx], cols.name_code[idx], cols.cat_code[idx],
                            cols.thread[idx]))]  # fmt: skip
    s, e = cols.start_ns[order], cols.end_ns[order]
    same = (
        (cols.thread[order][1:] == cols.thread[order][:-1])
        & (cols.name_code[order][1:] == cols.name_code[order][:-1])
        & (cols.cat_code[order][1:] == cols.cat_code[order][:-1])
    )
    near = (
        same
        & (s[1:] - s[:-1] <= NEAR_DUPLICATE_NS)
        & (np.abs(e[1:] - e[:-1]) <= NEAR_DUPLICATE_NS)
        & (s[1:] < e[:-1])  # overlapping
    )
    out[order[1:][near]] = True
    return out


def drop_duplicates(cols: TraceColumns) -> TraceColumns:
    """``cols`` without the events (and launches) that repeat an earlier one exactly.

    Events are duplicates where category, name, start, end and thread (pid and tid: the
    CUDA stream of a kernel) are all equal: no two real events of one thread or stream
    share all of them, and a trace whose events were written twice (a merge gone wrong)
    would count each collective twice and move every cross-rank figure. So are events that
    repeat one within ``NEAR_DUPLICATE_NS`` at both ends while overlapping it
    (:func:`_near_duplicated`). Launches repeat where correlation id, start and thread do.
    ``num_duplicates`` counts what was dropped (the trace's notes say it).
    """
    dup = _duplicated([cols.start_ns, cols.end_ns, cols.thread, cols.name_code, cols.cat_code])
    dup = dup | _near_duplicated(cols, ~dup)
    ldup = np.zeros(cols.launch_correlation.size, bool)
    if ldup.size > 1:  # sorted by correlation id: a repeat is next to its original
        lc, ls, lt = cols.launch_correlation, cols.launch_start_ns, cols.launch_thread
        ldup[1:] = (lc[1:] == lc[:-1]) & (ls[1:] == ls[:-1]) & (lt[1:] == lt[:-1]) & (lc[1:] != -1)
    num = int(dup.sum()) + int(ldup.sum())
    if not num:
        return cols
    return dataclasses.replace(drop_events(cols, dup, ldup), num_duplicates=num)
