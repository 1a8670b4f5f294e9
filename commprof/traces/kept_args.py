"""The ``args`` keys kept of a trace's events, stored as one column of values per key.

The reader keeps the args keys that a rule or the collectives table reads
(``trace_rules.COLLECTIVE_ARG_KEYS`` and the rules' ``has_arg`` keys) of the events that may need
them: collectives and their launching ops, a few hundred thousand in a large trace. They are
gathered a chunk at a time while its decoded structs are in the CPU's cache (one tuple of the
kept fields an event, transposed into the key columns), not as a dict an event: the collectives
table then reads a key of every collective with one numpy ``take`` of an object column, not a
lookup in each event's dict (cold by then), and the columns hold no dict of their own (a few
hundred bytes an event). A chunk's string values (collective names, process groups, dtypes) are
kept as one object per distinct string, found while the chunk is hot: the table's later passes
over a column then read a few objects in cache, not a cold string an event (run 11 of
``bench_trace_shapes``: about 0.85 of the parse's CPU time on kernel_heavy_150k), and
the decoded copies are freed with their chunk. The decoded structs are not kept instead: read a
key at a time after the whole trace, they are as cold as the dicts. :class:`KeptArgs` still reads
as the mapping event index -> its kept args (a dict built on demand) for the few callers that
want one event's.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from itertools import compress, repeat
from operator import attrgetter, is_, ne
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

ABSENT: Any = msgspec.UNSET
"""A key's value where an event's args lack the key (what a decoded struct's field holds)."""


_TEXT = frozenset({str, type(ABSENT)})
_RAW_KEY, _TEXT_KEY = "raw", "text"
"""How a key's values are kept: decoded from undecoded JSON, interned where they are strings."""


def absent(values: list[Any]) -> list[int]:
    """Positions of ``values`` that are ``ABSENT``: none at once where no value is (the usual
    column; ``in`` runs in C), else one pass in C."""
    if ABSENT not in values:
        return []
    return list(compress(range(len(values)), map(is_, values, repeat(ABSENT))))


def _decoded(value: Any) -> Any:
    """A kept value: undecoded JSON (``msgspec.Raw``, trace_rules.RAW_ARG_KEYS) decoded now."""
    return msgspec.json.decode(value) if type(value) is msgspec.Raw else value


class KeptArgs(Mapping[int, dict[str, Any]]):
    """Event index -> its kept args: the events whose args hold at least one kept key, in file
    order, with a column of values per key (``ABSENT`` where an event's args lack it).

    Args:
        keys: The kept keys, one column each.
        index: Index of each event held (int64, increasing).
        columns: Per key, its value for each event held, then ``ABSENT`` (the value of row -1:
            no event), as object arrays.
    """

    def __init__(
        self, keys: tuple[str, ...], index: npt.NDArray[np.int64], columns: list[npt.NDArray[Any]]
    ) -> None:
        self.arg_keys, self.index = keys, index
        self._columns = dict(zip(keys, columns, strict=True))
        self._none = np.full(index.size + 1, ABSENT, object)

    def __len__(self) -> int:
        return int(self.index.size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.index.tolist())

    def __getitem__(self, event: int) -> dict[str, Any]:
        row = int(self.rows(np.array([event], np.int64))[0])
        if row < 0:
            raise KeyError(event)
        return self.at(row)

    def at(self, row: int) -> dict[str, Any]:
        """The kept args of row ``row`` (``{}`` for row -1), keys in the order of ``arg_keys``."""
        values = ((k, c[row]) for k, c in self._columns.items())
        return {k: v for k, v in values if v is not ABSENT}

    def rows(self, events: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.intp]:
        """Row of each event (-1 where its args hold no kept key): a binary search."""
        if not self.index.size:
            return np.full(events.size, -1, np.intp)
        pos = np.minimum(np.searchsorted(self.index, events), self.index.size - 1)
        return np.where(self.index[pos] == events, pos, -1)

    def column(self, key: str, rows: npt.NDArray[np.intp] | list[int]) -> list[Any]:
        """``key``'s value at each row, ``ABSENT`` where the row lacks it or is -1."""
        return self._columns.get(key, self._none)[rows].tolist()  # type: ignore[no-any-return]

    def events_with(self, key: str) -> npt.NDArray[np.int64]:
        """The events whose kept args hold ``key``."""
        values = self._columns.get(key)
        if values is None:
            return np.empty(0, np.int64)
        gaps = absent(values[:-1].tolist())
        if not gaps:
            return self.index
        held = np.ones(self.index.size, bool)
        held[gaps] = False
        return self.index[held]

    def subset(self, keep: npt.NDArray[np.bool_], new_index: npt.NDArray[np.intp]) -> KeptArgs:
        """The args of the events where ``keep`` (per event) is set, renumbered by
        ``new_index`` (per event: its index among the kept)."""
        sel = keep[self.index]
        tail = np.ones(1, bool)  # the row -1's ABSENT stays last
        return KeptArgs(
            self.arg_keys,
            new_index[self.index[sel]].astype(np.int64),
            [c[np.concatenate([sel, tail])] for c in self._columns.values()],
        )


class KeptArgsBuilder:
    """Gathers :class:`KeptArgs` a chunk of decoded structs (``add_structs``) or an event's
    args dict (``add_dict``) at a time, in file order.

    Args:
        keys: The kept keys.
        fields: The struct field of each key (the args structs rename keys to fields).
        raw_keys: Keys decoded as undecoded JSON (``msgspec.Raw``), decoded when kept.
        text_keys: Keys whose values are usually strings that repeat: a chunk's, where they are
            all strings, kept as one object per distinct string.
    """

    def __init__(
        self,
        keys: tuple[str, ...],
        fields: tuple[str, ...],
        raw_keys: frozenset[str],
        text_keys: frozenset[str] = frozenset(),
    ) -> None:
        self.keys, self.fields = keys, fields
        self._get = attrgetter(*fields) if len(fields) > 1 else None
        self._kinds = [
            _RAW_KEY if k in raw_keys else _TEXT_KEY if k in text_keys else None for k in keys
        ]
        self._none = (ABSENT,) * len(keys)
        self.index = array("q")
        self.values: list[list[Any]] = [[] for _ in keys]
        self._strings: list[dict[str, str]] = [{} for _ in keys]
        """Per key: its string values so far, each the one object every equal value is kept as."""

    def _row(self, args: Any) -> tuple[Any, ...]:
        return tuple(getattr(args, f, ABSENT) for f in self.fields)

    def add_structs(self, index: list[int], args: list[Any]) -> None:
        """Keep the args structs ``args`` of the events ``index`` (those that hold a key)."""
        if not args or not self.keys:
            return
        try:
            rows = list(map(self._get, args)) if self._get is not None else None
        except AttributeError:  # an args struct without the kept fields (a launch's)
            rows = None
        if rows is None:
            rows = list(map(self._row, args))
        held = list(map(ne, rows, repeat(self._none)))  # tuples compared in C
        if not all(held):
            rows, index = list(compress(rows, held)), list(compress(index, held))
            if not rows:
                return
        self.index.fromlist(index)
        for column, strings, kind, values in zip(
            self.values, self._strings, self._kinds, zip(*rows, strict=True), strict=True
        ):
            if kind is _TEXT_KEY and set(map(type, values)) <= _TEXT:  # strings: interned
                column.extend(map(strings.setdefault, values, values))
            elif kind is _RAW_KEY and any(map(isinstance, values, repeat(msgspec.Raw))):
                column.extend(map(_decoded, values))
            else:
                column.extend(values)

    def add_dict(self, event: int, args: dict[str, Any]) -> None:
        """Keep the kept keys of event ``event``'s args (a plain dict), if it holds one."""
        row = tuple(args.get(k, ABSENT) for k in self.keys)
        if row != self._none:
            self.index.append(event)
            for column, value in zip(self.values, row, strict=True):
                column.append(value)

    def finish(self) -> KeptArgs:
        """The :class:`KeptArgs`; the builder's lists are handed over (and emptied)."""
        n = len(self.index)
        columns = []
        for values in self.values:
            values.append(ABSENT)  # the value of row -1
            columns.append(np.fromiter(values, object, n + 1))
            values.clear()
        return KeptArgs(self.keys, np.frombuffer(self.index, np.int64).copy(), columns)
