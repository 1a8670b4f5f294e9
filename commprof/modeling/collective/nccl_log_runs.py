"""The records of an nccl-tests / rccl-tests log: its rows, lines skipped, runs and the file.

:mod:`commprof.modeling.collective.nccl_log` reads a log into these;
:mod:`commprof.modeling.collective.nccl_log_collective` names a run's collective from its table
(:attr:`Run.candidates`) and checks a log against the collective asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One message size of a run."""

    num_bytes: int
    """``size`` column (bytes)."""
    dtype: str
    """``type`` column (``float``, ``bfloat16``, ``int8`` ...)."""
    redop: str | None
    """``redop`` column (``sum``, ``none`` ...); None where the layout has none (broadcast)."""
    time_us: float
    """Out-of-place time (us)."""
    algbw_gbps: float
    """Out-of-place algbw (GB/s)."""
    busbw_gbps: float
    """Out-of-place busbw (GB/s)."""
    inplace_time_us: float | None
    """In-place time (us); None where the log has no in-place half."""
    line: int
    """Line number in the file (1-based); in nccl-tests' JSON output, the record's place in
    ``results`` (1-based)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Skipped:
    """A line of a table that no row came from, and why."""

    line: int
    """Line number in the file (1-based)."""
    kind: str
    """``0 bytes``, ``#wrong`` (wrong results: not a measurement to fit) or ``broken`` (a log
    line interleaved with the row)."""
    text: str
    """The line as read (prefixes stripped)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """One run of a test: a header, its table and (if it finished) its footer."""

    index: int
    """1-based position of the run in its file (``--run K``)."""
    header_line: int
    """Line of the table's column header."""
    collective: str | None
    """From ``Collective test starting: X_perf`` (or ``concluded``) where printed, else the one
    collective of ``candidates``, else None."""
    world_size: int | None
    """Ranks (``#  Rank`` lines of this run); None where the log lists none."""
    num_hosts: int | None
    """Distinct hosts of those ranks; None where the log lists none or some were cut (``...``)."""
    rows: tuple[Row, ...]
    """The rows kept, in file order."""
    skipped: tuple[Skipped, ...]
    """Table lines read but not kept (0-byte rows, rows broken or with wrong results)."""
    complete: bool
    """The ``# Avg bus bandwidth`` footer was printed; False for a run cut short or an excerpt."""
    candidates: tuple[str, ...] = ()
    """The collectives the table itself fits
    (:func:`~commprof.modeling.collective.nccl_log_collective.table_collectives`); () where it
    shows too little to tell."""
    evidence: str = ""
    """What the table shows, said aloud (``busbw/algbw 1.750 at 8 ranks, redop sum, root -1``)."""
    inferred: bool = False
    """``collective`` was inferred from the table: the header does not name it."""

    def describe(self) -> str:
        """One line: ``run 2 (line 40): all_reduce, 16 ranks, 8 B..8589934592 B, 31 rows``."""
        sizes = f"{self.rows[0].num_bytes} B..{self.rows[-1].num_bytes} B" if self.rows else "-"
        ranks = "ranks not listed" if self.world_size is None else f"{self.world_size} ranks"
        name = self.collective or "collective not named"
        if self.inferred:
            name += " (inferred from the table)"
        elif self.collective is None and self.candidates:
            name += f" (the table fits {' or '.join(self.candidates)})"
        footer = "" if self.complete else ", no footer"
        return f"run {self.index} (line {self.header_line}): {name}, {ranks}, {sizes}, " + (
            f"{len(self.rows)} rows{footer}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class NcclTestsLog:
    """One file of nccl-tests output: one run or several."""

    source: str
    """The file."""
    runs: tuple[Run, ...]
    """Its runs, in file order (at least one)."""
    set_aside: tuple[Run, ...] = ()
    """Runs of other collectives than the one asked for, left out by :func:`read_logs`
    (``nccl_log``)."""

    @property
    def run(self) -> Run:
        """The only run; a file of several must be narrowed first (:meth:`select`)."""
        if len(self.runs) != 1:
            listed = "; ".join(r.describe() for r in self.runs)
            raise ValueError(
                f"{self.source}: holds {len(self.runs)} runs ({listed}); pick one with --run K "
                "or use each with --run all"
            )
        return self.runs[0]

    @property
    def rows(self) -> tuple[Row, ...]:
        """The rows of the only run."""
        return self.run.rows

    @property
    def world_size(self) -> int | None:
        """The ranks of the only run."""
        return self.run.world_size

    @property
    def num_hosts(self) -> int | None:
        """The hosts of the only run."""
        return self.run.num_hosts

    @property
    def collective(self) -> str | None:
        """The collective of the only run."""
        return self.run.collective

    def select(self, index: int) -> NcclTestsLog:
        """This file narrowed to its run ``index`` (1-based)."""
        if not 1 <= index <= len(self.runs):
            listed = "; ".join(r.describe() for r in self.runs)
            raise ValueError(
                f"{self.source}: --run {index}: the file holds {len(self.runs)} run(s) ({listed})"
            )
        return replace(self, runs=(self.runs[index - 1],))

    def split(self) -> list[NcclTestsLog]:
        """One log per run (the first says what was set aside)."""
        return [
            replace(self, runs=(r,), set_aside=self.set_aside if i == 0 else ())
            for i, r in enumerate(self.runs)
        ]
