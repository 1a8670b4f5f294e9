"""Compact columns of a trace's complete events: the reader's output, and the selections of it.

:class:`commprof.traces.column_builder.ColumnBuilder` keeps of each complete (``ph == "X"``)
event only compact columns: int64 ns start and end, interned category and name codes, an int64
code of the (pid, tid) pair, the CUPTI correlation id, the launches (kept apart as correlation
ids, where no rule needs them as events), and the collective ``args`` keys of the few events a
rule table may count as collectives or test with ``has_arg``. About 40 bytes an event, against
about 1.5 KiB for the event as a Python dict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from commprof.traces.kept_args import KeptArgs

BLOCK_EVENTS = 1 << 16
"""Events taken at a time where a whole-trace temporary would cost several bytes an event: the
events between conversions of their ts/dur to ns (``event_times.EventTimes.flush``), the blocks
of :func:`code_mask` and of the launch search (``event_classes.Events.launch_index``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceColumns:
    """Compact columns of the complete ("X") events of one trace, in file order."""

    source: str
    """File the trace came from ("<dict>" when parsed from memory)."""
    meta: dict[str, Any]
    """Top-level keys other than ``traceEvents`` (distributedInfo, ...)."""
    start_ns: npt.NDArray[np.int64]
    """Event starts: ``rint(ts * 1000)`` of the float-microsecond ``ts``."""
    end_ns: npt.NDArray[np.int64]
    """Event ends: ``start_ns + rint(dur * 1000)``."""
    cat_code: npt.NDArray[np.int32]
    """Index of each event's category in ``cats``."""
    cats: list[Any]
    """Distinct categories in order of first appearance."""
    name_code: npt.NDArray[np.int32]
    """Index of each event's name in ``names``."""
    names: list[Any]
    """Distinct names in order of first appearance."""
    thread: npt.NDArray[np.int64]
    """Code of the (pid, tid) pair; equal pairs have equal codes."""
    correlation: npt.NDArray[np.int64]
    """``args.correlation`` (CUPTI launch <-> device event), -1 where absent."""
    launch_correlation: npt.NDArray[np.int64]
    """Correlation ids, sorted, of every launch (runtime or driver call), whether kept as an
    event or only here; the three columns below are aligned with it."""
    launch_start_ns: npt.NDArray[np.int64]
    """Each launch's start (ns): the step it was made in is the step of what it launched."""
    launch_thread: npt.NDArray[np.int64]
    """Each launch's thread code (the scheme of ``thread``): its launching op is on it."""
    launch_name_code: npt.NDArray[np.int32]
    """Each launch's name, an index in ``names`` (``cudaLaunchKernel``, ``cudaGraphLaunch``)."""
    args: KeptArgs
    """Event index -> its kept ``args`` keys, for events a rule may need them of (stored as a
    column per key)."""
    num_duplicates: int = 0
    """Events dropped as duplicates (same category, name, start, end and thread as another)."""
    num_unfinished: int = 0
    """Events dropped as unfinished: the profiler marks an op it saw start but not end with
    ``dur`` -1 (PyTorch 2.7 on), and one it saw end but not start with ``ts`` 0 and a
    ``dur`` that is the end's epoch time
    (:func:`commprof.traces.event_times.unfinished_events`)."""
    control_chars_at: tuple[int, ...] = ()
    """Byte offsets (in the JSON text) of raw control characters inside strings, which JSON
    forbids and a profiler writes for a garbled name: each chunk holding them was read as the
    stdlib's non-strict decoder reads it."""


def code_mask(codes: npt.NDArray[np.int32], wanted: list[bool]) -> npt.NDArray[np.bool_]:
    """Whether each event's code (category or name) is one of the ``wanted`` (by code).

    ``wanted[codes]`` a block at a time: no int64 index temporary the size of the trace,
    as ``np.isin`` makes.
    """
    table = np.asarray(wanted, dtype=bool)
    out = np.empty(codes.size, dtype=bool)
    for lo in range(0, codes.size, BLOCK_EVENTS):
        np.take(table, codes[lo : lo + BLOCK_EVENTS], out=out[lo : lo + BLOCK_EVENTS])
    return out


def drop_events(
    cols: TraceColumns, drop: npt.NDArray[np.bool_], ldrop: npt.NDArray[np.bool_]
) -> TraceColumns:
    """``cols`` without the events where ``drop`` and the launches where ``ldrop`` is set."""
    keep, lkeep = ~drop, ~ldrop
    new_index = np.cumsum(keep) - 1
    args = cols.args.subset(keep, new_index)
    return dataclasses.replace(
        cols,
        start_ns=cols.start_ns[keep], end_ns=cols.end_ns[keep], cat_code=cols.cat_code[keep],
        name_code=cols.name_code[keep], thread=cols.thread[keep],
        correlation=cols.correlation[keep], launch_correlation=cols.launch_correlation[lkeep],
        launch_start_ns=cols.launch_start_ns[lkeep], launch_thread=cols.launch_thread[lkeep],
        launch_name_code=cols.launch_name_code[lkeep], args=args,
    )  # fmt: skip
