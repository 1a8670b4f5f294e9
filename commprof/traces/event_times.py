"""Event times: float-microsecond ``ts`` and ``dur`` taken as read, then converted to int64 ns
starts and ends a block at a time, and checked.

ts and dur are float microseconds in the file, converted and checked a block of events at a time
with ``np.rint(us * 1000)`` (docs/design.md, Definitions), so no float column of the whole trace
is ever alive. A missing, negative or absurd value, or an end past what int64 nanoseconds hold,
makes the trace corrupt (:meth:`EventTimes.check`); an event the profiler wrote unfinished
(:func:`unfinished_events`) is marked, to be dropped and counted.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from commprof.traces.trace_rules import MAX_EVENT_DURATION_US, MAX_TS_US


def to_ns(us: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """``rint(us * 1000)`` as int64, with one float temporary."""
    scaled = us * 1000.0
    np.rint(scaled, out=scaled)
    return scaled.astype(np.int64)


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


class EventTimes:
    """The times of a trace's kept complete events: pending float us, then checked int64 ns.

    Args:
        source: The trace's name, for messages.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.ts_us, self.dur_us = array("d"), array("d")
        """ts and dur (float us) of the events not yet converted to ns (:meth:`flush`)."""
        self.start_ns, self.end_ns = array("q"), array("q")
        self.first_bad: tuple[int, Any, Any, Any] | None = None
        """Index, name, ts and dur of the first event whose ts or dur was None."""
        self.num_bad, self.num_beyond = 0, 0
        self.unfinished = array("b")
        """Per event so far: 1 if unfinished (:func:`unfinished_events`), dropped at the end."""
        self.bad: tuple[int, Any, Any, Any] | None = None
        self.beyond: tuple[int, Any, Any, Any] | None = None
        """First event with a missing, negative or absurd ts/dur; first ending past int64 ns."""

    def __len__(self) -> int:
        """Events taken so far."""
        return len(self.start_ns) + len(self.ts_us)

    def number(self, value: Any, key: str, e: dict[str, Any]) -> float:
        """A ts or dur (``key``) of the dict event ``e`` that ``array("d")`` refused, as a float."""
        # Slow path for values array("d") refuses: None becomes NaN (reported by
        # check() with its event), numeric strings are read as numbers (as numpy does).
        if value is None:
            if self.first_bad is None:
                self.first_bad = (len(self), e.get("name"), e.get("ts"), e.get("dur"))
            return float("nan")
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"{self.source}: non-numeric '{key}' in an event ({exc})") from exc

    def flush(self, name_at: Callable[[int], Any]) -> None:
        """Convert the pending float ts/dur to int64 ns starts and ends, and check them.

        Done per ``BLOCK_EVENTS`` events or more (chunks or dict events), so no float column
        of the whole trace, nor its conversion temporaries, is ever alive. Bad values are counted,
        the first one's details kept for :meth:`check`'s message (``name_at``: the name of the
        event at an index), and stored as 0.
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
                self.bad = _details(base, int(first_bad[0]), ts, dur, name_at)
                if self.first_bad is not None and self.first_bad[0] == self.bad[0]:
                    self.bad = self.first_bad
            if self.beyond is None and first_beyond.size:
                self.beyond = _details(base, int(first_beyond[0]), ts, dur, name_at)
            ts, dur = np.where(bad | beyond, 0.0, ts), np.where(bad | beyond, 0.0, dur)
        if unfinished.any():
            ts, dur = np.where(unfinished, 0.0, ts), np.where(unfinished, 0.0, dur)
        # us -> ns, rounded (docs/design.md, Definitions)
        start, end = to_ns(ts), to_ns(dur)
        end += start
        del ts, dur  # the views on the pending arrays, before those are dropped
        self.ts_us, self.dur_us = array("d"), array("d")
        self.start_ns.frombytes(start.data.cast("B"))
        self.end_ns.frombytes(end.data.cast("B"))

    def check(self) -> None:
        """Raise for the bad times :meth:`flush` found.

        Raises:
            ValueError: If a ts/dur is missing, negative or absurd (over
                ``MAX_EVENT_DURATION_US``), or an event ends past what int64 ns hold.
        """
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

    def unfinished_mask(self) -> npt.NDArray[np.bool_]:
        """Whether each event is unfinished (:func:`unfinished_events`), to be dropped.

        Raises:
            ValueError: If every event is.
        """
        unfinished = np.frombuffer(self.unfinished, dtype=np.int8).astype(bool)
        if unfinished.all():
            raise ValueError(
                f"{self.source}: every complete ('X') event is unfinished (dur -1, or ts 0 with "
                "an epoch time for dur): the profiler stopped before any op ended; re-export it"
            )
        return unfinished


def _details(
    base: int,
    i: int,
    ts: npt.NDArray[np.float64],
    dur: npt.NDArray[np.float64],
    name_at: Callable[[int], Any],
) -> tuple[int, Any, Any, Any]:
    """Index, name, ts and dur of the ``i``-th of the pending events (``base``: the first's
    index)."""
    return base + i, name_at(base + i), float(ts[i]), float(dur[i])
