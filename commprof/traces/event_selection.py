"""Which of a trace's events are kept, decided from the rule tables that its top-level keys
leave, and the decoding of a chunk that makes the choice cheap.

Only the events the candidate rule tables can use are kept (``trace_rules.needed_cats`` and
``needed_names``: the tables' categories, and events of any category named like a
communication-thread marker or, while the regime is to be detected, a comm kernel, and the Python
frames of communication libraries, read by name only until one turns up); where
``distributedInfo`` names NCCL only the cuda-nccl table applies, and launches are kept only as
correlation ids. A chunk is decoded into structs tagged by category
(:class:`commprof.traces.event_structs.TaggedTypes`), so that what becomes of an event's category
is read once per struct type, not once per event; each pass over a chunk is iterated in C
(``map``, ``compress``, ``np.fromiter``).
"""

from __future__ import annotations

import re
from functools import partial
from itertools import compress
from operator import attrgetter, eq
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from commprof.traces.event_structs import GET, PlainChunk, TaggedTypes
from commprof.traces.trace_reader import generic_decode
from commprof.traces.trace_rules import (
    LAUNCH_CATS,
    PYTHON_COMM_PATTERN,
    PYTHON_FUNCTION_CAT,
    SKIP_CATS,
    RuleTable,
    needed_cats,
    needed_names,
    reads_python_functions,
    tables_for_meta,
)

SETTLE_CHUNKS, SETTLE_BACKOFF = 2, 4
"""Chunks in a row whose Python frames bear no new name before the known names decode them
(``TaggedTypes.know``), and the factor that number grows by each time a new name turns up:
a trace whose frames keep bearing new names (object addresses) stays decoded by name."""
MAX_KNOWN_NAMES = 1 << 14
"""Most frame names a ``Literal`` of known names holds (making one costs about a microsecond and a
half a name); past it the frames stay decoded by name."""
_TYPE_CODE = attrgetter("type_code")
_IS_X = partial(eq, "X")
"""Whether a ph is "X": False for a missing or non-string one (``"X".__eq__`` gives
NotImplemented there, which is true)."""
_DROP, _KEEP, _LAUNCH, _BY_NAME, _PYTHON = 0, 1, 2, 3, 4
"""What becomes of the events of a category: dropped, kept, kept as launches, kept where
their name is needed, kept where their name is a communication library's Python function."""
_NO_INDEX = np.empty(0, np.intp)


