"""Interval set algebra: closed-form cases and hypothesis properties against a grid reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commprof.traces.intervals import (
    IntervalSet,
    clip,
    difference,
    intersection,
    total_length,
    union,
    union_all,
)


def iset(*pairs: tuple[int, int]) -> IntervalSet:
    return IntervalSet.from_arrays([p[0] for p in pairs], [p[1] for p in pairs])


def as_pairs(a: IntervalSet) -> list[tuple[int, int]]:
    return list(zip(a.starts.tolist(), a.ends.tolist(), strict=True))


def test_from_arrays_merges_nested_touching_zero_length_and_unsorted() -> None:
    # [50,60) and [0,10) unsorted; [2,5) nested in [0,10); [10,20) touches [0,10);
    # [30,30) has zero length; [55,70) overlaps [50,60).
    a = iset((50, 60), (2, 5), (0, 10), (10, 20), (30, 30), (55, 70))
    assert as_pairs(a) == [(0, 20), (50, 70)]
    assert total_length(a) == 20 + 20


def test_from_arrays_does_not_mutate_inputs_and_outputs_are_read_only() -> None:
    starts, ends = np.array([5, 0]), np.array([9, 3])
    a = IntervalSet.from_arrays(starts, ends)
    assert starts.tolist() == [5, 0] and ends.tolist() == [9, 3]
    assert a.starts.dtype == np.int64
    with pytest.raises(ValueError):
        a.starts[0] = 1


def test_from_arrays_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="end before they start"):
        IntervalSet.from_arrays([5], [4])
    with pytest.raises(TypeError, match="integer nanoseconds"):
        IntervalSet.from_arrays([0.5], [1.5])
    with pytest.raises(ValueError, match="equal length"):
        IntervalSet.from_arrays([0, 1], [2])
    with pytest.raises(ValueError, match="from_arrays"):
        IntervalSet(starts=np.array([0, 5]), ends=np.array([6, 9]))  # overlapping, not merged


def test_empty_sets() -> None:
    e = IntervalSet.empty()
    a = iset((0, 10))
    assert total_length(e) == 0 and len(e) == 0
    assert as_pairs(union(e, a)) == [(0, 10)]
    assert as_pairs(intersection(e, a)) == []
    assert as_pairs(difference(a, e)) == [(0, 10)]
    assert as_pairs(difference(e, a)) == []
    assert as_pairs(union_all([])) == []


def test_set_operations_closed_form() -> None:
    a = iset((0, 10), (20, 30))
    b = iset((5, 25))
    assert as_pairs(union(a, b)) == [(0, 30)]
    assert as_pairs(intersection(a, b)) == [(5, 10), (20, 25)]
    assert as_pairs(difference(a, b)) == [(0, 5), (25, 30)]
    assert as_pairs(difference(b, a)) == [(10, 20)]
    # Touching sets share no point: [0,10) and [10,20).
    assert as_pairs(intersection(iset((0, 10)), iset((10, 20)))) == []
    assert as_pairs(difference(iset((0, 10)), iset((10, 20)))) == [(0, 10)]


def test_clip() -> None:
    a = iset((0, 10), (20, 30), (40, 50))
    assert as_pairs(clip(a, 5, 45)) == [(5, 10), (20, 30), (40, 45)]
    assert as_pairs(clip(a, 10, 20)) == []
    assert as_pairs(clip(a, 25, 25)) == []
    assert as_pairs(clip(a, -5, 100)) == as_pairs(a)
    with pytest.raises(ValueError, match="hi >= lo"):
        clip(a, 5, 4)


GRID = 40
intervals = st.lists(
    st.tuples(st.integers(0, GRID), st.integers(0, 12)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=12,
)


def mask(pairs: list[tuple[int, int]]) -> np.ndarray:
    """Reference: which unit cells [x, x+1) of the grid are covered."""
    m = np.zeros(GRID + 13, bool)
    for s, e in pairs:
        m[s:e] = True
    return m


def from_mask(m: np.ndarray) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for x in np.flatnonzero(m).tolist():
        if out and out[-1][1] == x:
            out[-1] = (out[-1][0], x + 1)
        else:
            out.append((x, x + 1))
    return out


@settings(max_examples=150, deadline=None)
@given(intervals, intervals, st.integers(0, GRID), st.integers(0, 20))
def test_operations_match_reference(
    pa: list[tuple[int, int]], pb: list[tuple[int, int]], lo: int, width: int
) -> None:
    a, b = iset(*pa) if pa else IntervalSet.empty(), iset(*pb) if pb else IntervalSet.empty()
    ma, mb = mask(pa), mask(pb)
    assert as_pairs(a) == from_mask(ma)
    assert as_pairs(union(a, b)) == from_mask(ma | mb)
    assert as_pairs(intersection(a, b)) == from_mask(ma & mb)
    assert as_pairs(difference(a, b)) == from_mask(ma & ~mb)
    assert total_length(a) == int(ma.sum())
    window = np.zeros_like(ma)
    window[lo : lo + width] = True
    assert as_pairs(clip(a, lo, lo + width)) == from_mask(ma & window)
    # Inclusion-exclusion as an identity on lengths.
    assert total_length(union(a, b)) == total_length(a) + total_length(b) - total_length(
        intersection(a, b)
    )
