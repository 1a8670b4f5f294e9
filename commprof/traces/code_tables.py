"""Codes of a trace's values: categories, names and (pid, tid) pairs, each interned in order of
first appearance, and the thread code of a pair.

An event's name and (pid, tid) pair are coded by one dict lookup of the (name, pid, tid) triple;
each new category and name gets, with its code, the bits of the collective rules that take it
(an event may be a collective where its category's bits and its name's meet). The thread code is
the rank of the pair among the trace's pairs in the order of their JSON text, not of first
appearance (which differs between the chunked and the dict path once launches are kept apart).
"""

from __future__ import annotations

import json
import re
from array import array
from itertools import repeat
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from commprof.traces.event_structs import GET
from commprof.traces.trace_rules import Rule

_NAME_PID_TID = attrgetter("name", "pid", "tid")
_MISSING = repeat(-1)


def _interned(table: dict[Any, int], key: Any) -> tuple[Any, int | None]:
    """Hashable form of ``key`` and its code in ``table`` (None if new)."""
    try:
        return key, table.get(key)
    except TypeError:  # unhashable (a list or dict where a string belongs)
        key = json.dumps(key, sort_keys=True)
        return key, table.get(key)


class CodeTables:
    """The code tables of one trace's values, and the codes of events' values in them.

    Args:
        source: The trace's name, for messages.
        coll_rules: The collective rules a category's and a name's bits are of (bit i: rule i
            takes it).
    """

    def __init__(self, source: str, coll_rules: list[Rule]) -> None:
        self.source = source
        self.coll_rules = coll_rules
        self.cats: dict[Any, int] = {}
        self.names: dict[Any, int] = {}
        self.pids: dict[Any, int] = {}
        self.tids: dict[Any, int] = {}
        """pid and tid -> their codes, in order of first appearance (``pair``)."""
        self.triples: dict[tuple[Any, Any, Any], int] = {}
        """(name, pid, tid) met in decoded chunks -> its index in the two columns below."""
        self.triple_name, self.triple_pair = array("q"), array("q")
        """Per (name, pid, tid): its name code and its (pid, tid) pair code."""
        self.cat_bits: list[int] = []  # per code: bit i set if coll_rules[i] takes the category
        self.name_bits: list[int] = []  # per code: bit i set if coll_rules[i] takes the name

    def codes(
        self, table: dict[Any, int], events: list[Any], field: str, bits: list[int] | None
    ) -> npt.NDArray[np.int64]:
        """Codes of the events' ``field`` values in ``table``, adding the new ones (in order of
        first appearance)."""
        get = GET[field]
        try:
            codes = np.fromiter(map(table.get, map(get, events), _MISSING), np.int64, len(events))
        except TypeError:  # an unhashable key (a list where a string belongs): one at a time
            return np.array([self.new_code(table, get(e), bits) for e in events], np.int64)
        for i in np.flatnonzero(codes < 0).tolist():  # new values, in order of first appearance
            codes[i] = self.code(table, get(events[i]), bits)
        return codes

    def name_pair_codes(
        self, events: list[Any]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Name codes and (pid, tid) pair codes (pid code << 32 | tid code) of the events: one
        lookup of the (name, pid, tid) triple an event, each part coded only for a new one
        (names in order of first appearance, as :meth:`codes` codes them)."""
        try:
            idx = np.fromiter(
                map(self.triples.get, map(_NAME_PID_TID, events), _MISSING), np.int64, len(events)
            )
        except TypeError:  # an unhashable name, pid or tid: each coded apart
            names = self.codes(self.names, events, "name", self.name_bits)
            pairs = self.codes(self.pids, events, "pid", None)
            pairs <<= 32
            pairs |= self.codes(self.tids, events, "tid", None)
            return names, pairs
        for i in np.flatnonzero(idx < 0).tolist():
            key = _NAME_PID_TID(events[i])
            j = self.triples.get(key, -1)
            if j < 0:
                name, pid, tid = key
                j = self.triples[key] = len(self.triple_name)
                self.triple_name.append(self.code(self.names, name, self.name_bits))
                self.triple_pair.append(self.pair(pid, tid))
            idx[i] = j
        return (
            np.frombuffer(self.triple_name, np.int64)[idx],
            np.frombuffer(self.triple_pair, np.int64)[idx],
        )

    def pair(self, pid: Any, tid: Any) -> int:
        """The code of one (pid, tid) pair."""
        return (self.code(self.pids, pid, None) << 32) | self.code(self.tids, tid, None)

    def new_code(self, table: dict[Any, int], key: Any, bits: list[int] | None) -> int:
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

    def code(self, table: dict[Any, int], key: Any, bits: list[int] | None) -> int:
        try:
            return table[key]
        except (KeyError, TypeError):
            return self.new_code(table, key, bits)

    def thread(self, pair_code: array[int]) -> npt.NDArray[np.int64]:
        """Pair codes -> thread codes: pid rank * (num tids + 1) + tid rank, each rank in the
        order of the values' JSON text (not of first appearance, which differs between the
        chunked and the dict path once launches are kept apart)."""
        codes = np.frombuffer(pair_code, dtype=np.int64)
        pid_rank, tid_rank = _canonical(self.pids), _canonical(self.tids)
        return pid_rank[codes >> 32] * (len(self.tids) + 1) + tid_rank[codes & 0xFFFFFFFF]


def _canonical(codes: dict[Any, int]) -> npt.NDArray[np.int64]:
    """Code -> the value's rank in the order of its JSON text."""
    keys = sorted(codes, key=lambda k: json.dumps(k, sort_keys=True, default=str))
    out = np.zeros(max(len(codes), 1), np.int64)
    out[[codes[k] for k in keys]] = np.arange(len(keys))
    return out
