"""The column builder: a trace's complete events, decoded a chunk at a time, taken into
:class:`commprof.traces.trace_columns.TraceColumns`.

The reader (:mod:`commprof.traces.trace_reader`) cuts a trace file into chunks of events; each
is decoded (:mod:`commprof.traces.event_structs`), its kept events picked
(:mod:`commprof.traces.event_selection`), and taken a column at a time, each pass iterated in C
(``map``, ``compress``, ``np.fromiter``): ts and dur as read (:mod:`commprof.traces.event_times`
converts and checks them a block at a time), the category, name and (pid, tid) codes
(:mod:`commprof.traces.code_tables`), the CUPTI correlation id, and the collective ``args`` keys
of the few events a rule table may count as collectives or test with ``has_arg``
(:mod:`commprof.traces.kept_args`). A trace dict, and a chunk decoded as plain values, are taken
an event at a time. :func:`read_columns` is the front door.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterable
from itertools import compress, repeat
from operator import attrgetter, is_not, not_
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from commprof.traces.code_tables import CodeTables
from commprof.traces.duplicate_events import drop_duplicates
from commprof.traces.event_selection import EventSelection
from commprof.traces.event_structs import GET, PlainChunk, event_type
from commprof.traces.event_times import EventTimes, to_ns
from commprof.traces.kept_args import KeptArgsBuilder
from commprof.traces.trace_columns import BLOCK_EVENTS, TraceColumns, code_mask, drop_events
from commprof.traces.trace_reader import CHUNK_BYTES, NUM_PH_CHECKED, stream_chunks
from commprof.traces.trace_rules import (
    COLLECTIVE_ARG_KEYS,
    LAUNCH_CATS,
    PYTHON_FUNCTION_CAT,
    RAW_ARG_KEYS,
    TEXT_ARG_KEYS,
    RuleTable,
)

UNSET = msgspec.UNSET
_TS_DUR = attrgetter("ts", "dur")
_TIMES = np.dtype([("ts", np.float64), ("dur", np.float64)])
_ARGS_CORR = attrgetter("args.correlation")
_CORR, _NO_CORR = repeat("correlation"), repeat(-1)


def _int64_or_none(value: Any) -> int:
    """A correlation id as the column holds it: -1 where it is no int64 integer."""
    if type(value) is int and -(2**63) <= value < 2**63:
        return value
    return -1


def _is_launch(cat: Any) -> bool:
    return type(cat) is str and cat in LAUNCH_CATS


class ColumnBuilder:
    """Accumulates :class:`TraceColumns` a decoded chunk (``add_chunk``) or an event
    (``add``) at a time, then ``finish``.

    Args are kept only for events a rule of ``tables`` may make a collective
    (category and name match a ``collective`` rule), test with ``has_arg``, or whose name is a
    collective's launching op (COMM_OP_PATTERN): their :data:`COLLECTIVE_ARG_KEYS` and
    ``has_arg`` keys, nothing else.
    """

    def __init__(self, source: str, tables: Iterable[RuleTable]) -> None:
        self.source = source
        self.tables = tuple(tables)
        self.meta: dict[str, Any] = {}
        """Top-level keys of the trace, filled by the reader before the events it precedes."""
        self.control_chars_at: list[int] = []
        """Byte offsets of raw control characters in strings, read leniently (the reader's)."""
        self.launch_corr, self.launch_ts_us = array("q"), array("d")
        self.launch_pair, self.launch_name = array("q"), array("i")
        """The launches kept apart (``EventSelection.launch_only``): correlation id, ts (float
        us), (pid, tid) pair code and name code."""
        rules = [r for t in self.tables for r in t.rules]
        # A collective rule that needs an args key keeps only events that have it (has_keys).
        coll_rules = [r for r in rules if r.collective and r.has_arg is None]
        self.has_keys = tuple(
            dict.fromkeys(["Collective name", *(r.has_arg for r in rules if r.has_arg is not None)])
        )  # an op's metadata (launching ops) is kept where it names its collective
        self.keep_keys = tuple(dict.fromkeys((*COLLECTIVE_ARG_KEYS, *self.has_keys)))
        self.struct_keys = tuple(k for k in self.keep_keys if k != "correlation")
        self.event_type = event_type(self.struct_keys)
        self.kept_fields = [(f"k{i}", key) for i, key in enumerate(self.struct_keys)]
        self.has_fields = [
            f"k{self.struct_keys.index(k)}" for k in self.has_keys if k in self.struct_keys
        ]
        self.select = EventSelection(self.tables, self.struct_keys, self.event_type)
        """Decodes the chunks and picks the events kept (decided at the first chunk)."""
        self.codes = CodeTables(source, coll_rules)
        """The category, name, pid and tid codes."""
        self.times = EventTimes(source)
        """The kept events' starts and ends."""
        self.cat_code, self.name_code = array("i"), array("i")
        self.pair_code, self.correlation = array("q"), array("q")
        self.args = KeptArgsBuilder(
            self.struct_keys, tuple(f for f, _ in self.kept_fields), RAW_ARG_KEYS, TEXT_ARG_KEYS
        )

    def __len__(self) -> int:
        """Complete events kept so far."""
        return len(self.times)

    def decode(self, data: bytes) -> list[Any]:
        """Decode a chunk of events (:meth:`EventSelection.decode`), deciding first what is kept
        (the top-level keys before the events are read by now)."""
        if not self.select.decided:
            self.select.decide(self.meta)
        return self.select.decode(data)

    def _name_at(self, index: int) -> Any:
        """The name of the kept event at ``index`` (for a message)."""
        return list(self.codes.names)[self.name_code[index]]

    def add_chunk(self, chunk: list[Any]) -> int:
        """Take one decoded chunk of ``traceEvents``; returns its number of items."""
        if isinstance(chunk, PlainChunk):
            for e in chunk:
                self.add(e)
            return len(chunk)
        # Column at a time over the chunk's complete events: map, compress and array
        # appends, no per-event Python function call.
        sel, codes, times = self.select, self.codes, self.times
        if not sel.decided:
            sel.decide(self.meta)
        types: npt.NDArray[np.intp] | None = None
        launches: list[Any] = []
        try:
            if sel.tagged is not None and chunk and type(chunk[0]) is not self.event_type:
                launches, xs, types = sel.kept_tagged(chunk)
            else:
                xs = sel.kept(chunk)
        except TypeError:  # an unhashable category or name: take the events one by one
            if sel.tagged is not None and sel.tagged.python_names:  # Python frames whole
                sel.tagged.read_python()
                chunk = sel.tagged.decoder.decode(sel.data)
            for e in chunk:
                self.add(msgspec.structs.asdict(e) | {"cat": e.cat, "ph": e.ph})
            return len(chunk)
        if sel.launch_only and types is None:  # launches into the launch columns only
            is_launch = list(map(LAUNCH_CATS.__contains__, map(GET["cat"], xs)))
            launches = list(compress(xs, is_launch))
            if launches:
                xs = list(compress(xs, map(not_, is_launch)))
        if launches:
            self._add_launches(launches)
        if not xs:
            return len(chunk)
        base = len(self)
        ts_dur = np.fromiter(map(_TS_DUR, xs), _TIMES, len(xs))  # both in one pass
        times.ts_us.frombytes(ts_dur["ts"].tobytes())
        times.dur_us.frombytes(ts_dur["dur"].tobytes())
        if types is None:
            cc = codes.codes(codes.cats, xs, "cat", codes.cat_bits)
        else:
            cc = self._type_cat_codes(types)
        nc, pairs = codes.name_pair_codes(xs)
        self.cat_code.frombytes(cc.astype(np.int32).tobytes())
        self.name_code.frombytes(nc.astype(np.int32).tobytes())
        self.pair_code.frombytes(pairs.tobytes())
        args = list(map(GET["args"], xs))
        self._append_corr(self.correlation, list(map(getattr, args, _CORR, _NO_CORR)))
        bits = np.asarray(codes.cat_bits, np.int64)[cc] & np.asarray(codes.name_bits, np.int64)[nc]
        keep = set(np.flatnonzero(bits).tolist())
        for field in self.has_fields:  # getattr of None, or of a launch's args: UNSET too
            has = map(is_not, map(getattr, args, repeat(field), repeat(UNSET)), repeat(UNSET))
            keep.update(compress(range(len(args)), has))
        if keep:
            self._keep_args(args, sorted(keep), base)
        if len(times.ts_us) >= BLOCK_EVENTS:
            times.flush(self._name_at)
        return len(chunk)

    def _type_cat_codes(self, types: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
        """Category codes of events by their struct type index, new categories coded in order
        of first appearance (as ``CodeTables.codes`` does)."""
        sel, tables = self.select, self.codes
        codes = np.asarray(sel.type_cat_code, np.int64)[types]
        new = types[codes < 0]
        if new.size:
            _, first = np.unique(new, return_index=True)
            for t in new[np.sort(first)].tolist():
                sel.type_cat_code[t] = tables.code(tables.cats, sel.type_cat[t], tables.cat_bits)
            codes = np.asarray(sel.type_cat_code, np.int64)[types]
        return codes

    def _keep_args(self, args: list[Any], where: list[int], base: int) -> None:
        """Keep the ``args`` at ``where`` (indices in the chunk; ``base``: the chunk's first
        event): their kept keys gathered into the key columns while the chunk is in cache
        (:class:`commprof.traces.kept_args.KeptArgsBuilder`), none where no key is held (a
        launch's args hold the correlation only)."""
        held = list(map(args.__getitem__, where))
        index = list(compress(map(base.__add__, where), held))  # structs are true, None is not
        self.args.add_structs(index, list(filter(None, held)))

    def _add_launches(self, launches: list[Any]) -> None:
        """Append a chunk's launches to the launch columns (``launch_only``)."""
        try:
            corr = list(map(_ARGS_CORR, launches))
        except AttributeError:  # a launch without args
            corr = list(map(getattr, map(GET["args"], launches), _CORR, _NO_CORR))
        self._append_corr(self.launch_corr, corr)
        ts = np.fromiter(map(GET["ts"], launches), np.float64, len(launches))
        self.launch_ts_us.frombytes(ts.tobytes())
        names, pairs = self.codes.name_pair_codes(launches)
        self.launch_pair.frombytes(pairs.tobytes())
        self.launch_name.frombytes(names.astype(np.int32).tobytes())

    @staticmethod
    def _append_corr(column: array[int], corr: list[Any]) -> None:
        try:
            column.fromlist(corr)
        except (TypeError, OverflowError):  # the array is unchanged: check each value
            column.fromlist([_int64_or_none(c) for c in corr])

    def add(self, e: Any) -> None:
        """Take one item of ``traceEvents``; anything but a complete ("X") event is skipped."""
        # The hot loop of a parse (once per event): dict lookups and array appends
        # only; new codes and odd values take the slow paths in the except clauses.
        if not isinstance(e, dict) or e.get("ph") != "X":
            return
        sel, codes, times = self.select, self.codes, self.times
        if len(times.ts_us) >= BLOCK_EVENTS:
            times.flush(self._name_at)
        if not sel.decided:
            sel.decide(self.meta)
        if sel.relevant is not None:
            cat = e.get("cat")
            if type(cat) is not str or cat not in sel.relevant:
                if cat == PYTHON_FUNCTION_CAT:
                    if not (sel.read_python and sel.needs_frame(e.get("name", ""))):
                        return
                elif (type(cat) is str and cat in sel.skip_cats) or not sel.needs_name(
                    e.get("name", "")
                ):
                    return
            if sel.launch_only and _is_launch(cat):
                a = e.get("args")
                corr = a.get("correlation", -1) if type(a) is dict else -1
                self.launch_corr.append(_int64_or_none(corr))
                launch_ts: Any = e.get("ts")
                try:
                    self.launch_ts_us.append(launch_ts)
                except (TypeError, OverflowError):
                    self.launch_ts_us.append(times.number(launch_ts, "ts", e))
                self.launch_pair.append(codes.pair(e.get("pid"), e.get("tid")))
                self.launch_name.append(codes.code(codes.names, e.get("name", ""), codes.name_bits))
                return
        ts: Any = e.get("ts")
        dur: Any = e.get("dur")
        try:
            times.ts_us.append(ts)
        except (TypeError, OverflowError):
            times.ts_us.append(times.number(ts, "ts", e))
        try:
            times.dur_us.append(dur)
        except (TypeError, OverflowError):
            times.dur_us.append(times.number(dur, "dur", e))
        cc = codes.code(codes.cats, e.get("cat", ""), codes.cat_bits)
        nc = codes.code(codes.names, e.get("name", ""), codes.name_bits)
        self.cat_code.append(cc)
        self.name_code.append(nc)
        self.pair_code.append(codes.pair(e.get("pid"), e.get("tid")))
        a = e.get("args")
        if type(a) is not dict or not a:
            self.correlation.append(-1)
            return
        corr = a.get("correlation", -1)
        try:
            self.correlation.append(corr if type(corr) is int else -1)
        except OverflowError:
            self.correlation.append(-1)
        keep = bool(codes.cat_bits[cc] & codes.name_bits[nc])
        if not keep:
            for key in self.has_keys:
                if key in a:
                    keep = True
                    break
        if keep:
            self.args.add_dict(len(self) - 1, a)

    def finish(self, meta: dict[str, Any]) -> TraceColumns:
        """The columns; every ts and dur was checked as it was converted.

        Raises:
            ValueError: If there is no complete event, or a ts/dur is missing,
                negative or absurd (over ``MAX_EVENT_DURATION_US``).
        """
        times, codes = self.times, self.codes
        times.flush(self._name_at)
        if not times.start_ns:
            raise ValueError(f"{self.source}: trace has no complete ('X') events")
        times.check()
        # The thread code: the rank of the (pid, tid) pair among the trace's pairs in a fixed
        # order (not the order of first appearance, which differs between the chunked and the
        # dict path once launches are kept apart): one int64 column.
        thread = codes.thread(self.pair_code)
        self.pair_code = array("q")
        cols = TraceColumns(
            source=self.source,
            meta=meta,
            start_ns=np.frombuffer(times.start_ns, dtype=np.int64),
            end_ns=np.frombuffer(times.end_ns, dtype=np.int64),
            cat_code=np.frombuffer(self.cat_code, dtype=np.int32),
            cats=list(codes.cats),
            name_code=np.frombuffer(self.name_code, dtype=np.int32),
            names=list(codes.names),
            thread=thread,
            correlation=np.frombuffer(self.correlation, dtype=np.int64),
            **self._launches(thread),
            args=self.args.finish(),
        )  # the columns share the arrays' buffers: nothing appends to them any more
        unfinished = times.unfinished_mask()
        if unfinished.any():
            cols = drop_events(cols, unfinished, np.zeros(cols.launch_correlation.size, bool))
            cols = dataclasses.replace(cols, num_unfinished=int(unfinished.sum()))
        if self.control_chars_at:
            cols = dataclasses.replace(cols, control_chars_at=tuple(self.control_chars_at))
        return drop_duplicates(cols)

    def _launches(self, events_thread: npt.NDArray[np.int64]) -> dict[str, Any]:
        """The launch columns, sorted by correlation id: those kept apart (``launch_only``)
        and those kept as events."""
        ts_us = np.frombuffer(self.launch_ts_us, dtype=np.float64)
        corr = np.frombuffer(self.launch_corr, dtype=np.int64)
        start = to_ns(np.where(np.isfinite(ts_us), ts_us, 0.0))
        thread = self.codes.thread(self.launch_pair)
        name = np.frombuffer(self.launch_name, dtype=np.int32)
        as_events = [c in LAUNCH_CATS for c in self.codes.cats]
        if any(as_events):
            sel = code_mask(np.frombuffer(self.cat_code, dtype=np.int32), as_events)
            corr = np.concatenate([corr, np.frombuffer(self.correlation, np.int64)[sel]])
            start = np.concatenate([start, np.frombuffer(self.times.start_ns, np.int64)[sel]])
            thread = np.concatenate([thread, events_thread[sel]])
            name = np.concatenate([name, np.frombuffer(self.name_code, np.int32)[sel]])
        order = np.argsort(corr, kind="stable")
        return {
            "launch_correlation": corr[order],
            "launch_start_ns": start[order],
            "launch_thread": thread[order],
            "launch_name_code": name[order].astype(np.int32),
        }


def read_columns(
    trace: Path | str | dict[str, Any],
    tables: Iterable[RuleTable],
    *,
    source: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> TraceColumns:
    """Compact columns of a trace file (decoded in chunks) or of an in-memory trace dict.

    Args:
        trace: A trace file path, or a dict with a ``traceEvents`` list.
        tables: The rule tables that may classify the events (decides which args are kept).
        source: Name for messages (default: the path, or "<dict>").
        chunk_bytes: Bytes of a file's text decoded at a time.

    Returns:
        The :class:`TraceColumns`.

    Raises:
        ValueError: For unreadable, corrupt or empty traces.
    """
    if isinstance(trace, dict):
        source = "<dict>" if source is None else source
        events = trace.get("traceEvents")
        if not isinstance(events, list):
            raise ValueError(f"{source}: trace dict needs a 'traceEvents' list")
        builder = ColumnBuilder(source, tables)
        builder.meta = {k: v for k, v in trace.items() if k != "traceEvents"}
        for e in events:
            builder.add(e)
        return builder.finish(builder.meta)
    builder = ColumnBuilder(str(trace) if source is None else source, tables)
    meta = stream_chunks(
        trace,
        builder.decode,
        builder.add_chunk,
        chunk_bytes=chunk_bytes,
        has_ph=_has_ph,
        meta=builder.meta,
        control_chars_at=builder.control_chars_at,
    )
    return builder.finish(meta)


def _has_ph(chunk: list[Any]) -> bool:
    """Whether one of a chunk's first items is an event with a 'ph' field (a Chrome trace)."""
    head = chunk[:NUM_PH_CHECKED]
    if isinstance(chunk, PlainChunk):
        return any(isinstance(e, dict) and "ph" in e for e in head)
    return any(e.ph is not None for e in head)
