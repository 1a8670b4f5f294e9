"""Compact columns of a trace's complete events, built chunk by chunk as the trace is decoded.

The reader (:mod:`commprof.traces.trace_reader`) decodes each chunk of events
with msgspec into :class:`msgspec.Struct` types that hold only the fields used
here (``ph``, ``cat``, ``name``, ``pid``, ``tid``, ``ts``, ``dur`` and the few
``args`` keys the rule tables read), so every other field is skipped unallocated.
A chunk whose values do not fit the types (a string ``dur``, an ``args`` that is
no object) is decoded again as plain values and taken one event at a time.
:class:`ColumnBuilder` keeps of each complete (``ph == "X"``) event only compact
columns: int64 ns start and end (ts and dur are float microseconds, converted and checked a
chunk at a time with ``np.rint(us * 1000)``; docs/design.md, Definitions), interned category
and name codes, one int32 code of the (pid, tid) pair (the int64 thread column is built from it
at the end), the CUPTI correlation id, and the collective ``args`` keys of the few events a
rule table may count as collectives or test with ``has_arg``. About 40 bytes an event, against
about 1.5 KiB for the event as a Python dict, and no float column of the whole trace is ever
alive. Only the events the candidate rule tables can use are kept (``trace_rules.needed_cats``
and ``needed_names``: the tables' categories, and events of any category named like a
communication-thread marker or, while the regime is to be detected, a comm kernel); where
``distributedInfo`` names NCCL only the cuda-nccl table applies, and launches are kept only as
correlation ids.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from commprof.traces.trace_reader import (
    CHUNK_BYTES,
    NUM_PH_CHECKED,
    generic_decode,
    stream_chunks,
)
from commprof.traces.trace_rules import (
    COLLECTIVE_ARG_KEYS,
    LAUNCH_CATS,
    MAX_EVENT_DURATION_US,
    MAX_TS_US,
    RuleTable,
    needed_cats,
    needed_names,
    tables_for_meta,
)


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
    """Correlation ids, sorted, of the launch events kept only as ids (not as events): where no
    rule needs a launch's thread, a launch matters only as proof that a kernel was launched."""
    args: dict[int, dict[str, Any]]
    """Event index -> its kept ``args`` keys, for events a rule may need them of."""


UNSET = msgspec.UNSET
BLOCK_EVENTS = 1 << 16
"""Events taken at a time where a whole-trace temporary would cost several bytes an event: a
dict trace's events between conversions of their ts/dur to ns (``_flush``), the blocks of
:func:`code_mask` and of ``trace_parser``'s launch search."""


def _int64_or_none(value: Any) -> int:
    """A correlation id as the column holds it: -1 where it is no int64 integer."""
    if type(value) is int and -(2**63) <= value < 2**63:
        return value
    return -1


