"""Which cells a driver run sets out to run, and the one rule for running a failed cell again.

Plain data in, plain data out: no Ray, no torch. The driver (``commprof.sweeps.driver``) reads
the dataset's latest statuses and the memory guard's decisions and hands them here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from commprof.matrix import Cell


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


def matches(cell: Cell, term: str) -> bool:
    """Does ``cell`` match a filter term: ``key=value`` on its config, else a cell-id prefix."""
    if "=" in term:
        key, _, value = term.partition("=")
        config = cell.config()
        if key not in config:
            raise ValueError(f"filter {term!r}: no cell key {key!r}; keys: {', '.join(config)}")
        return str(config[key]) == value
    return cell.cell_id.startswith(term)


def select(cells: tuple[Cell, ...], only: tuple[str, ...], exclude: tuple[str, ...]) -> list[Cell]:
    """Apply the --only / --exclude filters."""
    chosen = [c for c in cells if not only or any(matches(c, t) for t in only)]
    return [c for c in chosen if not any(matches(c, t) for t in exclude)]
