"""The ranks of one attached run agree on how it ended before any collective at its end.

A DDP rank that runs one step more than the others waits in that step's all-reduce, and a rank
that ended its block waits in the first collective of the end (the microbenchmark's barrier):
both until the process group's timeout, 30 minutes by default. So at the end of a
``commprof.attach`` block no collective starts until every rank has said, through the process
group's store (``ProcessGroup.get_group_store``, the key-value store the ranks met through; no
collective), how many ``run.step()`` calls it made and how many gradient buckets its comm hook
was handed. The first rank to end writes its counts (``first_end``, a compare-and-set: the
first wins); every rank that ends compares its own with them.

- Equal everywhere: the end goes on (microbenchmark, gather, commit).
- A rank that ends with other counts writes a verdict naming both ranks and their counts.
- A rank still training sees, in a background thread (every ``PROGRESS_S``), that a rank ended:
  if it has already made more ``run.step()`` calls or handed more buckets than that rank did, it
  went past that rank's end and waits in a collective that rank will not join; it writes the
  verdict (and logs it: it may stay stuck until the ended ranks exit).
- A rank whose block ended by an exception writes a verdict naming it.

Every rank that sees a verdict raises :class:`RanksDisagree` with it before starting any
collective; the stuck rank's collective fails as soon as a peer's process exits (gloo: at once,
"Connection closed by peer"), and its block ends with the same verdict. Only the store's keys
are read in the background thread, off the hot path: a step costs nothing more.

Keys live under ``commprof/attach/<n>/`` where ``n`` counts this rank's sessions on the group
(the ranks create them in the same order, as they create DDP models).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("commprof.attach")

PROGRESS_S = 0.25
"""How often a rank's background thread looks at the store (and says it is alive)."""
POLL_S = 0.05
"""How often a rank that ended looks for the others' ends or a verdict."""
SILENCE_S = 30.0
"""A rank that has not said it is alive for this long is gone (died, or stopped)."""