class EventSelection:
    """Decodes a trace's chunks and picks the events kept of each.

    Args:
        tables: The rule tables that may classify the trace's events.
        struct_keys: The ``args`` keys an event's struct holds (besides ``correlation``).
        event_type: The untagged struct (:func:`commprof.traces.event_structs.event_type`).
    """

    def __init__(
        self,
        tables: tuple[RuleTable, ...],
        struct_keys: tuple[str, ...],
        event_type: type[msgspec.Struct],
    ) -> None:
        self.tables = tables
        self.struct_keys = struct_keys
        self.decided = False
        """Whether :meth:`decide` has run (at the first chunk or event)."""
        self.relevant: frozenset[str] | None = None
        """Categories of the events kept (None: all), decided at the first chunk."""
        self.needed_names: re.Pattern[str] | None = None
        """Names of the events kept whatever their category (with ``relevant``)."""
        self.name_needed: dict[Any, bool] = {}
        """Name -> whether ``needed_names`` matches it, for the names of other categories."""
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
        self.skip_cats: frozenset[str] = frozenset()
        """Categories read as a bare tag and dropped (``trace_rules.SKIP_CATS``)."""
        self.launch_only = False
        """Launch events are kept in the launch columns only (decided with ``relevant``)."""
        self._decoder = msgspec.json.Decoder(list.__class_getitem__(event_type))
        self.tagged: TaggedTypes | None = None
        """Decoder by category (decided with ``relevant``); None: the untagged struct only."""
        self.type_cat: list[str] = []
        self.type_kind: list[int] = []
        """Per struct type of the tagged decode (by its ``type_code``, the order they were made
        in): its category, and what becomes of its events (``_kind``)."""
        self.type_cat_code: list[int] = []
        """Per struct type: its category's code in ``cats`` (-1 until an event is kept)."""
        self.num_untagged = 0
        """Chunks that the tagged decoder could not take (events without a category)."""

    def decide(self, meta: dict[str, Any]) -> None:
        """Which categories to keep, from the tables that the top-level keys leave."""
        tables = tables_for_meta(self.tables, meta)
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
            self.tagged = TaggedTypes(self.struct_keys, self.skip_cats, self.read_python)
        self.decided = True

    def decode(self, data: bytes) -> list[Any]:
        """Decode a chunk of events: structs tagged by category, else one untagged struct for
        every event, else plain values (a :class:`PlainChunk`)."""
        assert self.decided  # decide() comes first: it needs the keys before the events
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
            return PlainChunk(generic_decode(data))

    def kept(self, chunk: list[Any]) -> list[Any]:
        """The chunk's complete events that some rule, the windows or the launches use, and
        those of other categories with a needed name: iterated in C (``map``,
        ``itertools.compress``), no Python bytecode per event."""
        if self.relevant is None:
            return list(compress(chunk, map(_IS_X, map(GET["ph"], chunk))))
        n = len(chunk)
        cats = map(GET["cat"], chunk)
        in_rel = np.fromiter(
            map(self.relevant.__contains__, cats), bool, n
        )  # TypeError: unhashable
        others = np.flatnonzero(~in_rel)
        if others.size:
            evs = list(map(chunk.__getitem__, others.tolist()))
            names = list(map(GET["name"], evs))
            for name in set(names).difference(self.name_needed):
                self.name_needed[name] = self.needs_name(name)
            in_rel[others] = np.fromiter(map(self.name_needed.__getitem__, names), bool, len(names))
            python = [cat == PYTHON_FUNCTION_CAT for cat in map(GET["cat"], evs)]
            if any(python):  # judged by PYTHON_COMM_PATTERN alone, as the tagged chunks are
                in_rel[others[python]] = [
                    self.read_python and self.needs_frame(n) for n in compress(names, python)
                ]
        kept = list(compress(chunk, in_rel.tolist()))
        return list(compress(kept, map(_IS_X, map(GET["ph"], kept))))

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

    def kept_tagged(self, chunk: list[Any]) -> tuple[list[Any], list[Any], npt.NDArray[np.intp]]:
        """What :meth:`kept` keeps of a chunk of structs tagged by category, split into the
        launches kept apart (``launch_only``) and the other events, with the latter's type
        indices: the category read once per struct type, not once per event."""
        types = self._type_codes(chunk)
        kind = np.asarray(self.type_kind, np.int8)[types]
        keep = (kind == _KEEP) | (kind == _LAUNCH)
        others = np.flatnonzero(kind == _BY_NAME)
        if others.size:
            names = list(map(GET["name"], map(chunk.__getitem__, others.tolist())))
            for name in set(names).difference(self.name_needed):  # TypeError: unhashable
                self.name_needed[name] = self.needs_name(name)
            keep[others] = np.fromiter(map(self.name_needed.__getitem__, names), bool, len(names))
        python = _NO_INDEX if self.known_chunk else np.flatnonzero(kind == _PYTHON)
        if python.size:
            needed = self._python_kept(chunk, python)
            assert self.tagged is not None  # a tagged chunk
            if needed is not None and self.tagged.python_names:  # decoded by name only: again
                self.tagged.read_python()
                return self.kept_tagged(self.tagged.decoder.decode(self.data))
            if needed is not None:
                keep[python] = needed
        if keep.all():  # the usual chunk: no event of it dropped for its category or name
            kept = chunk
        else:
            where = np.flatnonzero(keep)
            kept = list(compress(chunk, keep.tolist()))
            kind, types = kind[where], types[where]
        phs = list(map(GET["ph"], kept))
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
        names = set(map(GET["name"], frames()))  # TypeError: unhashable, as for _BY_NAME
        new = names.difference(self.python_needed)
        for name in new:
            self.python_needed[name] = self.needs_frame(name)
        if not any(map(self.python_needed.__getitem__, names)):
            self._settle(bool(new))
            return None
        got = map(self.python_needed.__getitem__, map(GET["name"], frames()))
        return np.fromiter(got, bool, python.size)

    def _settle(self, new: bool) -> None:
        """Count a chunk whose frames were none of them needed (``new``: some bore a new name);
        once ``settle_chunks`` in a row bore none, decode by the known names
        (``TaggedTypes.know``: the names of no communication library; a frame of one, met in a
        chunk read as plain values, fails that decoder and is read whole)."""
        self.num_settled = 0 if new else self.num_settled + 1
        tagged = self.tagged
        if tagged is None or tagged.known_decoder is not None or not tagged.python_names:
            return
        if self.num_settled >= self.settle_chunks and len(self.python_needed) <= MAX_KNOWN_NAMES:
            names = tuple(n for n, needed in self.python_needed.items() if not needed)
            if names and all(type(n) is str for n in names):
                tagged.know(names)  # type: ignore[arg-type]  # checked: every name a str

    def needs_frame(self, name: Any) -> bool:
        """Whether a Python frame named ``name`` is kept (``PYTHON_COMM_PATTERN``)."""
        try:
            return self.python_needed[name]
        except KeyError:
            needed = self.python_needed[name] = self.python_rx.match(str(name)) is not None
            return needed
        except TypeError:  # unhashable: no Python frame's name
            return False

    def needs_name(self, name: Any) -> bool:
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
