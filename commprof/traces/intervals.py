"""Interval sets over int64 nanoseconds: merge, union, intersection, difference, length.

An interval set is a pair of sorted, merged int64 arrays (starts, ends) of
half-open intervals [start, end) (docs/design.md, Definitions). Every function here is
pure: inputs are never mutated, outputs are new read-only arrays, and the work is
vectorised with numpy (in-place sorts, ``searchsorted``, ``repeat``, ``cumsum``), with
temporaries of a few bytes an interval; there is no Python loop over intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]


def _frozen(values: npt.ArrayLike) -> Int64Array:
    out = np.array(values, dtype=np.int64, copy=True).reshape(-1)
    out.setflags(write=False)
    return out


def _checked(starts: npt.ArrayLike, ends: npt.ArrayLike) -> tuple[Int64Array, Int64Array]:
    """Raw interval bounds as int64 arrays (not copied where they are already int64)."""
    s = np.asarray(starts)
    e = np.asarray(ends)
    if s.shape != e.shape or s.ndim != 1:
        raise ValueError(
            f"starts and ends must be 1-D arrays of equal length, got shapes "
            f"{s.shape} and {e.shape}"
        )
    if s.size and not (np.issubdtype(s.dtype, np.integer) and np.issubdtype(e.dtype, np.integer)):
        raise TypeError(
            f"interval bounds must be integer nanoseconds, got dtypes {s.dtype} and {e.dtype}; "
            "convert float microseconds with np.rint(ts_us * 1000).astype(np.int64)"
        )
    s = s.astype(np.int64, copy=False)
    e = e.astype(np.int64, copy=False)
    bad = np.flatnonzero(e < s)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{bad.size} interval(s) end before they start, first at index {i}: "
            f"[{int(s[i])}, {int(e[i])})"
        )
    return s, e


@dataclass(frozen=True, kw_only=True, slots=True)
class IntervalSet:
    """Sorted, disjoint, non-touching, non-empty half-open intervals [start, end).

    Build one with :meth:`from_arrays` (which sorts and merges); the constructor
    only accepts arrays that already satisfy the invariant.
    """

    starts: Int64Array
    """Interval starts (ns), strictly increasing."""
    ends: Int64Array
    """Interval ends (ns); ``starts[i] < ends[i] < starts[i + 1]``."""

    def __post_init__(self) -> None:
        starts = _frozen(self.starts)
        ends = _frozen(self.ends)
        if starts.shape != ends.shape:
            raise ValueError(
                f"starts and ends must have the same length, got {starts.size} and {ends.size}"
            )
        if starts.size and (np.any(ends <= starts) or np.any(starts[1:] <= ends[:-1])):
            raise ValueError(
                "IntervalSet arrays must be sorted, merged and non-empty intervals; "
                "use IntervalSet.from_arrays(starts, ends) to build one from raw intervals"
            )
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "ends", ends)

    @classmethod
    def empty(cls) -> IntervalSet:
        """The empty set."""
        return cls(starts=np.empty(0, np.int64), ends=np.empty(0, np.int64))

    @classmethod
    def from_arrays(
        cls, starts: npt.ArrayLike, ends: npt.ArrayLike, *, owned: bool = False
    ) -> IntervalSet:
        """Merge raw intervals (any order; nested, overlapping, touching or zero-length).

        Args:
            starts: Interval starts (ns), integer values.
            ends: Interval ends (ns), each ``>= `` its start.
            owned: The caller gives the arrays away (fresh int64 arrays it no longer uses):
                they are sorted in place and may become the set's own, without copies.

        Returns:
            The union of the intervals as an :class:`IntervalSet`.

        Raises:
            ValueError: If the lengths differ or an end lies before its start.
        """
        s, e = _checked(starts, ends)
        owned = owned and s is starts and e is ends
        keep = e > s  # zero-length intervals cover nothing
        if not keep.all():
            s, e, owned = s[keep], e[keep], True
        del keep  # temporaries go as soon as they are used: traces hold millions of events
        if s.size == 0:
            return cls.empty()
        # Starts and ends sorted each on its own (no argsort, no permuted copies): a merged
        # interval ends at the i-th smallest end exactly where the next start lies beyond
        # it, as then the i + 1 earliest-ending intervals are the i + 1 earliest-starting
        # ones; touching intervals (start == end) merge.
        if owned:
            s.sort()
            e.sort()
        else:
            s, e = np.sort(s), np.sort(e)
        last = np.empty(s.size, dtype=bool)
        np.greater(s[1:], e[:-1], out=last[:-1])
        last[-1] = True
        if last.all():  # nothing merges (e.g. the kernels of one stream)
            return cls._trusted(s, e)
        first = np.empty(s.size, dtype=bool)
        first[0] = True
        first[1:] = last[:-1]
        return cls._trusted(s[first], e[last])

    @classmethod
    def _trusted(cls, starts: Int64Array, ends: Int64Array) -> IntervalSet:
        """A set of fresh int64 arrays already sorted and merged: frozen in place, not copied."""
        starts.setflags(write=False)
        ends.setflags(write=False)
        out = object.__new__(cls)
        object.__setattr__(out, "starts", starts)
        object.__setattr__(out, "ends", ends)
        return out

    def __len__(self) -> int:
        return int(self.starts.size)


def union(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Points covered by ``a`` or ``b``."""
    return IntervalSet.from_arrays(
        np.concatenate([a.starts, b.starts]), np.concatenate([a.ends, b.ends]), owned=True
    )


