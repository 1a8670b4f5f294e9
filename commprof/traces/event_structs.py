"""The msgspec structs a chunk of a trace's events decodes into: the fields the columns read.

The reader (:mod:`commprof.traces.trace_reader`) decodes each chunk of events with msgspec into
:class:`msgspec.Struct` types that hold only the fields the columns use (``ph``, ``cat``,
``name``, ``pid``, ``tid``, ``ts``, ``dur`` and the few ``args`` keys the rule tables read), so
every other field is skipped unallocated. A chunk whose values do not fit the types (a string
``dur``, an ``args`` that is no object) is decoded again as plain values (:class:`PlainChunk`)
and taken one event at a time. Where the rule tables name the categories they read, the structs
are tagged by category (:class:`TaggedTypes`): of such structs the category is a class
attribute, read once per struct type, not once per event.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Any, Literal, Union

import msgspec

from commprof.traces.trace_rules import LAUNCH_CATS, PYTHON_FUNCTION_CAT, RAW_ARG_KEYS

MAX_LEARNED_CATS = 64
"""Categories outside the known ones added to the typed decoder before it gives up on tags."""
GET = {f: attrgetter(f) for f in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")}
"""Field -> its getter, for a pass over a chunk's structs (``map(GET["name"], chunk)``)."""
_PHASE: Any = Literal.__getitem__(tuple("BEXiICbneSTpFstfPNODMVvRc()"))
"""The event phases of the Trace Event Format, as the tagged structs decode ``ph``: each value
the one string object of the ``Literal`` (no string built an event); any other value fails the
chunk, which is then read as the untagged struct reads it (``ph`` as it is)."""
_BAD_CAT = re.compile(r"Invalid value '(.{1,200})' - at `\$\[\d+\]\.cat`")


class PlainChunk(list[Any]):
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


def event_type(kept_keys: tuple[str, ...]) -> type[msgspec.Struct]:
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


class TaggedTypes:
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
