"""The driver's progress line: counts, a bar and an ETA, redrawn on a terminal, one line per
change elsewhere (a log file stays short)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from commprof.sweeps.driver import Summary

BAR_WIDTH = 24
"""Characters of the progress bar."""


class Progress:
    """Shows a driver run's progress on ``stream``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.walls: list[float] = []
        self._last: tuple[int, int, int] | None = None

    def cell_done(self, wall_s: float) -> None:
        """A cell completed in ``wall_s`` (feeds the ETA)."""
        self.walls.append(wall_s)

    def show(self, s: Summary, queued: int, running: int, *, final: bool = False) -> None:
        """Draw the line for ``queued`` cells waiting and ``running`` running."""
        done = s.ok + s.failed + s.rejected
        eta = ""
        if self.walls and (queued or running):
            per_cell = sum(self.walls) / len(self.walls)
            eta = f" ETA {per_cell * (queued + running) / max(1, running):.0f}s"
        filled = BAR_WIDTH * done // s.planned if s.planned else BAR_WIDTH
        line = (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{s.planned} "
            f"ok {s.ok} failed {s.failed} rejected {s.rejected} running {running}{eta}"
        )
        key = (done, running, s.failed)
        if self.stream.isatty():
            self.stream.write("\r" + line + ("\n" if final else ""))
            self.stream.flush()
        elif key != self._last:  # the final line too: never the same line twice
            self.stream.write(line + "\n")
            self.stream.flush()
        self._last = key