def union_all(sets: list[IntervalSet]) -> IntervalSet:
    """Points covered by any of ``sets`` (empty for an empty list)."""
    if not sets:
        return IntervalSet.empty()
    return IntervalSet.from_arrays(
        np.concatenate([s.starts for s in sets]),
        np.concatenate([s.ends for s in sets]),
        owned=True,
    )


def intersection(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Points covered by both ``a`` and ``b``."""
    if len(a) > len(b):
        a, b = b, a  # binary search with the smaller set's bounds
    if not len(a):
        return IntervalSet.empty()
    # The intervals of b that meet a's i-th: those ending after its start (from lo[i]) and
    # starting before its end (up to hi[i]). Each meeting pair gives one interval of the
    # result, and as both sets are disjoint and non-touching, these come out sorted,
    # disjoint and non-touching: no sort and no merge, memory in pairs that meet.
    lo = np.searchsorted(b.ends, a.starts, side="right")
    count = np.searchsorted(b.starts, a.ends, side="left")
    count -= lo
    total = int(count.sum())
    if total == 0:
        return IntervalSet.empty()
    offset = np.cumsum(count)
    offset -= count
    lo -= offset
    which_b = np.repeat(lo, count)
    del lo, offset
    which_b += np.arange(total)
    which_a = np.repeat(np.arange(a.starts.size), count)
    del count
    starts = a.starts[which_a]
    np.maximum(starts, b.starts[which_b], out=starts)
    ends = a.ends[which_a]
    np.minimum(ends, b.ends[which_b], out=ends)
    return IntervalSet._trusted(starts, ends)


def difference(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Points covered by ``a`` but not by ``b``."""
    if not len(a) or not len(b):
        return a
    # a minus b is a and the gaps of b, from the least int64 to the greatest (an end is at
    # most that, so a holds no point at or past it).
    bound = np.iinfo(np.int64)
    gap_starts = np.concatenate([[bound.min], b.ends])
    gap_ends = np.concatenate([b.starts, [bound.max]])
    if gap_ends[0] == gap_starts[0] or gap_ends[-1] == gap_starts[-1]:  # an empty gap
        keep = gap_ends > gap_starts
        gap_starts, gap_ends = gap_starts[keep], gap_ends[keep]
    return intersection(a, IntervalSet._trusted(gap_starts, gap_ends))


def total_length(a: IntervalSet) -> int:
    """Total covered length (ns) as a Python int."""
    return int(np.sum(a.ends - a.starts, dtype=np.int64))


def clip(a: IntervalSet, lo: int, hi: int) -> IntervalSet:
    """The part of ``a`` inside the window [lo, hi).

    Raises:
        ValueError: If ``hi < lo``.
    """
    if hi < lo:
        raise ValueError(f"clip window must have hi >= lo, got [{lo}, {hi})")
    # Binary search for the intervals that reach into the window (end > lo and
    # start < hi), then clamp the first and last of them to the window.
    i0 = int(np.searchsorted(a.ends, lo, side="right"))
    i1 = int(np.searchsorted(a.starts, hi, side="left"))
    if i1 <= i0 or hi == lo:
        return IntervalSet.empty()
    starts = np.maximum(a.starts[i0:i1], lo)
    ends = np.minimum(a.ends[i0:i1], hi)
    return IntervalSet(starts=starts, ends=ends)
