"""Which attempt of a cell runs next: the one failure policy, and a dataset folder's attempts
read for resuming (damaged ones set aside first).

``commprof sweep`` and ``commprof run`` both decide here, so a cell is retried, skipped or
reported as failed earlier by the same rule whichever command runs it. Plain data in, plain data
out: no torch, no Ray.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from commprof import results
from commprof.matrix import Cell

log = logging.getLogger("commprof.attempts")

Latest = dict[str, tuple[str, int, str | None]]
"""Per cell id: the status, number and error kind of its latest attempt (``damaged`` where the
latest was set aside)."""


def resume_state(root: str | Path) -> Latest:
    """The latest attempt of every cell of the dataset folder ``root``, for deciding what runs.

    Damaged attempts (files missing, unreadable or changed since their commit) are moved to
    ``DIR/damaged/`` first (:func:`commprof.results.set_aside_damaged`), each named in a warning.
    A cell with an ok attempt left stays complete, whatever was set aside (an older failed
    attempt's file damaged does not make it run again); a cell whose latest attempt was set
    aside reads ``damaged`` and runs again, numbered after it.
    """
    damaged = results.set_aside_damaged(root)  # before anything reads them
    latest = results.latest_status(root)
    for cell_id, (attempt, why) in damaged.items():
        status, kept, _ = latest.get(cell_id, ("", 0, None))
        if status == "ok":
            log.warning("cell %s attempt %d is damaged (%s); set aside (its ok attempt %d "
                        "stands)", cell_id, attempt, why, kept)  # fmt: skip
            continue
        log.warning("cell %s attempt %d is damaged (%s); set aside, it runs again", cell_id,
                    attempt, why)  # fmt: skip
        if attempt > kept:  # the latest attempt was set aside: the cell runs again after it
            latest[cell_id] = ("damaged", attempt, None)
    return latest


@dataclass(frozen=True, kw_only=True, slots=True)
class FailurePolicy:
    """Whether a failed cell runs again: the one place that decides it."""

    max_attempts: int
    """Attempts a cell's budget holds (``run.max_attempts`` of the matrix)."""

    def retry(self, error_kind: str | None, used: int) -> bool:
        """A cell that failed with ``error_kind`` after ``used`` attempts of its budget.

        An error that would repeat (``deterministic``: a configuration error, an out-of-memory)
        is never retried; any other while the budget lasts.
        """
        return error_kind != "deterministic" and used < self.max_attempts


@dataclass(kw_only=True, slots=True)
class Plan:
    """What a driver run does with each selected cell."""

    todo: list[tuple[Cell, int]] = field(default_factory=list)
    """Cells to run, each with its next attempt number, cells of one gang shape together."""
    rejected: list[tuple[Cell, int]] = field(default_factory=list)
    """Cells the guard rejects that are not recorded as rejected yet, with the attempt number."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Cells complete in the dataset (ok, or still rejected), by id, with that status."""
    failed_earlier: dict[str, str] = field(default_factory=dict)
    """Cells whose earlier failure stands (would repeat, or out of attempts), by id."""
    budget_base: dict[str, int] = field(default_factory=dict)
    """Per cell to run: attempts that do not count against its budget (earlier rejections, or
    every earlier attempt under ``--retry-failed``)."""


def plan_cells(
    cells: list[Cell],
    latest: Mapping[str, tuple[str, int, str | None]],
    feasible: Callable[[Cell], bool],
    policy: FailurePolicy,
    *,
    retry_failed: bool = False,
) -> Plan:
    """Decide what to do with each cell.

    Args:
        cells: the selected cells (a repeated cell id counts once).
        latest: the dataset's latest ``(status, attempt, error kind)`` by cell id; status
            ``damaged`` for a cell whose latest attempt was set aside as damaged.
        feasible: the memory guard's verdict on a cell.
        policy: the failure policy.
        retry_failed: rerun only failed cells, with a fresh attempt budget.

    Returns:
        The plan. Rejected cells are decided again (budgets may have changed); one still
        rejected is skipped, not written again.
    """
    plan = Plan()
    for cell in dict.fromkeys(cells):
        status, attempt, kind = latest.get(cell.cell_id, ("", 0, None))
        ok = feasible(cell)
        if status == "ok" or (status == "rejected" and not ok):
            plan.skipped[cell.cell_id] = status
            continue
        if status == "failed":
            if not (retry_failed or policy.retry(kind, attempt)):
                plan.failed_earlier[cell.cell_id] = status
                continue
        elif retry_failed:
            continue  # --retry-failed touches failed cells only
        (plan.todo if ok else plan.rejected).append((cell, attempt + 1))
        # a rejected cell never ran; a damaged one's files were set aside: both start afresh
        fresh = retry_failed or status in ("rejected", "damaged")
        plan.budget_base[cell.cell_id] = attempt if fresh else 0
    # Cells of one shape together (stable otherwise): a gang serves them all in a row instead
    # of being dropped and rebuilt when shapes alternate on a full cluster.
    plan.todo.sort(key=lambda item: item[0].gang_shape)
    return plan
