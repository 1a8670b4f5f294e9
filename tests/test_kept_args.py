"""The kept args as key columns (``commprof.traces.kept_args``): the mapping a dict per event
would be, whichever way the events came (decoded structs, plain dicts), and after a drop."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from commprof.traces.kept_args import ABSENT, KeptArgsBuilder, absent

KEYS = ("Collective name", "Seq", "Input Dims")
Args = msgspec.defstruct(
    "Args",
    [("correlation", Any, -1), ("k0", Any, msgspec.UNSET), ("k1", Any, msgspec.UNSET),
     ("k2", msgspec.Raw, msgspec.UNSET)],
    rename={"k0": "Collective name", "k1": "Seq", "k2": "Input Dims"},
)  # fmt: skip


def _structs(dicts: list[dict[str, Any]]) -> list[Any]:
    return msgspec.json.decode(msgspec.json.encode(dicts), type=list[Args])


def test_columns_read_as_the_dicts_of_the_kept_keys() -> None:
    dicts = [
        {"Collective name": "allreduce", "Seq": 3, "correlation": 7},
        {"correlation": 8},  # no kept key: not held
        {"Seq": None, "Input Dims": [[2, 3]], "x": 1},  # null is a value, Raw decoded
    ]
    built = KeptArgsBuilder(KEYS, ("k0", "k1", "k2"), frozenset({"Input Dims"}))
    built.add_structs([4, 5, 9], _structs(dicts))
    built.add_dict(11, {"Collective name": "broadcast", "other": 2})
    built.add_dict(12, {"other": 2})
    kept = built.finish()
    want = {
        4: {"Collective name": "allreduce", "Seq": 3},
        9: {"Seq": None, "Input Dims": [[2, 3]]},
        11: {"Collective name": "broadcast"},
    }
    assert dict(kept) == want and list(kept.keys()) == [4, 9, 11] and len(kept) == 3
    assert kept.get(5) is None and kept[9] == want[9]
    rows = kept.rows(np.array([9, 5, 4, 11, 30]))
    assert rows.tolist() == [1, -1, 0, 2, -1]
    assert kept.column("Seq", rows) == [None, ABSENT, 3, ABSENT, ABSENT]
    assert kept.column("absent key", rows) == [ABSENT] * 5
    assert kept.events_with("Collective name").tolist() == [4, 11]
    assert kept.events_with("Seq").tolist() == [4, 9]
    assert absent([1, ABSENT, None, ABSENT]) == [1, 3] and absent([1, None]) == []


def test_a_drop_renumbers_the_events_kept() -> None:
    built = KeptArgsBuilder(KEYS, ("k0", "k1", "k2"), frozenset())
    for event in (1, 3, 4):
        built.add_dict(event, {"Seq": event})
    keep = np.array([True, True, False, True, True])  # event 2 dropped
    kept = built.finish().subset(keep, np.cumsum(keep) - 1)
    assert dict(kept) == {1: {"Seq": 1}, 2: {"Seq": 3}, 3: {"Seq": 4}}
    assert kept.column("Seq", kept.rows(np.array([3, 0]))) == [4, ABSENT]


def test_equal_strings_are_kept_as_one_object_and_other_values_as_they_are() -> None:
    dicts = [{"Collective name": "allreduce", "Seq": 1}, {"Collective name": "allreduce",
             "Seq": True}, {"Seq": 1.0}, {"Collective name": ["a"], "Seq": 1}]  # fmt: skip
    text = frozenset({"Collective name", "Seq"})  # Seq: numbers where strings were expected
    built = KeptArgsBuilder(KEYS, ("k0", "k1", "k2"), frozenset({"Input Dims"}), text)
    built.add_structs([0, 1], _structs(dicts[:2]))  # a chunk of strings: interned
    built.add_structs([2, 3], _structs(dicts[2:]))  # a list among them: kept as it is
    kept = built.finish()
    names, seqs = kept.column("Collective name", [0, 1, 2, 3]), kept.column("Seq", [0, 1, 2, 3])
    assert names == ["allreduce", "allreduce", ABSENT, ["a"]] and names[0] is names[1]
    assert [type(s) for s in seqs] == [int, bool, float, int]  # 1 == True == 1.0: not merged