class RanksDisagree(RuntimeError):
    """The ranks of one attached run did not end alike; the message names ranks and counts."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Counts:
    """What a rank did in its block; equal on every rank of a sound run."""

    steps: int
    """``run.step()`` calls."""
    buckets: int
    """Gradient buckets handed to the comm hook (DDP hands each bucket of each backward)."""

    def exceeds(self, other: Counts) -> bool:
        """Whether this rank did more of either than ``other`` did in all of its block."""
        return self.steps > other.steps or self.buckets > other.buckets

    def said(self) -> str:
        return f"{self.steps} run.step() calls and {self.buckets} gradient buckets"


class Board:
    """One rank's view of a session's keys in the store.

    Args:
        store: the process group's store.
        rank: this rank in the group.
        world_size: ranks in the group.
        counts: this rank's counts now (read from the background thread: plain ints).
    """

    def __init__(
        self, store: Any, *, rank: int, world_size: int, counts: Callable[[], Counts]
    ) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.counts = counts
        number = int(store.add(f"commprof/attach/sessions/{rank}", 1))
        self.prefix = f"commprof/attach/{number}"
        self.verdict: str | None = None
        """The verdict this rank learned (kept: the store may go with a peer's process)."""
        self._ended = False
        self._seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def start(self) -> None:
        """Start the background thread (after the block's first line: its cost is a store
        round trip every ``PROGRESS_S``)."""
        self._thread = threading.Thread(target=self._watch, name="commprof-attach", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * PROGRESS_S)
            self._thread = None

    # -- the background thread ------------------------------------------------------------------

    def _watch(self) -> None:
        beat = 0
        while not self._stop.wait(PROGRESS_S):
            try:
                if int(self.store.add(self._key("ended"), 0)) == 0:
                    continue  # everyone trains: nothing to say yet
                beat += 1
                self.store.set(self._key(f"alive/{self.rank}"), str(beat))
                if self._ended or self.verdict is not None:
                    continue
                first = self._first_end()
                mine = self.counts()
                if first is not None and mine.exceeds(first[1]):
                    self._decide(
                        f"rank {self.rank} went on past the end of rank {first[0]}: rank "
                        f"{first[0]} ended after {first[1].said()}, rank {self.rank} has made "
                        f"{mine.said()} and waits in a collective rank {first[0]} will not join"
                    )
                    log.error(
                        "commprof.attach (rank %d): %s; this rank stays in that collective until "
                        "the other ranks' processes exit",
                        self.rank,
                        self.verdict,
                    )
            except Exception:  # the store went with a peer's process: the job is ending
                continue

    # -- the end ----------------------------------------------------------------------------------

    def _first_end(self) -> tuple[int, Counts] | None:
        key = self._key("first_end")
        if not self.store.check([key]):
            return None
        record = json.loads(self.store.get(key))
        return int(record["rank"]), Counts(steps=record["steps"], buckets=record["buckets"])

    def _decide(self, verdict: str) -> str:
        """Write ``verdict`` unless another was written first; keep and return the one that
        stands."""
        text = self.store.compare_set(self._key("verdict"), "", verdict)
        self.verdict = text.decode() if isinstance(text, bytes) else str(text)
        return self.verdict

    def _read_verdict(self) -> str | None:
        key = self._key("verdict")
        if self.store.check([key]):
            text = self.store.get(key)
            self.verdict = text.decode() if isinstance(text, bytes) else str(text)
        return self.verdict

    def abandon(self, why: str) -> str | None:
        """This rank's block ended by an exception: tell the others (no wait).

        Returns:
            The verdict that stood before this rank's exception (its likely cause: this rank
            went past another's end, or a peer left first), or None where this rank's is the
            first word.
        """
        self._ended = True
        try:
            earlier = self._read_verdict()
            if earlier is not None:
                return earlier
            own = f"rank {self.rank} left its commprof.attach block with an exception ({why})"
            stands = self._decide(own)
            return None if stands == own else stands
        except Exception:  # the store is gone with a peer: what this rank knows
            return self.verdict

    def agree(self, mine: Counts, *, wait_s: float) -> None:
        """Say how this rank ended and wait until every rank has, or a verdict stands.

        Args:
            mine: this rank's counts at its block's end.
            wait_s: how long to wait for the other ranks at most (they may still be doing
                their own work inside the block).

        Raises:
            RanksDisagree: a verdict (the ranks' counts differ, a rank went past another's end,
                a rank left by an exception), a rank silent for ``SILENCE_S``, or ``wait_s``
                passed.
        """
        self._ended = True
        record = json.dumps({"rank": self.rank, "steps": mine.steps, "buckets": mine.buckets})
        first = self.store.compare_set(self._key("first_end"), "", record)
        first = json.loads(first.decode() if isinstance(first, bytes) else first)
        if (first["steps"], first["buckets"]) != (mine.steps, mine.buckets):
            theirs = Counts(steps=first["steps"], buckets=first["buckets"])
            self._decide(
                f"ranks disagree on the run: rank {first['rank']} ended after {theirs.said()}, "
                f"rank {self.rank} after {mine.said()}; every rank must run the same steps and "
                "call run.step() once at the end of each"
            )
        self.store.set(self._key(f"end/{self.rank}"), record)
        self.store.add(self._key("ended"), 1)
        started = time.monotonic()
        while True:
            # the count first: a rank writes its verdict before it counts itself ended, so once
            # every rank is counted, every verdict of an ending rank is there to read
            everyone = int(self.store.add(self._key("ended"), 0)) >= self.world_size
            verdict = self._read_verdict()
            if verdict is not None:
                raise RanksDisagree(f"commprof.attach: {verdict}")
            if everyone:
                return
            waited = time.monotonic() - started
            if waited > wait_s:
                missing = self._not_ended()
                raise RanksDisagree(
                    f"commprof.attach: rank(s) {missing} did not end their block within "
                    f"{wait_s:.0f} s of rank {self.rank}'s end ({mine.said()})"
                )
            if waited > SILENCE_S:
                self._check_alive()
            time.sleep(POLL_S)

    def _not_ended(self) -> list[int]:
        return [r for r in range(self.world_size) if not self.store.check([self._key(f"end/{r}")])]

    def _check_alive(self) -> None:
        """Raise where a rank that has not ended has said nothing for ``SILENCE_S``."""
        now = time.monotonic()
        seen = self._seen
        for r in self._not_ended():
            key = self._key(f"alive/{r}")
            beat = self.store.get(key).decode() if self.store.check([key]) else ""
            last = seen.get(r)
            if last is None or last[0] != beat:
                seen[r] = (beat, now)
            elif now - last[1] > SILENCE_S:
                self._decide(
                    f"rank {r} has not ended its block and has shown no sign of life for "
                    f"{now - last[1]:.0f} s (its process died or was stopped)"
                )

    def post_outcome(self, outcome: dict[str, Any]) -> None:
        """Rank 0: how the commit went, for every rank (no collective: the others poll)."""
        self.store.set(self._key("outcome"), json.dumps(outcome))

    def outcome(self, *, source: int) -> dict[str, Any]:
        """Wait for rank ``source``'s commit outcome while it shows signs of life.

        Raises:
            RanksDisagree: rank ``source`` has shown no sign of life for ``SILENCE_S``.
        """
        key, alive = self._key("outcome"), self._key(f"alive/{source}")
        last, since = "", time.monotonic()
        while not self.store.check([key]):
            beat = self.store.get(alive).decode() if self.store.check([alive]) else ""
            if beat != last:
                last, since = beat, time.monotonic()
            elif time.monotonic() - since > SILENCE_S:
                raise RanksDisagree(
                    f"commprof.attach: rank {source} stopped before it said whether it committed "
                    f"the run (no sign of life for {SILENCE_S:.0f} s)"
                )
            time.sleep(POLL_S * 4)
        return dict(json.loads(self.store.get(key)))