def _to_ns(us: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """``rint(us * 1000)`` as int64, with one float temporary."""
    scaled = us * 1000.0
    np.rint(scaled, out=scaled)
    return scaled.astype(np.int64)


def _interned(table: dict[Any, int], key: Any) -> tuple[Any, int | None]:
    """Hashable form of ``key`` and its code in ``table`` (None if new)."""
    try:
        return key, table.get(key)
    except TypeError:  # unhashable (a list or dict where a string belongs)
        key = json.dumps(key, sort_keys=True)
        return key, table.get(key)


def _is_launch(cat: Any) -> bool:
    return type(cat) is str and cat in LAUNCH_CATS


class _PlainChunk(list[Any]):
    """A chunk decoded as plain values (its events did not fit the typed structs)."""


def _event_type(kept_keys: tuple[str, ...]) -> type[msgspec.Struct]:
    """The struct an event decodes into: the fields the columns read, nothing else.

    ``args`` holds ``correlation`` and ``kept_keys`` (as fields ``k0``, ``k1``, ...; UNSET
    where absent). ``ts`` and ``dur`` are floats (JSON integers convert), NaN where absent.
    """
    args = msgspec.defstruct(
        "KeptArgs",
        [("correlation", Any, -1), *((f"k{i}", Any, msgspec.UNSET) for i in range(len(kept_keys)))],
        rename={f"k{i}": key for i, key in enumerate(kept_keys)},
        gc=False,
    )
    nan = float("nan")
    fields = [("ph", Any, None), ("cat", Any, ""), ("name", Any, ""), ("pid", Any, None),
              ("tid", Any, None), ("ts", float, nan), ("dur", float, nan),
              ("args", args | None, None)]  # fmt: skip
    # gc=False: decoded values hold no reference cycles, and a million tracked
    # objects would make the cyclic collector run over and over during a parse.
    return msgspec.defstruct("Event", fields, gc=False)


class ColumnBuilder:
    """Accumulates :class:`TraceColumns` a decoded chunk (``add_chunk``) or an event
    (``add``) at a time, then ``finish``.

    Args are kept only for events a rule of ``tables`` may make a collective
    (category and name match a ``collective`` rule) or test with ``has_arg``:
    their :data:`COLLECTIVE_ARG_KEYS` and ``has_arg`` keys, nothing else.
    """

    def __init__(self, source: str, tables: Iterable[RuleTable]) -> None:
        self.source = source
        self.tables = tuple(tables)
        self.meta: dict[str, Any] = {}
        """Top-level keys of the trace, filled by the reader before the events it precedes."""
        self.relevant: frozenset[str] | None = None
        """Categories of the events kept (None: all), decided at the first event."""
        self.needed_names: re.Pattern[str] | None = None
        """Names of the events kept whatever their category (with ``relevant``)."""
        self.name_needed: dict[Any, bool] = {}
        """Name -> whether ``needed_names`` matches it, for the names of other categories."""
        self.decided = False
        self.launch_only = False
        """Launch events are kept as correlation ids only (decided with ``relevant``)."""
        self.launch_corr = array("q")
        rules = [r for t in self.tables for r in t.rules]
        # A collective rule that needs an args key keeps only events that have it (has_keys).
        self.coll_rules = [r for r in rules if r.collective and r.has_arg is None]
        self.has_keys = tuple(dict.fromkeys(r.has_arg for r in rules if r.has_arg is not None))
        self.keep_keys = tuple(dict.fromkeys((*COLLECTIVE_ARG_KEYS, *self.has_keys)))
        struct_keys = tuple(k for k in self.keep_keys if k != "correlation")
        self.event_type = _event_type(struct_keys)
        self.kept_fields = [(f"k{i}", key) for i, key in enumerate(struct_keys)]
        self.has_fields = [f"k{struct_keys.index(k)}" for k in self.has_keys if k in struct_keys]
        self._decoder = msgspec.json.Decoder(list.__class_getitem__(self.event_type))
        self.ts_us, self.dur_us = array("d"), array("d")
        """ts and dur (float us) of the events not yet converted to ns (``_flush``)."""
        self.start_ns, self.end_ns = array("q"), array("q")
        self.cat_code, self.name_code = array("i"), array("i")
        self.pair_code, self.correlation = array("i"), array("q")
        self.cats: dict[Any, int] = {}
        self.names: dict[Any, int] = {}
        self.pids: dict[Any, int] = {}
        self.tids: dict[Any, int] = {}
        self.pairs: dict[tuple[int, int], int] = {}
        """(pid code, tid code) -> pair code, in order of first appearance."""
        self.cat_bits: list[int] = []  # per code: bit i set if coll_rules[i] takes the category
        self.name_bits: list[int] = []  # per code: bit i set if coll_rules[i] takes the name
        self.args: dict[int, dict[str, Any]] = {}
        self.first_bad: tuple[int, Any, Any, Any] | None = None
        """Index, name, ts and dur of the first event whose ts or dur was None."""
        self.num_bad, self.num_beyond = 0, 0
        self.bad: tuple[int, Any, Any, Any] | None = None
        self.beyond: tuple[int, Any, Any, Any] | None = None
        """First event with a missing, negative or absurd ts/dur; first ending past int64 ns."""

    def __len__(self) -> int:
        """Complete events kept so far."""
        return len(self.start_ns) + len(self.ts_us)

    def decode(self, data: bytes) -> list[Any]:
        """Decode a chunk of events: typed structs, else plain values (a :class:`_PlainChunk`)."""
        try:
            return self._decoder.decode(data)  # type: ignore[no-any-return]
        except msgspec.ValidationError:
            return _PlainChunk(generic_decode(data))

    def _codes(
        self, table: dict[Any, int], events: list[Any], field: str, bits: list[int] | None
    ) -> list[int]:
        """Codes of the events' ``field`` values in ``table``, adding the new ones."""
        get, value = table.get, attrgetter(field)
        try:
            codes = [get(value(e), -1) for e in events]
        except TypeError:  # an unhashable key (a list where a string belongs): one at a time
            return [self._new_code(table, value(e), bits) for e in events]
        if -1 in codes:
            for i in [i for i, c in enumerate(codes) if c < 0]:
                codes[i] = self._new_code(table, value(events[i]), bits)
        return codes

    def add_chunk(self, chunk: list[Any]) -> int:
        """Take one decoded chunk of ``traceEvents``; returns its number of items."""
        if isinstance(chunk, _PlainChunk):
            for e in chunk:
                self.add(e)
            return len(chunk)
        # Column at a time over the chunk's complete events: list comprehensions and
        # array appends, no per-event Python function call (but the name check of an
        # event of a category not kept, cached by name).
        if not self.decided:
            self._decide()
        rel = self.relevant
        if rel is None:
            xs = [e for e in chunk if e.ph == "X"]
        elif self.needed_names is None:  # only events some rule, the windows or launches use
            xs = [e for e in chunk if e.ph == "X" and type(e.cat) is str and e.cat in rel]
        else:  # and those of other categories with a needed name
            by_name = self._name_needed
            xs = [
                e
                for e in chunk
                if e.ph == "X" and ((type(e.cat) is str and e.cat in rel) or by_name(e.name))
            ]
        if self.launch_only:  # launches as correlation ids only
            is_launch = [type(e.cat) is str and e.cat in LAUNCH_CATS for e in xs]
            launches = [e for e, launch in zip(xs, is_launch, strict=True) if launch]
            if launches:
                corr = [-1 if e.args is None else e.args.correlation for e in launches]
                self._append_corr(self.launch_corr, corr)
                xs = [e for e, launch in zip(xs, is_launch, strict=True) if not launch]
        if not xs:
            return len(chunk)
        base = len(self)
        self.ts_us.fromlist([e.ts for e in xs])
        self.dur_us.fromlist([e.dur for e in xs])
        cc = self._codes(self.cats, xs, "cat", self.cat_bits)
        nc = self._codes(self.names, xs, "name", self.name_bits)
        self.cat_code.fromlist(cc)
        self.name_code.fromlist(nc)
        pids = self._codes(self.pids, xs, "pid", None)
        tids = self._codes(self.tids, xs, "tid", None)
        pairs = self.pairs
        pair_codes = [pairs.setdefault(k, len(pairs)) for k in zip(pids, tids, strict=True)]
        self.pair_code.fromlist(pair_codes)
        args = [e.args for e in xs]
        self._append_corr(self.correlation, [-1 if a is None else a.correlation for a in args])
        bits = np.asarray(self.cat_bits, np.int64)[cc] & np.asarray(self.name_bits, np.int64)[nc]
        keep = set(np.flatnonzero(bits).tolist())
        for field in self.has_fields:
            value = attrgetter(field)
            keep.update(i for i, a in enumerate(args) if a is not None and value(a) is not UNSET)
        for i in sorted(keep):
            a = args[i]
            if a is None:
                continue
            kept = {k: v for f, k in self.kept_fields if (v := getattr(a, f)) is not UNSET}
            if kept:
                self.args[base + i] = kept
        self._flush()
        return len(chunk)

    def _decide(self) -> None:
        """Which categories to keep, from the tables that the top-level keys leave."""
        tables = tables_for_meta(self.tables, self.meta)
        self.relevant = needed_cats(tables)
        self.needed_names = needed_names(tables)
        no_threads = all(r.comm_thread is None for t in tables for r in t.rules)
        self.launch_only = self.relevant is not None and no_threads
        self.decided = True

    def _name_needed(self, name: Any) -> bool:
        """Whether an event of a category not kept is kept for its name (``needed_names``)."""
        if self.needed_names is None:
            return False
        try:
            return self.name_needed[name]
        except KeyError:
            needed = self.name_needed[name] = self.needed_names.match(str(name)) is not None
            return needed
        except TypeError:  # unhashable (a list where a string belongs): kept, as before
            return True

    @staticmethod
    def _append_corr(column: array[int], corr: list[Any]) -> None:
        try:
            column.fromlist(corr)
        except (TypeError, OverflowError):  # the array is unchanged: check each value
            column.fromlist([_int64_or_none(c) for c in corr])

    def _number(self, value: Any, key: str, e: dict[str, Any]) -> float:
        # Slow path for values array("d") refuses: None becomes NaN (reported by
        # finish() with its event), numeric strings are read as numbers (as numpy does).
        if value is None:
            if self.first_bad is None:
                self.first_bad = (len(self), e.get("name"), e.get("ts"), e.get("dur"))
            return float("nan")
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"{self.source}: non-numeric '{key}' in an event ({exc})") from exc

    def _new_code(self, table: dict[Any, int], key: Any, bits: list[int] | None) -> int:
        key, code = _interned(table, key)
        if code is None:
            code = table[key] = len(table)
            if bits is not None:
                bits.append(self._rule_bits(key, bits is self.name_bits))
        return code

    def _rule_bits(self, key: Any, is_name: bool) -> int:
        out = 0
        for i, rule in enumerate(self.coll_rules):
            if is_name:
                ok = rule.name is None or re.match(rule.name, str(key)) is not None
            else:
                ok = rule.cats is None or key in rule.cats
            out |= ok << i
        return out

    def add(self, e: Any) -> None:
        """Take one item of ``traceEvents``; anything but a complete ("X") event is skipped."""
        # The hot loop of a parse (once per event): dict lookups and array appends
        # only; new codes and odd values take the slow paths in the except clauses.
        if not isinstance(e, dict) or e.get("ph") != "X":
            return
        if len(self.ts_us) >= BLOCK_EVENTS:
            self._flush()
        if not self.decided:
            self._decide()
        if self.relevant is not None:
            cat = e.get("cat")
            if (type(cat) is not str or cat not in self.relevant) and not self._name_needed(
                e.get("name", "")
            ):
                return
            if self.launch_only and _is_launch(cat):
                a = e.get("args")
                corr = a.get("correlation", -1) if type(a) is dict else -1
                self.launch_corr.append(_int64_or_none(corr))
                return
        ts: Any = e.get("ts")
        dur: Any = e.get("dur")
        try:
            self.ts_us.append(ts)
        except (TypeError, OverflowError):
            self.ts_us.append(self._number(ts, "ts", e))
        try:
            self.dur_us.append(dur)
        except (TypeError, OverflowError):
            self.dur_us.append(self._number(dur, "dur", e))
        key = e.get("cat", "")
        try:
            cc = self.cats[key]
        except (KeyError, TypeError):
            cc = self._new_code(self.cats, key, self.cat_bits)
        key = e.get("name", "")
        try:
            nc = self.names[key]
        except (KeyError, TypeError):
            nc = self._new_code(self.names, key, self.name_bits)
        self.cat_code.append(cc)
        self.name_code.append(nc)
        key = e.get("pid")
        try:
            pc = self.pids[key]
        except (KeyError, TypeError):
            pc = self._new_code(self.pids, key, None)
        key = e.get("tid")
        try:
            tc = self.tids[key]
        except (KeyError, TypeError):
            tc = self._new_code(self.tids, key, None)
        self.pair_code.append(self.pairs.setdefault((pc, tc), len(self.pairs)))
        a = e.get("args")
        if type(a) is not dict or not a:
            self.correlation.append(-1)
            return
        corr = a.get("correlation", -1)
        try:
            self.correlation.append(corr if type(corr) is int else -1)
        except OverflowError:
            self.correlation.append(-1)
        keep = bool(self.cat_bits[cc] & self.name_bits[nc])
        if not keep:
            for key in self.has_keys:
                if key in a:
                    keep = True
                    break
        if keep:
            kept = {k: a[k] for k in self.keep_keys if k in a}
            if kept:
                self.args[len(self) - 1] = kept

    def _flush(self) -> None:
        """Convert the pending float ts/dur to int64 ns starts and ends, and check them.

        Done per chunk (or per ``BLOCK_EVENTS`` events of a dict), so no float column of the
        whole trace, nor its conversion temporaries, is ever alive. Bad values are counted,
        the first one's details kept for ``finish``'s message, and stored as 0.
        """
        if not self.ts_us:
            return
        base = len(self.start_ns)
        ts = np.frombuffer(self.ts_us, dtype=np.float64)
        dur = np.frombuffer(self.dur_us, dtype=np.float64)
        bad = ~np.isfinite(ts) | ~np.isfinite(dur) | (dur < 0) | (dur > MAX_EVENT_DURATION_US)
        # int64 nanoseconds hold about 292 years: a later end is a corrupt trace, not a time
        with np.errstate(invalid="ignore"):  # inf - inf where ts and dur are both bad
            beyond = np.abs(ts) + dur >= MAX_TS_US
        if bad.any() or beyond.any():
            first_bad, first_beyond = np.flatnonzero(bad), np.flatnonzero(beyond)
            self.num_bad += first_bad.size
            self.num_beyond += first_beyond.size
            if self.bad is None and first_bad.size:
                self.bad = self._details(base, int(first_bad[0]), ts, dur)
                if self.first_bad is not None and self.first_bad[0] == self.bad[0]:
                    self.bad = self.first_bad
            if self.beyond is None and first_beyond.size:
                self.beyond = self._details(base, int(first_beyond[0]), ts, dur)
            ts, dur = np.where(bad | beyond, 0.0, ts), np.where(bad | beyond, 0.0, dur)
        # us -> ns, rounded (docs/design.md, Definitions)
        start, end = _to_ns(ts), _to_ns(dur)
        end += start
        del ts, dur  # the views on the pending arrays, before those are dropped
        self.ts_us, self.dur_us = array("d"), array("d")
        self.start_ns.frombytes(start.data.cast("B"))
        self.end_ns.frombytes(end.data.cast("B"))

    def _details(
        self, base: int, i: int, ts: npt.NDArray[np.float64], dur: npt.NDArray[np.float64]
    ) -> tuple[int, Any, Any, Any]:
        name = list(self.names)[self.name_code[base + i]]
        return base + i, name, float(ts[i]), float(dur[i])

    def finish(self, meta: dict[str, Any]) -> TraceColumns:
        """The columns; every ts and dur was checked as it was converted.

        Raises:
            ValueError: If there is no complete event, or a ts/dur is missing,
                negative or absurd (over ``MAX_EVENT_DURATION_US``).
        """
        self._flush()
        if not self.start_ns:
            raise ValueError(f"{self.source}: trace has no complete ('X') events")
        if self.bad is not None:
            raise ValueError(
                f"{self.source}: {self.num_bad} event(s) with missing, negative or absurd ts/dur "
                f"(first: {self.bad[1]!r} ts={self.bad[2]!r} dur={self.bad[3]!r}); "
                "the trace is corrupt, re-export it"
            )
        if self.beyond is not None:
            raise ValueError(
                f"{self.source}: {self.num_beyond} event(s) end past what int64 nanoseconds hold "
                f"(first: {self.beyond[1]!r} ts={self.beyond[2]!r} "
                f"dur={self.beyond[3]!r} us); the trace is corrupt, re-export it"
            )
        # (pid, tid) pair code -> the thread code pid * (num tids + 1) + tid, through a
        # lookup table of the few distinct pairs: one int64 column, no temporaries.
        span = len(self.tids) + 1
        lut = np.array([p * span + t for p, t in self.pairs], dtype=np.int64)
        thread = lut[np.frombuffer(self.pair_code, dtype=np.int32)]
        self.pair_code = array("i")
        launch_correlation = np.frombuffer(self.launch_corr, dtype=np.int64)
        launch_correlation.sort()  # in place: _unlaunched searches it
        # The columns share the arrays' buffers: nothing appends to them any more.
        return TraceColumns(
            source=self.source,
            meta=meta,
            start_ns=np.frombuffer(self.start_ns, dtype=np.int64),
            end_ns=np.frombuffer(self.end_ns, dtype=np.int64),
            cat_code=np.frombuffer(self.cat_code, dtype=np.int32),
            cats=list(self.cats),
            name_code=np.frombuffer(self.name_code, dtype=np.int32),
            names=list(self.names),
            thread=thread,
            correlation=np.frombuffer(self.correlation, dtype=np.int64),
            launch_correlation=launch_correlation,
            args=self.args,
        )


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
    )
    return builder.finish(meta)


def _has_ph(chunk: list[Any]) -> bool:
    """Whether one of a chunk's first items is an event with a 'ph' field (a Chrome trace)."""
    head = chunk[:NUM_PH_CHECKED]
    if isinstance(chunk, _PlainChunk):
        return any(isinstance(e, dict) and "ph" in e for e in head)
    return any(e.ph is not None for e in head)
