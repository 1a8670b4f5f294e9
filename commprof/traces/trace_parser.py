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
fields used (:mod:`commprof.traces.trace_reader`, :mod:`commprof.traces.column_builder`):
peak memory stays at a few compact columns per event plus one chunk, however large the
trace. Rules are evaluated on the distinct names and categories, then
broadcast to the events with numpy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import is_
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.column_builder import read_columns
from commprof.traces.comm_rules import CommRule, CommRules
from commprof.traces.intervals import Int64Array, IntervalSet, difference
from commprof.traces.kept_args import ABSENT, KeptArgs, absent
from commprof.traces.possible_comm import possible_comm, possible_ranges
from commprof.traces.trace_columns import BLOCK_EVENTS, TraceColumns, code_mask
from commprof.traces.trace_reader import CHUNK_BYTES, load_trace
from commprof.traces.trace_rules import (
    CLASSES,
    COMM_OP_PATTERN,
    DEFAULT_COMM,
    DEVICE_CATS,
    DTYPE_BYTES,
    GRAPH_LAUNCH_PATTERN,
    IGNORE,
    LAUNCH_CALL_PATTERN,
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
from commprof.traces.windows import (
    LAUNCH_SOURCE,
    cpu_step_windows,
    launch_windows,
    step_windows,
)

COMM_OP = re.compile(COMM_OP_PATTERN)

__all__ = [
    "CLASSES",
    "IGNORE",
    "LAUNCH_CATS",
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
    num_bytes, process_group, thread, group_size, type_source, library, point_to_point.
    ``step`` is the step whose
    ProfilerStep launched it, else the window it starts in, else NA (outside every window);
    type, group, size and sequence number come from the event's own args, else from its
    launching op (``type_source``: "args", "launching op", "op name", "event name"), unless the
    communication rule that claims the kernel types it by its name ("event name") or fixes it
    ("rule"); ``library`` and ``point_to_point`` are that rule's ("" and False where none)."""
    unlaunched_rule: str = "keep"
    """What was done with device activities whose launch is not in the trace: "keep" or "drop"."""
    num_unlaunched: int = 0
    """Device activities (kernels, memcpy, memset) with no launch event in the trace."""
    unlaunched_ns: int = 0
    """Their summed duration (ns)."""
    unlaunched_comm_ns: int = 0
    """The part of it in communication kernels (ns)."""
    num_duplicates: int = 0
    """Events dropped as exact duplicates of another (same category, name, start, end, thread)."""
    num_unfinished: int = 0
    """Events dropped as unfinished (the profiler saw an op's start or end, not both)."""
    control_chars_at: tuple[int, ...] = ()
    """Where the JSON held raw control characters inside strings, read leniently (byte offsets;
    ``TraceColumns.control_chars_at``)."""
    num_launch_calls: int = 0
    """Runtime calls that launch device work (``cudaLaunchKernel``, ``cudaGraphLaunch``, ...)."""
    num_graph_launches: int = 0
    """Of them, graph replays (``cudaGraphLaunch``, ``hipGraphLaunch``)."""
    num_device_events: int = 0
    """Device activities in the trace (kernels, memcpy, memset)."""
    num_launched: int = 0
    """Device activities whose launch is in the trace."""
    gpu_lag_ns: int | None = None
    """Median of (device activity start - its launch's start): how far the GPU runs behind the
    CPU (None without launched activities)."""
    has_backward: bool = False
    """A backward pass or an optimizer step shows in the kept names (training, not inference)."""
    counted: pd.DataFrame | None = field(default=None, repr=False)
    """What each class holds: per class its names with the most time (class, name,
    num_events, time_ns), at most COUNTED_TOP of a class (:func:`counted_names`)."""
    possible_comm: pd.DataFrame | None = field(default=None, repr=False)
    """Kernels counted as compute that may be communication (no rule claims them; name,
    num_events, time_ns, why, rule_line: :func:`commprof.traces.possible_comm.possible_comm`);
    None in the regimes whose communication is not kernels."""
    possible_ranges: pd.DataFrame | None = field(default=None, repr=False)
    """Host ranges named like communication that nothing counted accounts for (name,
    num_ranges, host_ns: CPU time, never kernel time;
    :func:`commprof.traces.possible_comm.possible_ranges`); None where ``possible_comm`` is."""

    @property
    def outside(self) -> pd.DataFrame:
        """The collectives in no step (launched outside every step and running outside every
        window)."""
        return self.collectives[self.collectives["step"].isna()]


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


def _first_codes(values: list[Any], dtype: type) -> tuple[npt.NDArray[Any], list[Any]]:
    """Codes of hashable values in order of first appearance, and the distinct values (TypeError
    if one is unhashable): one pass in C, each value ``setdefault`` with the count so far."""
    code: dict[Any, int] = {}
    codes: npt.NDArray[Any] = np.fromiter(
        map(code.setdefault, values, map(len, repeat(code))), dtype, len(values)
    )
    return codes, list(code)


def _category(values: list[str]) -> pd.Categorical:
    """A column of few distinct strings, from their codes: one string object per distinct
    value (a string column of a million collectives costs a pyarrow string each)."""
    codes, distinct = _first_codes(values, np.int32)
    return pd.Categorical.from_codes(codes, categories=pd.Index(distinct, dtype=object))


def _text_category(values: list[Any]) -> pd.Categorical:
    """``_category`` of the values as strings; the usual column, all strings already, coded
    as it is (no ``str`` of each value)."""
    try:
        codes, distinct = _first_codes(values, np.int32)
    except TypeError:  # an unhashable value (a list)
        return _category(list(map(str, values)))
    if all(type(d) is str for d in distinct):  # so every value is (decoded JSON)
        return pd.Categorical.from_codes(codes, categories=pd.Index(distinct, dtype=object))
    return _category(list(map(str, values)))


def _int_column(values: list[Any]) -> pd.api.extensions.ExtensionArray:
    """An Int64 column of integer args, NA where a value is no integer or is past int64
    (:func:`_int64`); the usual all-integer case in one numpy conversion."""
    if values and set(map(type, values)) == {int}:
        try:
            return pd.array(np.array(values, dtype=np.int64), dtype="Int64")
        except OverflowError:
            pass
    return pd.array([_int64(v) for v in values], dtype="Int64")


def _bytes_column(
    nelems: list[Any], dtypes: list[Any], row: Callable[[int], dict[str, Any]]
) -> pd.api.extensions.ExtensionArray:
    """The num_bytes column (:func:`_message_bytes` of each row, ``row(i)`` its args):
    ``In msg nelems`` times the size of ``dtype`` at once where both are known, each other row
    on its own."""
    try:
        dtype_code, distinct = _first_codes(dtypes, np.intp)
    except TypeError:  # an unhashable dtype
        return pd.array([_message_bytes(row(i)) for i in range(len(nelems))], dtype="Int64")
    size_of = {d: _dtype_bytes(d) for d in distinct}
    if set(map(type, nelems)) == {int} and None not in size_of.values():
        # the usual case, at once in numpy: every row an integer count of a known dtype
        try:
            n = np.array(nelems, np.int64)
        except OverflowError:
            n = None
        if n is not None and ((n > -(2**40)) & (n < 2**40)).all():
            size = np.array(list(size_of.values()), np.int64)[dtype_code]
            return pd.arrays.IntegerArray(n * size, np.zeros(n.size, bool))
    sizes = list(map(size_of.__getitem__, dtypes))
    ok = [
        type(n) is int and z is not None and abs(n) < 2**40
        for n, z in zip(nelems, sizes, strict=True)
    ]
    out: list[int | None] = [
        n * z if good else None  # type: ignore[operator]  # good: both are ints
        for n, z, good in zip(nelems, sizes, ok, strict=True)
    ]
    for i in [i for i, good in enumerate(ok) if not good]:
        out[i] = _message_bytes(row(i))
    return pd.array(out, dtype="Int64")


class _MergedArgs:
    """Each collective's args: its own over its launching op's (``{**op, **own}``), read a key
    column at a time from the kept args' columns (a numpy ``take`` of each); no merged dict is
    built but for the rare row that needs all of it, and the ops' values are read only where the
    own args lack the key."""

    def __init__(self, kept: KeptArgs, own: npt.NDArray[np.intp], op: npt.NDArray[np.intp]) -> None:
        self._kept = kept
        self.own_rows, self.op_rows = kept.rows(own), kept.rows(op)
        """Each collective's row in the kept args, and its launching op's (-1: none)."""
        self.any_own = bool((self.own_rows >= 0).any())
        self.any_ops = bool((self.op_rows >= 0).any())

    def __len__(self) -> int:
        return int(self.own_rows.size)

    def own(self, key: str) -> list[Any]:
        """The own args' value of ``key`` of each row (``ABSENT`` where they lack it)."""
        return self._kept.column(key, self.own_rows)

    def op(self, key: str) -> list[Any]:
        """The launching op's value of ``key`` of each row (``ABSENT`` where none holds it)."""
        return self._kept.column(key, self.op_rows)

    def values(self, key: str, default: Any = None) -> list[Any]:
        """The merged ``get(key, default)`` of each row: the own args' value, where they hold
        the key, else the op's."""
        out, gaps = self.held(key)
        for i in gaps:
            out[i] = default
        return out

    def held(self, key: str) -> tuple[list[Any], list[int]]:
        """``values(key, ABSENT)`` and the rows whose merged args lack the key."""
        if not self.any_own:  # RCCL, symmetric memory: no kernel carries metadata
            out = self.op(key)
            return out, absent(out)
        out = self.own(key)
        gaps = absent(out)
        if gaps and self.any_ops:
            fill = self._kept.column(key, self.op_rows[gaps])
            for i, value in zip(gaps, fill, strict=True):
                out[i] = value
            gaps = list(compress(gaps, map(is_, fill, repeat(ABSENT))))
        return out, gaps

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i``'s merged args."""
        return {**self._kept.at(int(self.op_rows[i])), **self._kept.at(int(self.own_rows[i]))}


class _Events:
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


def _unlaunched(evs: _Events) -> npt.NDArray[np.bool_]:
    """Device activities whose CUPTI correlation id matches no launch (runtime) event.

    They were launched before the profiler started (or their launch was not recorded).
    """
    out = evs.launch_index() < 0
    out &= evs.cat_mask(LAUNCHED_CATS)
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


OP_DEPTH = 4
"""Enclosing ops searched for a collective's launching op, innermost first (record_param_comms >
nccl:all_reduce, under ops of other names: a few deep in real traces)."""
TRAINING_NAMES = re.compile(r"(?i).*(backward|autograd::engine|optimizer)")
"""Names that show a training step (a backward pass or an optimizer step), not inference."""
COUNTED_TOP = {"communication": 5, "compute": 3}
"""Names listed per class in ``ParsedTrace.counted`` (other classes: COUNTED_TOP_OTHER)."""
COUNTED_TOP_OTHER = 2
LAUNCH_WINDOW_REGIMES = frozenset({"cuda-nccl", "cuda-single"})
"""Regimes whose communication and compute are device activities: their step windows follow
the GPU through the launches (in cuda-gloo the communication is host time, in CPU windows)."""


def _step_index(
    cpu: tuple[Int64Array, Int64Array, Int64Array] | None,
    at_ns: Int64Array,
    valid: npt.NDArray[np.bool_],
) -> npt.NDArray[np.intp]:
    """Index of the CPU window each time lies in (-1: none, or not ``valid``)."""
    if cpu is None or not at_ns.size:
        return np.full(at_ns.size, -1, np.intp)
    _, lo, hi = cpu
    win = np.searchsorted(lo, at_ns, side="right") - 1
    inside = valid & (win >= 0) & (at_ns < hi[np.maximum(win, 0)])
    return np.where(inside, win, -1)


def _launching_ops(
    evs: _Events, idx: npt.NDArray[np.intp], launch: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """For each collective: its launching op with metadata and its launching op with a typed
    name (indices of events, -1 for none).

    The launching ops enclose the launch (the runtime call the kernel's correlation id names)
    on its thread: ``record_param_comms`` carries ``Collective name``, group, size and sequence
    number; ``nccl:all_to_all`` names the collective. The innermost enclosing op of each kind
    is taken, up to OP_DEPTH deep.
    """
    with_args = np.full(idx.size, -1, np.intp)
    with_name = np.full(idx.size, -1, np.intp)
    cols = evs.cols
    op_code = [COMM_OP.match(str(n)) is not None for n in cols.names]
    ops = np.flatnonzero(code_mask(cols.name_code, op_code) & ~evs.cat_mask(DEVICE_CATS))
    has = np.flatnonzero(launch >= 0)
    if not ops.size or not has.size:
        return with_args, with_name
    op_has_args = evs.with_arg("Collective name")
    typed_code = np.array(
        [ok and collective_type(n) != "unknown" for ok, n in zip(op_code, cols.names, strict=True)]
    )
    lthread = cols.launch_thread[launch[has]]
    lstart = cols.launch_start_ns[launch[has]]
    for thread in np.unique(lthread):
        o = ops[evs.thread[ops] == thread]
        if not o.size:
            continue
        o = o[np.argsort(evs.start_ns[o], kind="stable")]
        o_start, o_end = evs.start_ns[o], evs.end_ns[o]
        sel = lthread == thread
        at, who = lstart[sel], has[sel]
        pos = np.searchsorted(o_start, at, side="right") - 1
        for depth in range(OP_DEPTH):  # innermost first: fill only what is still missing
            j = np.maximum(pos - depth, 0)
            inside = (pos - depth >= 0) & (o_end[j] >= at)
            cand = o[j]
            take = inside & op_has_args[cand] & (with_args[who] < 0)
            with_args[who[take]] = cand[take]
            take = inside & typed_code[evs.name_code[cand]] & (with_name[who] < 0)
            with_name[who[take]] = cand[take]
    return with_args, with_name


def _collectives(
    evs: _Events,
    idx: npt.NDArray[np.intp],
    windows: tuple[Int64Array, Int64Array, Int64Array],
    cpu: tuple[Int64Array, Int64Array, Int64Array] | None,
    comm: CommRules | None = None,
) -> pd.DataFrame:
    """The collectives table (see ``ParsedTrace.collectives``)."""
    ids, starts, ends = windows
    start, end = evs.start_ns[idx], evs.end_ns[idx]
    launch = evs.launch_of(idx)
    with_args, with_name = _launching_ops(evs, idx, launch)
    lstarts = evs.cols.launch_start_ns
    launch_start = lstarts[np.maximum(launch, 0)] if lstarts.size else start
    by_launch = _step_index(cpu, launch_start, launch >= 0)
    win = np.searchsorted(starts, start, side="right") - 1
    inside = (win >= 0) & (start < ends[np.clip(win, 0, None)])
    step = np.where(inside, ids[np.clip(win, 0, None)], 0)
    if cpu is not None:
        step = np.where(by_launch >= 0, cpu[0][np.maximum(by_launch, 0)], step)
    known = inside | (by_launch >= 0)
    merged = _MergedArgs(evs.cols.args, idx, with_args)
    event_code = evs.name_code[idx]
    op_code = np.where(with_name >= 0, evs.name_code[np.maximum(with_name, 0)], -1)
    claimed = {evs.names[c] for c in np.unique(event_code).tolist()}
    claims = {n: comm.claim(str(n)) for n in claimed} if comm is not None else {}
    typed = _typed(merged, event_code, op_code.astype(np.int64), evs.names, claims)
    frame = pd.DataFrame({
        "name": typed["name"], "collective_type": typed["collective_type"],
        "start_ns": start, "end_ns": end, "duration_ns": end - start,
        "step": pd.array(step, dtype="Int64"),
        "seq": _int_column(_seq(merged)),
        "num_bytes": _bytes_column(
            merged.values("In msg nelems"), merged.values("dtype"), merged.row
        ),
        "process_group": _text_category(merged.values("Process Group Name", "")),
        "thread": evs.thread[idx],
        "group_size": _int_column(merged.values("Group size")),
        "type_source": typed["type_source"],
        "library": typed["library"], "point_to_point": typed["point_to_point"],
    })  # fmt: skip
    frame.loc[~known, "step"] = pd.NA
    return frame.sort_values("start_ns", kind="stable").reset_index(drop=True)


def _seq(merged: _MergedArgs) -> list[Any]:
    """``Seq`` of each row, else its ``seq_num`` (older PyTorch)."""
    seq, gaps = merged.held("Seq")
    if gaps:
        old = merged.values("seq_num")
        for i in gaps:
            seq[i] = old[i]
    return seq


_Typed = tuple[Any, Any, str, str, bool]
"""A collective's name, the name its type is read from, type source, library, point-to-point."""


def _type_one(
    a: dict[str, Any], o: dict[str, Any], event_name: Any, op_name: Any, rule: CommRule | None
) -> _Typed:
    """One collective's name and type source (``ParsedTrace.collectives``): the claiming rule's
    fixed type or kernel name, else ``Collective name`` in its own args, then its launching
    op's, then the launching ``nccl:<op>``'s name, then the kernel name."""
    library = rule.library if rule is not None else ""
    p2p = rule is not None and rule.kind == "point_to_point"
    if rule is not None and rule.type_from == "fixed":
        return event_name, rule.collective_type, "rule", library, p2p
    if rule is not None and rule.type_from == "name":
        return event_name, event_name, "event name", library, p2p
    if "Collective name" in a:
        return a["Collective name"], a["Collective name"], "args", library, p2p
    if "Collective name" in o:
        return o["Collective name"], o["Collective name"], "launching op", library, p2p
    if op_name is not None:
        return event_name, op_name, "op name", library, p2p
    return event_name, event_name, "event name", library, p2p


def _factorized(values: list[Any]) -> npt.NDArray[np.int64]:
    """Codes of hashable values in order of first appearance (TypeError if one is not)."""
    if values and hash(values[0]) is not None and values.count(values[0]) == len(values):
        return np.zeros(len(values), np.int64)  # one value all through (list.count runs in C)
    return _first_codes(values, np.int64)[0]


def _combined(columns: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """One int64 key per row, equal where the rows are equal in every column (the columns'
    codes combined one column at a time, each product below rows squared)."""
    key = np.zeros(columns[0].size, np.int64)
    for col in columns:
        _, code = np.unique(col, return_inverse=True)
        key = key * (int(code.max(initial=0)) + 1) + code.reshape(-1)
        _, key = np.unique(key, return_inverse=True)
        key = key.reshape(-1).astype(np.int64)
    return key


def _from_combos(values: list[Any], inverse: npt.NDArray[np.intp]) -> pd.Categorical:
    """A categorical column whose row i holds ``values[inverse[i]]`` (as strings)."""
    text = [str(v) for v in values]
    distinct = list(dict.fromkeys(text))
    code = {v: i for i, v in enumerate(distinct)}
    codes = np.array([code[t] for t in text], np.int32)[inverse]
    return pd.Categorical.from_codes(codes, categories=pd.Index(distinct, dtype=object))


def _typed(
    merged: _MergedArgs,
    event_code: npt.NDArray[np.int32],
    op_code: npt.NDArray[np.int64],
    names: list[Any],
    claims: dict[Any, CommRule | None],
) -> dict[str, Any]:
    """The name, collective_type, type_source, library and point_to_point columns: each
    collective's :func:`_type_one`, computed once per distinct combination of what it reads
    (kernel name, launching op name, the two ``Collective name`` values; a trace of many
    collectives holds few), then spread to the rows with numpy."""
    missing, num = ABSENT, len(merged)
    own_cn = merged.own("Collective name")
    # The op's is read only where some kernel's own args lack it (_type_one: the own first)
    op_cn = merged.op("Collective name") if missing in own_cn else [missing] * num
    try:
        keys = _combined([event_code.astype(np.int64), op_code, _factorized(own_cn),
                          _factorized(op_cn)])  # fmt: skip
    except TypeError:  # an unhashable Collective name (a list): every collective on its own
        keys = np.arange(num, dtype=np.int64)
    if not num:
        combos, inverse = np.empty(0, np.intp), np.empty(0, np.intp)
    else:
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # combinations in order of first appearance
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        combos, inverse = first[order], rank[np.asarray(inverse).reshape(-1)]
    inverse = np.asarray(inverse).reshape(-1)
    rows = []
    for i in combos.tolist():
        a = {} if own_cn[i] is missing else {"Collective name": own_cn[i]}
        o = {} if op_cn[i] is missing else {"Collective name": op_cn[i]}
        op_name = names[op_code[i]] if op_code[i] >= 0 else None
        event_name = names[event_code[i]]
        rows.append(_type_one(a, o, event_name, op_name, claims.get(event_name)))
    name, kind, how, library, p2p = (
        (list(c) for c in zip(*rows, strict=True)) if rows else ([], [], [], [], [])
    )
    return {
        "name": _from_combos(name, inverse),
        "collective_type": _from_combos([collective_type(k) for k in kind], inverse),
        "type_source": _from_combos(how, inverse),
        "library": _from_combos(library, inverse),
        "point_to_point": np.array(p2p, bool)[inverse] if rows else np.zeros(0, bool),
    }


def counted_names(evs: _Events, targets: npt.NDArray[np.int8]) -> pd.DataFrame:
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
    comm_rules: CommRules | None = None,
) -> ParsedTrace:
    """Classify a trace's events into interval sets per class and find its step windows.

    A file is decoded in chunks (bounded memory,
    :func:`commprof.traces.column_builder.read_columns`);
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
        comm_rules: Which kernels are communication (default: the shipped rules,
            :func:`commprof.traces.comm_rules.default_rules`; ``resolve_rules`` adds a user's).

    Returns:
        The :class:`ParsedTrace`.

    Raises:
        ValueError: For unreadable or corrupt traces and unknown regimes.
    """
    if source is None:
        source = "<dict>" if isinstance(trace, dict) else str(trace)
    if unlaunched not in UNLAUNCHED_RULES:
        raise ValueError(f"unlaunched must be one of {UNLAUNCHED_RULES}, got {unlaunched!r}")
    tables = candidate_tables(regime, rules, comm_rules)  # validates regime before reading
    cols = read_columns(trace, tables, source=source, chunk_bytes=chunk_bytes)
    evs = _Events(cols)
    meta = cols.meta
    if regime is None:
        comm_kernel = re.compile((comm_rules or DEFAULT_COMM).comm_pattern())
        regime = (
            rules.regime
            if rules is not None
            else detect_regime(meta, evs.cats, evs.names, comm_kernel)
        )
    if rules is None:
        rules = {t.regime: t for t in tables}.get(regime, RULES[regime])
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
    cpu = cpu_step_windows(cols)
    device = np.flatnonzero(evs.cat_mask(LAUNCHED_CATS))
    launch = evs.launch_of(device)
    found = launch >= 0
    launch_start = cols.launch_start_ns[launch[found]]
    dev_step = np.full(device.size, -1, np.intp)
    dev_step[found] = _step_index(cpu, launch_start, np.ones(launch_start.size, bool))
    if cpu is not None and regime in LAUNCH_WINDOW_REGIMES and (dev_step >= 0).any():
        ids, starts, ends = launch_windows(cpu, dev_step, evs.start_ns[device], evs.end_ns[device])
        label = LAUNCH_SOURCE
    else:
        ids, starts, ends, label = step_windows(cols, targets, work, source)
    lag = evs.start_ns[device[found]] - launch_start
    names = cols.names
    call = [LAUNCH_CALL_PATTERN.match(str(n)) is not None for n in names]
    graph = [GRAPH_LAUNCH_PATTERN.match(str(n)) is not None for n in names]
    info = meta.get("distributedInfo") or {}
    world_size = int(info["world_size"]) if isinstance(info.get("world_size"), int) else None
    collectives = _collectives(
        evs, np.flatnonzero(collective), (ids, starts, ends), cpu, rules.comm
    )
    types = frozenset(map(str, collectives["collective_type"].unique()))
    possible = _possible(evs, targets, rules.comm, types)
    return ParsedTrace(
        source=source,
        rank=_rank_of(meta, source),
        world_size=1 if world_size is None and regime == "cuda-single" else world_size,
        regime=regime,
        step_ids=ids.astype(np.int64),
        step_start_ns=starts.astype(np.int64),
        step_end_ns=ends.astype(np.int64),
        step_source=label,
        classes=classes,
        collectives=collectives,
        unlaunched_rule=unlaunched,
        num_unlaunched=int(orphan.sum()),
        unlaunched_ns=summed(orphan),
        unlaunched_comm_ns=summed(comm_orphans),
        num_duplicates=cols.num_duplicates,
        num_unfinished=cols.num_unfinished,
        control_chars_at=cols.control_chars_at,
        num_launch_calls=int(code_mask(cols.launch_name_code, call).sum()),
        num_graph_launches=int(code_mask(cols.launch_name_code, graph).sum()),
        num_device_events=int(device.size),
        num_launched=int(found.sum()),
        gpu_lag_ns=int(np.median(lag)) if lag.size else None,
        has_backward=any(TRAINING_NAMES.match(str(n)) for n in names),
        counted=counted_names(evs, targets),
        possible_comm=possible[0],
        possible_ranges=possible[1],
    )


def _possible(
    evs: _Events, targets: npt.NDArray[np.int8], comm: CommRules | None, types: frozenset[str]
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The possible communication not counted, kernels and host ranges
    (:mod:`commprof.traces.possible_comm`; ``types``: the counted collectives' types); None
    where the rules have no communication rules."""
    if comm is None:
        return None, None
    launch = np.full(len(evs), -1, np.intp)
    kernels = np.flatnonzero(evs.cat_mask(frozenset({"kernel"})))
    launch[kernels] = evs.launch_of(kernels)
    return possible_comm(evs.cols, targets, comm, launch), possible_ranges(
        evs.cols, targets, launch, types
    )
