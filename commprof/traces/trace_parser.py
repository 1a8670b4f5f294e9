"""Chrome / Kineto trace -> classified int64 interval sets, step windows and collectives.

Reads any Kineto trace (``torch.profiler`` export, ``.json`` or ``.json.gz``), not
only the ones commprof's harness writes. Each complete event (``ph == "X"``) is
classified by the first matching rule of its regime's :class:`RuleTable`
(``RULES``: cpu-gloo, cuda-nccl, cuda-gloo; :mod:`commprof.traces.trace_rules`);
collective metadata in the event args (``Collective name``, ``Process Group Name``,
``Seq``) comes before name patterns, which are only a fallback. Timestamps are float
microseconds in the file and are converted once, at the reader, to int64
nanoseconds (``np.rint(ts * 1000)``; docs/design.md, Definitions).

Files are decoded by msgspec in chunks of whole events into typed structs of the
fields used (:mod:`commprof.traces.trace_reader`, :mod:`commprof.traces.trace_columns`):
peak memory stays at a few compact columns per event plus one chunk, however large the
trace. Rules are evaluated on the distinct names and categories, then
broadcast to the events with numpy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.intervals import Int64Array, IntervalSet, difference
from commprof.traces.trace_columns import BLOCK_EVENTS, TraceColumns, code_mask, read_columns
from commprof.traces.trace_reader import CHUNK_BYTES, load_trace
from commprof.traces.trace_rules import (
    CLASSES,
    DEVICE_CATS,
    DTYPE_BYTES,
    IGNORE,
    LAUNCH_CATS,
    LAUNCHED_CATS,
    MAX_EVENT_DURATION_US,
    REGIMES,
    RULES,
    UNLAUNCHED_RULES,
    Rule,
    RuleTable,
    candidate_tables,
    collective_type,
    detect_regime,
)
from commprof.traces.windows import step_windows

__all__ = [
    "CLASSES",
    "IGNORE",
    "MAX_EVENT_DURATION_US",
    "REGIMES",
    "RULES",
    "ParsedTrace",
    "Rule",
    "RuleTable",
    "detect_regime",
    "load_trace",
    "parse_trace",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ParsedTrace:
    """Classified intervals, step windows and collectives of one rank's trace."""

    source: str
    """File the trace came from ("<dict>" when parsed from memory)."""
    rank: int
    """Rank: distributedInfo, else the file name (rank<N>), else 0."""
    world_size: int | None
    """World size from distributedInfo, if present."""
    regime: str
    """Rule table used (detected or forced)."""
    step_ids: Int64Array
    """Step numbers (from ProfilerStep#N), one per window."""
    step_start_ns: Int64Array
    """Window starts (ns)."""
    step_end_ns: Int64Array
    """Window ends (ns)."""
    step_source: str
    """Where the windows came from: "ProfilerStep" (the CPU-side annotations), "device
    ProfilerStep" (GPU-side ones, used only where they hold the kernels; windows.py), or
    "whole trace"."""
    classes: dict[str, IntervalSet]
    """Interval set of each class in CLASSES."""
    collectives: pd.DataFrame = field(repr=False)
    """One row per collective: name, collective_type, start_ns, end_ns, duration_ns, step, seq,
    num_bytes, process_group, thread."""
    unlaunched_rule: str = "keep"
    """What was done with device activities whose launch is not in the trace: "keep" or "drop"."""
    num_unlaunched: int = 0
    """Device activities (kernels, memcpy, memset) with no launch event in the trace."""
    unlaunched_ns: int = 0
    """Their summed duration (ns)."""
    unlaunched_comm_ns: int = 0
    """The part of it in communication kernels (ns)."""


def _rank_of(trace: dict[str, Any], source: str) -> int:
    info = trace.get("distributedInfo") or {}
    if isinstance(info.get("rank"), int):
        return int(info["rank"])
    match = re.search(r"rank[_-]?(\d+)", Path(source).name)
    return int(match.group(1)) if match else 0


def _dtype_bytes(name: Any) -> int | None:
    return DTYPE_BYTES.get(str(name).lower()) if name is not None else None


INT64_MAX = 2**63 - 1


def _int64(value: Any) -> int | None:
    """An integer arg as the tables hold it: None where it is no integer or is past int64.

    JSON integers have no size limit (``Seq`` of 2**70 parses); a column of int64 does, and no
    real sequence number or message size comes near it, so such a value counts as unknown.
    """
    if isinstance(value, int) and not isinstance(value, bool) and -INT64_MAX <= value <= INT64_MAX:
        return value
    return None


def _message_bytes(args: dict[str, Any] | None) -> int | None:
    # Collective metadata (NCCL kernels, record_param_comms) first, then the
    # input shape that record_shapes=True attaches to gloo annotations.
    if not args:
        return None
    nelems, size = args.get("In msg nelems"), _dtype_bytes(args.get("dtype"))
    if isinstance(nelems, int) and size is not None:
        return _int64(nelems * size)
    dims, types = args.get("Input Dims"), args.get("Input type")
    if dims and types and isinstance(dims[0], list):
        size = _dtype_bytes(types[0])
        if size is not None and all(isinstance(d, int) for d in dims[0]):
            return _int64(math.prod(dims[0]) * size)
    return None


