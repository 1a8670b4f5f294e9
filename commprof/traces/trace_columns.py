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
communication-thread marker or, while the regime is to be detected, a comm kernel, and the
Python frames of communication libraries, read by name only until one turns up); where
``distributedInfo`` names NCCL only the cuda-nccl table applies, and launches are kept only as
correlation ids.

A chunk is taken a column at a time, each pass iterated in C (``map``, ``compress``,
``np.fromiter``): of structs tagged by category, the category is read once per struct type (what
becomes of a type's events, its category code), not once per event; an event's name and (pid,
tid) pair are coded by one dict lookup of the (name, pid, tid) triple.
"""

from __future__ import annotations

import dataclasses
import json
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from itertools import compress, repeat
from operator import attrgetter, eq, is_not, not_
from pathlib import Path
from typing import Any, Literal, Union

import msgspec
import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.kept_args import KeptArgs, KeptArgsBuilder
from commprof.traces.trace_reader import (
    CHUNK_BYTES,
    NUM_PH_CHECKED,
    generic_decode,
    stream_chunks,
)
from commprof.traces.trace_rules import (
    COLLECTIVE_ARG_KEYS,
    COMM_OP_PATTERN,
    LAUNCH_CATS,
    MAX_EVENT_DURATION_US,
    MAX_TS_US,
    PYTHON_COMM_PATTERN,
    PYTHON_FUNCTION_CAT,
    RAW_ARG_KEYS,
    SKIP_CATS,
    TEXT_ARG_KEYS,
    RuleTable,
    needed_cats,
    needed_names,
    reads_python_functions,
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
    ``dur`` that is the end's epoch time (:func:`unfinished_events`)."""
    control_chars_at: tuple[int, ...] = ()
    """Byte offsets (in the JSON text) of raw control characters inside strings, which JSON
    forbids and a profiler writes for a garbled name: each chunk holding them was read as the
    stdlib's non-strict decoder reads it."""


UNSET = msgspec.UNSET
BLOCK_EVENTS = 1 << 16
"""Events taken at a time where a whole-trace temporary would cost several bytes an event: the
events between conversions of their ts/dur to ns (``_flush``), the blocks of
:func:`code_mask` and of ``trace_parser``'s launch search."""
SETTLE_CHUNKS, SETTLE_BACKOFF = 2, 4
"""Chunks in a row whose Python frames bear no new name before the known names decode them
(``_TaggedTypes.know``), and the factor that number grows by each time a new name turns up:
a trace whose frames keep bearing new names (object addresses) stays decoded by name."""
MAX_KNOWN_NAMES = 1 << 14
"""Most frame names a ``Literal`` of known names holds (making one costs about a microsecond and a
half a name); past it the frames stay decoded by name."""
MAX_LEARNED_CATS = 64
"""Categories outside the known ones added to the typed decoder before it gives up on tags."""
_GET = {f: attrgetter(f) for f in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")}
_NAME_PID_TID = attrgetter("name", "pid", "tid")
_TS_DUR = attrgetter("ts", "dur")
_TIMES = np.dtype([("ts", np.float64), ("dur", np.float64)])
_TYPE_CODE = attrgetter("type_code")
_ARGS_CORR = attrgetter("args.correlation")
_IS_X = partial(eq, "X")
"""Whether a ph is "X": False for a missing or non-string one (``"X".__eq__`` gives
NotImplemented there, which is true)."""
_CORR, _NO_CORR, _MISSING = repeat("correlation"), repeat(-1), repeat(-1)
_DROP, _KEEP, _LAUNCH, _BY_NAME, _PYTHON = 0, 1, 2, 3, 4
"""What becomes of the events of a category: dropped, kept, kept as launches, kept where
their name is needed, kept where their name is a communication library's Python function."""
_NO_INDEX = np.empty(0, np.intp)
_PHASE: Any = Literal.__getitem__(tuple("BEXiICbneSTpFstfPNODMVvRc()"))
"""The event phases of the Trace Event Format, as the tagged structs decode ``ph``: each value
the one string object of the ``Literal`` (no string built an event); any other value fails the
chunk, which is then read as the untagged struct reads it (``ph`` as it is)."""
_BAD_CAT = re.compile(r"Invalid value '(.{1,200})' - at `\$\[\d+\]\.cat`")


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


def _args_type(name: str, kept_keys: tuple[str, ...]) -> type[msgspec.Struct]:
    """``args`` with ``correlation`` and ``kept_keys`` (fields ``k0``, ``k1``, ...; UNSET where
    absent); the RAW_ARG_KEYS stay undecoded JSON (``msgspec.Raw``) until an event is kept."""
    fields: list[tuple[str, Any, Any]] = [("correlation", Any, -1)]
    fields += [
        (f"k{i}", msgspec.Raw if key in RAW_ARG_KEYS else Any, msgspec.UNSET)
        for i, key in enumerate(kept_keys)
    ]
    rename = {f"k{i}": key for i, key in enumerate(kept_keys)}
    return msgspec.defstruct(name, fields, rename=rename, gc=False)


def _event_type(kept_keys: tuple[str, ...]) -> type[msgspec.Struct]:
    """The struct any event decodes into: the fields the columns read, nothing else.

    ``ts`` and ``dur`` are floats (JSON integers convert), NaN where absent.
    """
    args = _args_type("KeptArgs", kept_keys)
    nan = float("nan")
    fields = [("ph", Any, None), ("cat", Any, ""), ("name", Any, ""), ("pid", Any, None),
              ("tid", Any, None), ("ts", float, nan), ("dur", float, nan),
              ("args", args | None, None)]  # fmt: skip
    # gc=False: decoded values hold no reference cycles, and a million tracked
    # objects would make the cyclic collector run over and over during a parse.
    return msgspec.defstruct("Event", fields, gc=False)


class _TaggedTypes:
    """Structs tagged by ``cat``, one per category: the categories read (kept keys), launches
    (correlation only), Python frames (``python_names``: the name only, until a chunk holds a
    communication library's, :meth:`read_python`) and the rest (a bare tag: no name, no args).

    msgspec picks the struct by the ``cat`` value wherever it stands in the object; the
    category is a class attribute, so ``e.cat`` reads as with the untagged struct. A category
    not yet known fails the chunk; it is added (as read) and the chunk decoded again.
    """

    def __init__(
        self, kept_keys: tuple[str, ...], skip: frozenset[str], python_names: bool = False
    ) -> None:
        nan = float("nan")
        kept_args, launch_args = _args_type("Args", kept_keys), _args_type("LaunchArgs", ())
        self.read_fields = [("ph", _PHASE, None), ("name", Any, ""), ("pid", Any, None),
                            ("tid", Any, None), ("ts", float, nan), ("dur", float, nan),
                            ("args", kept_args | None, None)]  # fmt: skip
        self.launch_fields = [*self.read_fields[:-1], ("args", launch_args | None, None)]
        self.skip = skip
        self.python_names = python_names
        """Python frames are decoded as their name only (no event of them kept yet)."""
        self.types: dict[str, type[msgspec.Struct]] = {}
        for cat in LAUNCH_CATS | skip | ({PYTHON_FUNCTION_CAT} if python_names else set()):
            self.add(cat)
        self.num_known = len(self.types)
        self.decoder = self._decoder()
        self.known_decoder: msgspec.json.Decoder[Any] | None = None
        """The decoder once the Python frames' names have settled (:meth:`know`): a frame's name
        is one of a ``Literal`` of names known to be no communication library's, so no string is
        built and nothing is looked up; any other name (or category) fails the chunk."""

    def add(self, cat: str) -> None:
        """A struct for category ``cat`` (read unless it is a launch or skipped)."""
        n = len(self.types)
        space: dict[str, Any] = {"cat": cat, "type_code": n}
        if cat in LAUNCH_CATS:
            fields = self.launch_fields
        elif cat in self.skip:
            fields, space = [], {"cat": cat, "type_code": n, "ph": None, "name": ""}
        elif cat == PYTHON_FUNCTION_CAT and self.python_names:
            fields, space = [("name", Any, "")], {"cat": cat, "type_code": n, "ph": None}
        else:
            fields = self.read_fields
        self.types[cat] = msgspec.defstruct(
            f"Cat{n}", fields, tag_field="cat", tag=cat, namespace=space, gc=False
        )

    def know(self, names: tuple[str, ...]) -> None:
        """Make ``known_decoder`` for Python frames named ``names`` only."""
        code = self.types[PYTHON_FUNCTION_CAT].type_code  # type: ignore[attr-defined]
        known = msgspec.defstruct(
            f"Cat{code}", [("name", Literal.__getitem__(names), "")], tag_field="cat",
            tag=PYTHON_FUNCTION_CAT,
            namespace={"cat": PYTHON_FUNCTION_CAT, "type_code": code, "ph": None}, gc=False,
        )  # fmt: skip
        types = [known if c == PYTHON_FUNCTION_CAT else t for c, t in self.types.items()]
        union: Any = Union[tuple(types)]  # noqa: UP007  # a runtime tuple of types
        self.known_decoder = msgspec.json.Decoder(list[union])

    def read_python(self) -> None:
        """Decode Python frames whole from now on (their struct keeps its type code)."""
        self.python_names = False
        self.known_decoder = None
        code = self.types[PYTHON_FUNCTION_CAT].type_code  # type: ignore[attr-defined]
        self.types[PYTHON_FUNCTION_CAT] = msgspec.defstruct(  # no args: a frame's are its ids
            f"Cat{code}", self.read_fields[:-1], tag_field="cat", tag=PYTHON_FUNCTION_CAT,
            namespace={"cat": PYTHON_FUNCTION_CAT, "type_code": code, "args": None}, gc=False,
        )  # fmt: skip
        self.decoder = self._decoder()

    def _decoder(self) -> msgspec.json.Decoder[Any]:
        union: Any = Union[tuple(self.types.values())]  # noqa: UP007  # a runtime tuple of types
        return msgspec.json.Decoder(list[union])

    def learn(self, error: msgspec.ValidationError) -> bool:
        """Add the unknown category the error names; False if it names none (or too many)."""
        match = _BAD_CAT.match(str(error))
        if match is None or len(self.types) >= self.num_known + MAX_LEARNED_CATS:
            return False
        self.add(match.group(1))
        self.decoder, self.known_decoder = self._decoder(), None
        return True


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
        self.control_chars_at: list[int] = []
        """Byte offsets of raw control characters in strings, read leniently (the reader's)."""
        """Top-level keys of the trace, filled by the reader before the events it precedes."""
        self.relevant: frozenset[str] | None = None
        """Categories of the events kept (None: all), decided at the first chunk."""
        self.needed_names: re.Pattern[str] | None = None
        """Names of the events kept whatever their category (with ``relevant``)."""
        self.name_needed: dict[Any, bool] = {}
        """Name -> whether ``needed_names`` matches it, for the names of other categories."""
        self.comm_op = re.compile(COMM_OP_PATTERN)
        self.read_python = False
        """Python frames are read for their names (decided with ``relevant``): those of a
        communication library are kept (``trace_rules.PYTHON_COMM_PATTERN``), the rest dropped."""
        self.python_rx = re.compile(PYTHON_COMM_PATTERN)
        self.python_needed: dict[Any, bool] = {}
        """Name -> whether a Python frame of that name is kept (``python_rx`` matches it)."""
        self.data = b""
        """The text of the last chunk the tagged decoder took (decoded again where a Python
        frame decoded by name only turns out to be needed)."""
        self.known_chunk = False
        """The last chunk was decoded by ``known_decoder``: its frames are none of them needed."""
        self.num_settled, self.settle_chunks = 0, SETTLE_CHUNKS
        """Chunks in a row whose frames bore no new name; how many make the names settled."""
        self.decided = False
        self.skip_cats: frozenset[str] = frozenset()
        """Categories read as a bare tag and dropped (``trace_rules.SKIP_CATS``)."""
        self.launch_only = False
        """Launch events are kept in the launch columns only (decided with ``relevant``)."""
        self.launch_corr, self.launch_ts_us = array("q"), array("d")
        self.launch_pair, self.launch_name = array("q"), array("i")
        rules = [r for t in self.tables for r in t.rules]
        # A collective rule that needs an args key keeps only events that have it (has_keys).
        self.coll_rules = [r for r in rules if r.collective and r.has_arg is None]
        self.has_keys = tuple(
            dict.fromkeys(["Collective name", *(r.has_arg for r in rules if r.has_arg is not None)])
        )  # an op's metadata (launching ops) is kept where it names its collective
        self.keep_keys = tuple(dict.fromkeys((*COLLECTIVE_ARG_KEYS, *self.has_keys)))
        self.struct_keys = tuple(k for k in self.keep_keys if k != "correlation")
        self.event_type = _event_type(self.struct_keys)
        self.kept_fields = [(f"k{i}", key) for i, key in enumerate(self.struct_keys)]
        self.has_fields = [
            f"k{self.struct_keys.index(k)}" for k in self.has_keys if k in self.struct_keys
        ]
        self._decoder = msgspec.json.Decoder(list.__class_getitem__(self.event_type))
        self.tagged: _TaggedTypes | None = None
        self.type_cat: list[str] = []
        self.type_kind: list[int] = []
        """Per struct type of the tagged decode (by its ``type_code``, the order they were made
        in): its category, and what becomes of its events (``_kind``)."""
        self.type_cat_code: list[int] = []
        """Per struct type: its category's code in ``cats`` (-1 until an event is kept)."""
        """Decoder by category (decided with ``relevant``); None: the untagged struct only."""
        self.num_untagged = 0
        """Chunks that the tagged decoder could not take (events without a category)."""
        self.ts_us, self.dur_us = array("d"), array("d")
        """ts and dur (float us) of the events not yet converted to ns (``_flush``)."""
        self.start_ns, self.end_ns = array("q"), array("q")
        self.cat_code, self.name_code = array("i"), array("i")
        self.pair_code, self.correlation = array("q"), array("q")
        self.cats: dict[Any, int] = {}
        self.names: dict[Any, int] = {}
        self.pids: dict[Any, int] = {}
        self.tids: dict[Any, int] = {}
        """pid and tid -> their codes, in order of first appearance (``pair_code``)."""
        self.triples: dict[tuple[Any, Any, Any], int] = {}
        """(name, pid, tid) met in decoded chunks -> its index in the two columns below."""
        self.triple_name, self.triple_pair = array("q"), array("q")
        """Per (name, pid, tid): its name code and its (pid, tid) pair code."""
        self.cat_bits: list[int] = []  # per code: bit i set if coll_rules[i] takes the category
        self.name_bits: list[int] = []  # per code: bit i set if coll_rules[i] takes the name
        self.args = KeptArgsBuilder(
            self.struct_keys, tuple(f for f, _ in self.kept_fields), RAW_ARG_KEYS, TEXT_ARG_KEYS
        )
        self.first_bad: tuple[int, Any, Any, Any] | None = None
        """Index, name, ts and dur of the first event whose ts or dur was None."""
        self.num_bad, self.num_beyond = 0, 0
        self.unfinished = array("b")
        """Per event so far: 1 if unfinished (:func:`unfinished_events`), dropped at the end."""
        self.bad: tuple[int, Any, Any, Any] | None = None
        self.beyond: tuple[int, Any, Any, Any] | None = None
        """First event with a missing, negative or absurd ts/dur; first ending past int64 ns."""

    def __len__(self) -> int:
        """Complete events kept so far."""
        return len(self.start_ns) + len(self.ts_us)

    def decode(self, data: bytes) -> list[Any]:
        """Decode a chunk of events: structs tagged by category, else one untagged struct for
        every event, else plain values (a :class:`_PlainChunk`)."""
        if not self.decided:
            self._decide()
        self.known_chunk = False
        if self.tagged is not None and self.tagged.known_decoder is not None:
            try:
                chunk: list[Any] = self.tagged.known_decoder.decode(data)
                self.data, self.known_chunk = data, True
                return chunk
            except msgspec.ValidationError:  # a new name: by name again, until they settle
                self.tagged.known_decoder = None
                self.settle_chunks *= SETTLE_BACKOFF
        while self.tagged is not None:
            try:
                chunk = self.tagged.decoder.decode(data)
                self.data = data
                return chunk
            except msgspec.ValidationError as exc:
                if self.tagged.learn(exc):
                    continue
                self.num_untagged += 1
                if self.num_untagged > 2:  # events without a category all through: stop trying
                    self.tagged = None
                break
        try:
            return self._decoder.decode(data)  # type: ignore[no-any-return]
        except msgspec.ValidationError:
            return _PlainChunk(generic_decode(data))

    def _codes(
        self, table: dict[Any, int], events: list[Any], field: str, bits: list[int] | None
    ) -> npt.NDArray[np.int64]:
        """Codes of the events' ``field`` values in ``table``, adding the new ones (in order of
        first appearance)."""
        get = _GET[field]
        try:
            codes = np.fromiter(map(table.get, map(get, events), _MISSING), np.int64, len(events))
        except TypeError:  # an unhashable key (a list where a string belongs): one at a time
            return np.array([self._new_code(table, get(e), bits) for e in events], np.int64)
        for i in np.flatnonzero(codes < 0).tolist():  # new values, in order of first appearance
            codes[i] = self._code(table, get(events[i]), bits)
        return codes

    def _name_pair_codes(
        self, events: list[Any]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Name codes and (pid, tid) pair codes (pid code << 32 | tid code) of the events: one
        lookup of the (name, pid, tid) triple an event, each part coded only for a new one
        (names in order of first appearance, as ``_codes`` codes them)."""
        try:
            idx = np.fromiter(
                map(self.triples.get, map(_NAME_PID_TID, events), _MISSING), np.int64, len(events)
            )
        except TypeError:  # an unhashable name, pid or tid: each coded apart
            names = self._codes(self.names, events, "name", self.name_bits)
            pairs = self._codes(self.pids, events, "pid", None)
            pairs <<= 32
            pairs |= self._codes(self.tids, events, "tid", None)
            return names, pairs
        for i in np.flatnonzero(idx < 0).tolist():
            key = _NAME_PID_TID(events[i])
            j = self.triples.get(key, -1)
            if j < 0:
                name, pid, tid = key
                j = self.triples[key] = len(self.triple_name)
                self.triple_name.append(self._code(self.names, name, self.name_bits))
                self.triple_pair.append(self._pair(pid, tid))
            idx[i] = j
        return (
            np.frombuffer(self.triple_name, np.int64)[idx],
            np.frombuffer(self.triple_pair, np.int64)[idx],
        )

    def _pair(self, pid: Any, tid: Any) -> int:
        """The code of one (pid, tid) pair."""
        return (self._code(self.pids, pid, None) << 32) | self._code(self.tids, tid, None)

    def _kept(self, chunk: list[Any]) -> list[Any]:
        """The chunk's complete events that some rule, the windows or the launches use, and
        those of other categories with a needed name: iterated in C (``map``,
        ``itertools.compress``), no Python bytecode per event."""
        if self.relevant is None:
            return list(compress(chunk, map(_IS_X, map(_GET["ph"], chunk))))
        n = len(chunk)
        cats = map(_GET["cat"], chunk)
        in_rel = np.fromiter(
            map(self.relevant.__contains__, cats), bool, n
        )  # TypeError: unhashable
        others = np.flatnonzero(~in_rel)
        if others.size:
            evs = list(map(chunk.__getitem__, others.tolist()))
            names = list(map(_GET["name"], evs))
            for name in set(names).difference(self.name_needed):
                self.name_needed[name] = self._name_needed(name)
            in_rel[others] = np.fromiter(map(self.name_needed.__getitem__, names), bool, len(names))
            python = [cat == PYTHON_FUNCTION_CAT for cat in map(_GET["cat"], evs)]
            if any(python):  # judged by PYTHON_COMM_PATTERN alone, as the tagged chunks are
                in_rel[others[python]] = [
                    self.read_python and self._python_needed(n) for n in compress(names, python)
                ]
        kept = list(compress(chunk, in_rel.tolist()))
        return list(compress(kept, map(_IS_X, map(_GET["ph"], kept))))

    def _type_codes(self, chunk: list[Any]) -> npt.NDArray[np.intp]:
        """Index of each event's struct type (tagged by category) in the type tables: its
        ``type_code``, a class attribute (no lookup by type an event)."""
        assert self.tagged is not None  # only tagged chunks have type codes
        for cat in list(self.tagged.types)[len(self.type_cat) :]:  # types made since (learn)
            self.type_cat.append(cat)
            self.type_kind.append(self._kind(cat))
            self.type_cat_code.append(-1)
        return np.fromiter(map(_TYPE_CODE, chunk), np.intp, len(chunk))

    def _kind(self, cat: str) -> int:
        """What becomes of the events of category ``cat`` (``_KEEP``, ``_LAUNCH``, ...)."""
        if self.relevant is None or cat in self.relevant:
            return _LAUNCH if self.launch_only and cat in LAUNCH_CATS else _KEEP
        if cat == PYTHON_FUNCTION_CAT and self.read_python:
            return _PYTHON
        # A skipped category's struct is a bare tag (no ph): never a complete event.
        return _DROP if cat in self.skip_cats else _BY_NAME

    def _kept_tagged(self, chunk: list[Any]) -> tuple[list[Any], list[Any], npt.NDArray[np.intp]]:
        """``_kept`` of a chunk of structs tagged by category, split into the launches kept
        apart (``launch_only``) and the other events, with the latter's type indices: the
        category read once per struct type, not once per event."""
        types = self._type_codes(chunk)
        kind = np.asarray(self.type_kind, np.int8)[types]
        keep = (kind == _KEEP) | (kind == _LAUNCH)
        others = np.flatnonzero(kind == _BY_NAME)
        if others.size:
            names = list(map(_GET["name"], map(chunk.__getitem__, others.tolist())))
            for name in set(names).difference(self.name_needed):  # TypeError: unhashable
                self.name_needed[name] = self._name_needed(name)
            keep[others] = np.fromiter(map(self.name_needed.__getitem__, names), bool, len(names))
        python = _NO_INDEX if self.known_chunk else np.flatnonzero(kind == _PYTHON)
        if python.size:
            needed = self._python_kept(chunk, python)
            assert self.tagged is not None  # a tagged chunk
            if needed is not None and self.tagged.python_names:  # decoded by name only: again
                self.tagged.read_python()
                return self._kept_tagged(self.tagged.decoder.decode(self.data))
            if needed is not None:
                keep[python] = needed
        if keep.all():  # the usual chunk: no event of it dropped for its category or name
            kept = chunk
        else:
            where = np.flatnonzero(keep)
            kept = list(compress(chunk, keep.tolist()))
            kind, types = kind[where], types[where]
        phs = list(map(_GET["ph"], kept))
        launch = kind == _LAUNCH
        if phs.count("X") == len(phs):  # every one a complete event (list.count runs in C)
            events, launch_x = ~launch, launch
        else:
            is_x = np.fromiter(map(_IS_X, phs), bool, len(phs))
            events, launch_x = is_x & ~launch, is_x & launch
        launches = list(compress(kept, launch_x.tolist())) if launch_x.any() else []
        xs = kept if events.all() else list(compress(kept, events.tolist()))
        return launches, xs, types[events]

    def _python_kept(
        self, chunk: list[Any], python: npt.NDArray[np.intp]
    ) -> npt.NDArray[np.bool_] | None:
        """Whether each Python frame (``python``: the chunk's, by index) is a communication
        library's; None where none is (the usual chunk). The chunk's names as a set (each frame's
        name is a string of its own: this is the cost, a hash each), each new name matched once;
        one lookup a frame only where one of them matches. Kineto writes the frames in one block,
        so a chunk's frames are usually a slice of it."""
        lo, hi = int(python[0]), int(python[-1]) + 1
        if hi - lo == python.size:
            frames = partial(chunk.__getitem__, slice(lo, hi))
        else:
            mask = np.zeros(hi - lo, bool)
            mask[python - lo] = True
            frames = partial(compress, chunk[lo:hi], mask.tolist())
        names = set(map(_GET["name"], frames()))  # TypeError: unhashable, as for _BY_NAME
        new = names.difference(self.python_needed)
        for name in new:
            self.python_needed[name] = self._python_needed(name)
        if not any(map(self.python_needed.__getitem__, names)):
            self._settle(bool(new))
            return None
        got = map(self.python_needed.__getitem__, map(_GET["name"], frames()))
        return np.fromiter(got, bool, python.size)

    def _settle(self, new: bool) -> None:
        """Count a chunk whose frames were none of them needed (``new``: some bore a new name);
        once ``settle_chunks`` in a row bore none, decode by the known names
        (``_TaggedTypes.know``: the names of no communication library; a frame of one, met in a
        chunk read as plain values, fails that decoder and is read whole)."""
        self.num_settled = 0 if new else self.num_settled + 1
        tagged = self.tagged
        if tagged is None or tagged.known_decoder is not None or not tagged.python_names:
            return
        if self.num_settled >= self.settle_chunks and len(self.python_needed) <= MAX_KNOWN_NAMES:
            names = tuple(n for n, needed in self.python_needed.items() if not needed)
            if names and all(type(n) is str for n in names):
                tagged.know(names)  # type: ignore[arg-type]  # checked: every name a str

    def _python_needed(self, name: Any) -> bool:
        """Whether a Python frame named ``name`` is kept (``PYTHON_COMM_PATTERN``)."""
        try:
            return self.python_needed[name]
        except KeyError:
            needed = self.python_needed[name] = self.python_rx.match(str(name)) is not None
            return needed
        except TypeError:  # unhashable: no Python frame's name
            return False

    def _type_cat_codes(self, types: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
        """Category codes of events by their struct type index, new categories coded in order
        of first appearance (as ``_codes`` does)."""
        codes = np.asarray(self.type_cat_code, np.int64)[types]
        new = types[codes < 0]
        if new.size:
            _, first = np.unique(new, return_index=True)
            for t in new[np.sort(first)].tolist():
                self.type_cat_code[t] = self._code(self.cats, self.type_cat[t], self.cat_bits)
            codes = np.asarray(self.type_cat_code, np.int64)[types]
        return codes

    def add_chunk(self, chunk: list[Any]) -> int:
        """Take one decoded chunk of ``traceEvents``; returns its number of items."""
        if isinstance(chunk, _PlainChunk):
            for e in chunk:
                self.add(e)
            return len(chunk)
        # Column at a time over the chunk's complete events: map, compress and array
        # appends, no per-event Python function call.
        if not self.decided:
            self._decide()
        types: npt.NDArray[np.intp] | None = None
        launches: list[Any] = []
        try:
            if self.tagged is not None and chunk and type(chunk[0]) is not self.event_type:
                launches, xs, types = self._kept_tagged(chunk)
            else:
                xs = self._kept(chunk)
        except TypeError:  # an unhashable category or name: take the events one by one
            if self.tagged is not None and self.tagged.python_names:  # Python frames whole
                self.tagged.read_python()
                chunk = self.tagged.decoder.decode(self.data)
            for e in chunk:
                self.add(msgspec.structs.asdict(e) | {"cat": e.cat, "ph": e.ph})
            return len(chunk)
        if self.launch_only and types is None:  # launches into the launch columns only
            is_launch = list(map(LAUNCH_CATS.__contains__, map(_GET["cat"], xs)))
            launches = list(compress(xs, is_launch))
            if launches:
                xs = list(compress(xs, map(not_, is_launch)))
        if launches:
            self._add_launches(launches)
        if not xs:
            return len(chunk)
        base = len(self)
        times = np.fromiter(map(_TS_DUR, xs), _TIMES, len(xs))  # both in one pass
        self.ts_us.frombytes(times["ts"].tobytes())
        self.dur_us.frombytes(times["dur"].tobytes())
        if types is None:
            cc = self._codes(self.cats, xs, "cat", self.cat_bits)
        else:
            cc = self._type_cat_codes(types)
        nc, pairs = self._name_pair_codes(xs)
        self.cat_code.frombytes(cc.astype(np.int32).tobytes())
        self.name_code.frombytes(nc.astype(np.int32).tobytes())
        self.pair_code.frombytes(pairs.tobytes())
        args = list(map(_GET["args"], xs))
        self._append_corr(self.correlation, list(map(getattr, args, _CORR, _NO_CORR)))
        bits = np.asarray(self.cat_bits, np.int64)[cc] & np.asarray(self.name_bits, np.int64)[nc]
        keep = set(np.flatnonzero(bits).tolist())
        for field in self.has_fields:  # getattr of None, or of a launch's args: UNSET too
            has = map(is_not, map(getattr, args, repeat(field), repeat(UNSET)), repeat(UNSET))
            keep.update(compress(range(len(args)), has))
        if keep:
            self._keep_args(args, sorted(keep), base)
        if len(self.ts_us) >= BLOCK_EVENTS:
            self._flush()
        return len(chunk)

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
            corr = list(map(getattr, map(_GET["args"], launches), _CORR, _NO_CORR))
        self._append_corr(self.launch_corr, corr)
        ts = np.fromiter(map(_GET["ts"], launches), np.float64, len(launches))
        self.launch_ts_us.frombytes(ts.tobytes())
        names, pairs = self._name_pair_codes(launches)
        self.launch_pair.frombytes(pairs.tobytes())
        self.launch_name.frombytes(names.astype(np.int32).tobytes())

    def _decide(self) -> None:
        """Which categories to keep, from the tables that the top-level keys leave."""
        tables = tables_for_meta(self.tables, self.meta)
        self.relevant = needed_cats(tables)
        self.needed_names = needed_names(tables)
        no_threads = all(r.comm_thread is None for t in tables for r in t.rules)
        self.launch_only = self.relevant is not None and no_threads
        if self.relevant is not None:
            self.read_python = (
                reads_python_functions(tables) and PYTHON_FUNCTION_CAT not in self.relevant
            )
            self.skip_cats = SKIP_CATS - self.relevant - {"cpu_op", "user_annotation"}
            if self.read_python:
                self.skip_cats -= {PYTHON_FUNCTION_CAT}
            self.tagged = _TaggedTypes(self.struct_keys, self.skip_cats, self.read_python)
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
        if isinstance(key, list | dict) and (table is self.pids or table is self.tids):
            field = "pid" if table is self.pids else "tid"
            raise ValueError(
                f"{self.source}: an event's '{field}' is a {type(key).__name__} "
                f"({json.dumps(key, default=str)[:40]}); a trace's pid and tid are numbers or names"
            )
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

    def _code(self, table: dict[Any, int], key: Any, bits: list[int] | None) -> int:
        try:
            return table[key]
        except (KeyError, TypeError):
            return self._new_code(table, key, bits)

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
            if type(cat) is not str or cat not in self.relevant:
                if cat == PYTHON_FUNCTION_CAT:
                    if not (self.read_python and self._python_needed(e.get("name", ""))):
                        return
                elif (type(cat) is str and cat in self.skip_cats) or not self._name_needed(
                    e.get("name", "")
                ):
                    return
            if self.launch_only and _is_launch(cat):
                a = e.get("args")
                corr = a.get("correlation", -1) if type(a) is dict else -1
                self.launch_corr.append(_int64_or_none(corr))
                launch_ts: Any = e.get("ts")
                try:
                    self.launch_ts_us.append(launch_ts)
                except (TypeError, OverflowError):
                    self.launch_ts_us.append(self._number(launch_ts, "ts", e))
                self.launch_pair.append(self._pair(e.get("pid"), e.get("tid")))
                self.launch_name.append(self._code(self.names, e.get("name", ""), self.name_bits))
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
        cc = self._code(self.cats, e.get("cat", ""), self.cat_bits)
        nc = self._code(self.names, e.get("name", ""), self.name_bits)
        self.cat_code.append(cc)
        self.name_code.append(nc)
        self.pair_code.append(self._pair(e.get("pid"), e.get("tid")))
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
            self.args.add_dict(len(self) - 1, a)

    def _flush(self) -> None:
        """Convert the pending float ts/dur to int64 ns starts and ends, and check them.

        Done per ``BLOCK_EVENTS`` events or more (chunks or dict events), so no float column
        of the whole trace, nor its conversion temporaries, is ever alive. Bad values are counted,
        the first one's details kept for ``finish``'s message, and stored as 0.
        """
        if not self.ts_us:
            return
        base = len(self.start_ns)
        ts = np.frombuffer(self.ts_us, dtype=np.float64)
        dur = np.frombuffer(self.dur_us, dtype=np.float64)
        unfinished = unfinished_events(ts, dur)
        self.unfinished.frombytes(unfinished.astype(np.int8).tobytes())
        bad = ~np.isfinite(ts) | ~np.isfinite(dur) | (dur < 0) | (dur > MAX_EVENT_DURATION_US)
        bad &= ~unfinished
        # int64 nanoseconds hold about 292 years: a later end is a corrupt trace, not a time
        with np.errstate(invalid="ignore"):  # inf - inf where ts and dur are both bad
            beyond = (np.abs(ts) + dur >= MAX_TS_US) & ~unfinished
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
        if unfinished.any():
            ts, dur = np.where(unfinished, 0.0, ts), np.where(unfinished, 0.0, dur)
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
        # The thread code: the rank of the (pid, tid) pair among the trace's pairs in a fixed
        # order (not the order of first appearance, which differs between the chunked and the
        # dict path once launches are kept apart): one int64 column.
        thread = self._thread(self.pair_code)
        self.pair_code = array("q")
        cols = TraceColumns(
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
            **self._launches(thread),
            args=self.args.finish(),
        )  # the columns share the arrays' buffers: nothing appends to them any more
        unfinished = np.frombuffer(self.unfinished, dtype=np.int8).astype(bool)
        if unfinished.all():
            raise ValueError(
                f"{self.source}: every complete ('X') event is unfinished (dur -1, or ts 0 with "
                "an epoch time for dur): the profiler stopped before any op ended; re-export it"
            )
        if unfinished.any():
            cols = _drop(cols, unfinished, np.zeros(cols.launch_correlation.size, bool))
            cols = dataclasses.replace(cols, num_unfinished=int(unfinished.sum()))
        if self.control_chars_at:
            cols = dataclasses.replace(cols, control_chars_at=tuple(self.control_chars_at))
        return drop_duplicates(cols)

    def _thread(self, pair_code: array[int]) -> npt.NDArray[np.int64]:
        """Pair codes -> thread codes: pid rank * (num tids + 1) + tid rank, each rank in the
        order of the values' JSON text (not of first appearance, which differs between the
        chunked and the dict path once launches are kept apart)."""
        codes = np.frombuffer(pair_code, dtype=np.int64)
        pid_rank, tid_rank = _canonical(self.pids), _canonical(self.tids)
        return pid_rank[codes >> 32] * (len(self.tids) + 1) + tid_rank[codes & 0xFFFFFFFF]

    def _launches(self, events_thread: npt.NDArray[np.int64]) -> dict[str, Any]:
        """The launch columns, sorted by correlation id: those kept apart (``launch_only``)
        and those kept as events."""
        ts_us = np.frombuffer(self.launch_ts_us, dtype=np.float64)
        corr = np.frombuffer(self.launch_corr, dtype=np.int64)
        start = _to_ns(np.where(np.isfinite(ts_us), ts_us, 0.0))
        thread = self._thread(self.launch_pair)
        name = np.frombuffer(self.launch_name, dtype=np.int32)
        as_events = [c in LAUNCH_CATS for c in self.cats]
        if any(as_events):
            sel = code_mask(np.frombuffer(self.cat_code, dtype=np.int32), as_events)
            corr = np.concatenate([corr, np.frombuffer(self.correlation, np.int64)[sel]])
            start = np.concatenate([start, np.frombuffer(self.start_ns, np.int64)[sel]])
            thread = np.concatenate([thread, events_thread[sel]])
            name = np.concatenate([name, np.frombuffer(self.name_code, np.int32)[sel]])
        order = np.argsort(corr, kind="stable")
        return {
            "launch_correlation": corr[order],
            "launch_start_ns": start[order],
            "launch_thread": thread[order],
            "launch_name_code": name[order].astype(np.int32),
        }


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


def unfinished_events(
    ts: npt.NDArray[np.float64], dur: npt.NDArray[np.float64]
) -> npt.NDArray[np.bool_]:
    """Events the profiler wrote unfinished: ``dur`` exactly -1 (PyTorch 2.7 on marks an op
    whose end it did not see so), or ``ts`` 0 with a ``dur`` past ``MAX_EVENT_DURATION_US``
    (an op whose start it did not see: the end's epoch time written as the duration). They
    hold no interval; the reader drops and counts them (``num_unfinished``) rather than
    refuse a trace the profiler wrote as it does."""
    with np.errstate(invalid="ignore"):
        return (dur == -1.0) | ((ts == 0.0) & (dur > MAX_EVENT_DURATION_US) & np.isfinite(dur))


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
    return dataclasses.replace(_drop(cols, dup, ldup), num_duplicates=num)


def _drop(
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


def _canonical(codes: dict[Any, int]) -> npt.NDArray[np.int64]:
    """Code -> the value's rank in the order of its JSON text."""
    keys = sorted(codes, key=lambda k: json.dumps(k, sort_keys=True, default=str))
    out = np.zeros(max(len(codes), 1), np.int64)
    out[[codes[k] for k in keys]] = np.arange(len(keys))
    return out


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
        control_chars_at=builder.control_chars_at,
    )
    return builder.finish(meta)


def _has_ph(chunk: list[Any]) -> bool:
    """Whether one of a chunk's first items is an event with a 'ph' field (a Chrome trace)."""
    head = chunk[:NUM_PH_CHECKED]
    if isinstance(chunk, _PlainChunk):
        return any(isinstance(e, dict) and "ph" in e for e in head)
    return any(e.ph is not None for e in head)
