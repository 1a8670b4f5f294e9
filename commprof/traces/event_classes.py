"""The rule tables applied to a trace's columns: each complete event's class, and what each class
holds.

Each complete event (``ph == "X"``) is classified by the first matching rule of its regime's
:class:`commprof.traces.trace_rules.RuleTable` (``RULES``: cpu-gloo, cuda-nccl, cuda-gloo).
Rules are evaluated on the distinct names and categories, then broadcast to the events with numpy
(:class:`Events`); a device event's thread is its launch's (the CUPTI correlation id).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.intervals import IntervalSet
from commprof.traces.trace_columns import BLOCK_EVENTS, TraceColumns, code_mask
from commprof.traces.trace_rules import CLASSES, DEVICE_CATS, IGNORE, LAUNCHED_CATS, RuleTable

COUNTED_TOP = {"communication": 5, "compute": 3}
"""Names listed per class in ``ParsedTrace.counted`` (other classes: COUNTED_TOP_OTHER)."""
COUNTED_TOP_OTHER = 2


class Events:
    """Rule predicates over the columns of a trace's complete ("X") events."""

    def __init__(self, cols: TraceColumns) -> None:
        self.cols = cols
        self.start_ns, self.end_ns, self.thread = cols.start_ns, cols.end_ns, cols.thread
        self.cat_code, self.cats = cols.cat_code, cols.cats
        self.name_code, self.names = cols.name_code, cols.names
        self._with_arg: dict[str, npt.NDArray[np.bool_]] = {}
        self._launch: npt.NDArray[Any] | None = None

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

    def with_arg(self, key: str) -> npt.NDArray[np.bool_]:
        """Per event: whether its kept args hold ``key`` (found once per key)."""
        held = self._with_arg.get(key)
        if held is None:  # over the few events whose args were kept, not over every event
            held = self._with_arg[key] = np.zeros(len(self), bool)
            held[self.cols.args.events_with(key)] = True
        return held

    def has_arg(self, idx: npt.NDArray[np.intp], key: str) -> npt.NDArray[np.bool_]:
        return self.with_arg(key)[idx]

    def launch_index(self) -> npt.NDArray[Any]:
        """Per event: the index of its launch in the launch columns, -1 where none is in the
        trace. Found once (several steps ask), a block of events at a time: sorted ids and a
        binary search, temporaries of a block, not of the trace."""
        if self._launch is None:
            lc, corr = self.cols.launch_correlation, self.cols.correlation
            out = np.full(len(self), -1, np.int32 if lc.size < 2**31 else np.int64)
            for lo in range(0, len(self) if lc.size else 0, BLOCK_EVENTS):
                block = corr[lo : lo + BLOCK_EVENTS]
                pos = np.minimum(np.searchsorted(lc, block), lc.size - 1)
                out[lo : lo + BLOCK_EVENTS] = np.where((lc[pos] == block) & (block != -1), pos, -1)
            self._launch = out
            return out
        return self._launch

    def launch_of(self, idx: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
        """Index in the launch columns of each event's launch (-1: none in the trace)."""
        return self.launch_index()[idx].astype(np.intp)

    def launch_thread(self, idx: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
        # Device events carry no thread of their own: map them through the CUPTI
        # correlation id to the runtime call that launched them (-1 if none).
        out = self.thread[idx].copy()
        device = self.cat_mask(DEVICE_CATS)[idx]
        if device.any():
            pos = self.launch_of(idx[device])
            out[device] = np.where(pos >= 0, self.cols.launch_thread[np.maximum(pos, 0)], -1)
        return out


def unlaunched_events(evs: Events) -> npt.NDArray[np.bool_]:
    """Device activities whose CUPTI correlation id matches no launch (runtime) event.

    They were launched before the profiler started (or their launch was not recorded).
    """
    out = evs.launch_index() < 0
    out &= evs.cat_mask(LAUNCHED_CATS)
    return out


def classify(
    evs: Events, table: RuleTable, skip: npt.NDArray[np.bool_]
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


def counted_names(evs: Events, targets: npt.NDArray[np.int8]) -> pd.DataFrame:
    """What was counted in each class: its names with the most summed event time.

    Returns:
        class, name, num_events, time_ns (the events' summed durations, overlaps counted
        twice), at most COUNTED_TOP of a class, most time first.
    """
    dur = evs.end_ns - evs.start_ns
    rows = []
    for k, cls in enumerate(CLASSES):
        sel = targets == k
        if not sel.any():
            continue
        codes = evs.name_code[sel]
        time_ns = np.bincount(codes, weights=dur[sel], minlength=len(evs.names))
        count = np.bincount(codes, minlength=len(evs.names))
        top = np.argsort(-time_ns, kind="stable")[: COUNTED_TOP.get(cls, COUNTED_TOP_OTHER)]
        rows += [
            {"class": cls, "name": str(evs.names[c]), "num_events": int(count[c]),
             "time_ns": int(time_ns[c])}
            for c in top.tolist() if count[c]
        ]  # fmt: skip
    return pd.DataFrame(rows, columns=["class", "name", "num_events", "time_ns"])


def class_sets(
    evs: Events, targets: npt.NDArray[np.int8], not_compute: npt.NDArray[np.bool_]
) -> tuple[dict[str, IntervalSet], IntervalSet]:
    """Interval set of each class, and of the not-compute events (carved out of compute).

    One class's bounds alive at a time, sorted in place (peak memory of a large parse).
    """

    def merged(sel: npt.NDArray[np.bool_]) -> IntervalSet:
        return IntervalSet.from_arrays(evs.start_ns[sel], evs.end_ns[sel], owned=True)

    classes = {c: merged(targets == k) for k, c in enumerate(CLASSES)}
    return classes, merged(not_compute)