class _Events:
    """Rule predicates over the columns of a trace's complete ("X") events."""

    def __init__(self, cols: TraceColumns) -> None:
        self.cols = cols
        self.start_ns, self.end_ns, self.thread = cols.start_ns, cols.end_ns, cols.thread
        self.cat_code, self.cats = cols.cat_code, cols.cats
        self.name_code, self.names = cols.name_code, cols.names

    def __len__(self) -> int:
        return int(self.start_ns.size)

    def cat_mask(self, cats: frozenset[str] | None) -> npt.NDArray[np.bool_]:
        if cats is None:
            return np.ones(len(self), bool)
        return code_mask(self.cat_code, [c in cats for c in self.cats])

    def name_mask(self, pattern: str | None) -> npt.NDArray[np.bool_]:
        if pattern is None:
            return np.ones(len(self), bool)
        rx = re.compile(pattern)
        return code_mask(self.name_code, [rx.match(str(n)) is not None for n in self.names])

    def args(self, i: int) -> dict[str, Any]:
        """The kept args of event ``i`` (the reader keeps those rules can need)."""
        return self.cols.args.get(i, {})

    def has_arg(self, idx: npt.NDArray[np.intp], key: str) -> npt.NDArray[np.bool_]:
        # Over the few events whose args were kept, not over every candidate in idx.
        held = np.zeros(len(self), bool)
        held[[i for i, kept in self.cols.args.items() if key in kept]] = True
        return held[idx]

    def launch_thread(self, idx: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
        # Device events carry no thread of their own: map them through the CUPTI
        # correlation id to the runtime call that launched them (-1 if none).
        out = self.thread[idx].copy()
        device = self.cat_mask(DEVICE_CATS)[idx]
        if not device.any():
            return out
        launch = np.flatnonzero(self.cat_mask(LAUNCH_CATS))
        corr = self.cols.correlation
        order = np.argsort(corr[launch], kind="stable")
        lc, lthread = corr[launch][order], self.thread[launch][order]
        dc = corr[idx[device]]
        if not lc.size:
            out[device] = -1
            return out
        pos = np.clip(np.searchsorted(lc, dc), 0, lc.size - 1)
        out[device] = np.where((lc[pos] == dc) & (dc != -1), lthread[pos], -1)
        return out


def _unlaunched(evs: _Events) -> npt.NDArray[np.bool_]:
    """Device activities whose CUPTI correlation id matches no launch (runtime) event.

    They were launched before the profiler started (or their launch was not recorded).
    """
    device = evs.cat_mask(LAUNCHED_CATS)
    launches = evs.cols.launch_correlation  # sorted
    kept = evs.cols.correlation[evs.cat_mask(LAUNCH_CATS)]
    if kept.size:
        launches = np.concatenate([kept, launches])
        launches.sort()
    del kept
    out = np.zeros(len(evs), bool)
    if not launches.size:
        out[device] = True
        return out
    # Sorted ids and a binary search, a block of events at a time: temporaries of a block,
    # not of the trace (peak memory of a large parse).
    for lo in range(0, len(evs), BLOCK_EVENTS):
        corr = evs.cols.correlation[lo : lo + BLOCK_EVENTS]
        pos = np.minimum(np.searchsorted(launches, corr), launches.size - 1)
        found = launches[pos] == corr
        out[lo : lo + BLOCK_EVENTS] = device[lo : lo + BLOCK_EVENTS] & ((corr == -1) | ~found)
    return out


def _classify(
    evs: _Events, table: RuleTable, skip: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Class index per event (-1 unmatched or ignored), collective flags, not-compute flags.

    Events flagged in ``skip`` are left unclassified.
    """
    targets = np.full(len(evs), -1, np.int8)  # len(CLASSES) < 127; small on large traces
    decided = skip.copy()
    collective = np.zeros(len(evs), bool)
    not_compute = np.zeros(len(evs), bool)
    comm_threads = np.empty(0, np.int64)
    if table.comm_thread_marker is not None:
        comm_threads = np.unique(evs.thread[evs.name_mask(table.comm_thread_marker)])
    for rule in table.rules:
        idx = np.flatnonzero(~decided & evs.cat_mask(rule.cats) & evs.name_mask(rule.name))
        if rule.has_arg is not None and idx.size:
            idx = idx[evs.has_arg(idx, rule.has_arg)]
        if rule.comm_thread is not None and idx.size:
            on_comm = np.isin(evs.launch_thread(idx), comm_threads)
            idx = idx[on_comm == rule.comm_thread]
        decided[idx] = True
        targets[idx] = -1 if rule.target == IGNORE else CLASSES.index(rule.target)
        collective[idx] = rule.collective
        not_compute[idx] = rule.not_compute
    return targets, collective, not_compute


def _collectives(
    evs: _Events, idx: npt.NDArray[np.intp], starts: Int64Array, ends: Int64Array, ids: Int64Array
) -> pd.DataFrame:
    args = [evs.args(int(i)) for i in idx]
    start, end = evs.start_ns[idx], evs.end_ns[idx]
    win = np.searchsorted(starts, start, side="right") - 1
    inside = (win >= 0) & (start < ends[np.clip(win, 0, None)])
    names = [
        a.get("Collective name") or evs.names[c]
        for a, c in zip(args, evs.name_code[idx].tolist(), strict=True)
    ]
    frame = pd.DataFrame({
        "name": names, "collective_type": [collective_type(n) for n in names],
        "start_ns": start, "end_ns": end, "duration_ns": end - start,
        "step": pd.array(np.where(inside, ids[np.clip(win, 0, None)], 0), dtype="Int64"),
        "seq": pd.array(
            [_int64(a.get("Seq", a.get("seq_num"))) for a in args], dtype="Int64"
        ),
        "num_bytes": pd.array([_message_bytes(a) for a in args], dtype="Int64"),
        "process_group": [str(a.get("Process Group Name", "")) for a in args],
        "thread": evs.thread[idx],
    })  # fmt: skip
    frame.loc[~inside, "step"] = pd.NA
    return frame.sort_values("start_ns", kind="stable").reset_index(drop=True)


def _class_sets(
    evs: _Events, targets: npt.NDArray[np.int8], not_compute: npt.NDArray[np.bool_]
) -> tuple[dict[str, IntervalSet], IntervalSet]:
    """Interval set of each class, and of the not-compute events (carved out of compute).

    One class's bounds alive at a time, sorted in place (peak memory of a large parse).
    """

    def merged(sel: npt.NDArray[np.bool_]) -> IntervalSet:
        return IntervalSet.from_arrays(evs.start_ns[sel], evs.end_ns[sel], owned=True)

    classes = {c: merged(targets == k) for k, c in enumerate(CLASSES)}
    return classes, merged(not_compute)


def parse_trace(
    trace: Path | str | dict[str, Any],
    *,
    regime: str | None = None,
    rules: RuleTable | None = None,
    source: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    unlaunched: str = "keep",
) -> ParsedTrace:
    """Classify a trace's events into interval sets per class and find its step windows.

    A file is decoded in chunks (bounded memory,
    :func:`commprof.traces.trace_columns.read_columns`);
    a dict is read in place. Both give the same result.

    Args:
        trace: A trace file path or an already loaded trace dict.
        regime: Force a regime (one of REGIMES); detected from the trace if None.
        rules: A custom rule table; overrides ``RULES[regime]``.
        source: Name of the trace for messages and the rank fallback (default:
            the path, or "<dict>").
        chunk_bytes: Bytes of a file's text decoded at a time.
        unlaunched: Device activities with no launch event in the trace (launched before
            profiling started): "keep" them (the default; they ran inside the profiled time)
            or "drop" them (HolisticTraceAnalysis' rule). docs/design.md, Definitions.

    Returns:
        The :class:`ParsedTrace`.

    Raises:
        ValueError: For unreadable or corrupt traces and unknown regimes.
    """
    if source is None:
        source = "<dict>" if isinstance(trace, dict) else str(trace)
    if unlaunched not in UNLAUNCHED_RULES:
        raise ValueError(f"unlaunched must be one of {UNLAUNCHED_RULES}, got {unlaunched!r}")
    tables = candidate_tables(regime, rules)  # validates regime before reading
    cols = read_columns(trace, tables, source=source, chunk_bytes=chunk_bytes)
    evs = _Events(cols)
    meta = cols.meta
    if regime is None:
        regime = rules.regime if rules is not None else detect_regime(meta, evs.cats, evs.names)
    if rules is None:
        rules = RULES[regime]
    orphan = _unlaunched(evs)
    targets, collective, not_compute = _classify(evs, rules, orphan & (unlaunched == "drop"))
    if unlaunched == "keep":  # classify them (again) to count their communication time
        comm_orphans = orphan & (targets == CLASSES.index("communication"))
    else:
        comm = CLASSES.index("communication")
        comm_orphans = orphan & (_classify(evs, rules, ~orphan)[0] == comm)

    def summed(mask: npt.NDArray[np.bool_]) -> int:
        return int((evs.end_ns[mask] - evs.start_ns[mask]).sum())

    classes, carve = _class_sets(evs, targets, not_compute)
    if len(carve):
        classes["compute"] = difference(classes["compute"], carve)
    work = [classes["communication"], classes["compute"]]
    ids, starts, ends, label = step_windows(cols, targets, work, source)
    info = meta.get("distributedInfo") or {}
    return ParsedTrace(
        source=source,
        rank=_rank_of(meta, source),
        world_size=int(info["world_size"]) if isinstance(info.get("world_size"), int) else None,
        regime=regime,
        step_ids=ids.astype(np.int64),
        step_start_ns=starts.astype(np.int64),
        step_end_ns=ends.astype(np.int64),
        step_source=label,
        classes=classes,
        collectives=_collectives(evs, np.flatnonzero(collective), starts, ends, ids),
        unlaunched_rule=unlaunched,
        num_unlaunched=int(orphan.sum()),
        unlaunched_ns=summed(orphan),
        unlaunched_comm_ns=summed(comm_orphans),
    )
