"""The one failure policy and the plan of a run, as plain data (commprof.attempts)."""

from __future__ import annotations

from commprof.attempts import FailurePolicy, plan_cells
from commprof.matrix import Cell

POLICY = FailurePolicy(max_attempts=2)
A, B, C, D, E = (Cell(model="srn-100k", world_size=2, bucket_cap_mb=1, repeat=r) for r in range(5))
BIG = Cell(model="srn-100k", world_size=4, bucket_cap_mb=1)


def test_failure_policy_one_rule() -> None:
    assert POLICY.retry("transient", 1) and POLICY.retry("timeout", 1) and POLICY.retry(None, 0)
    assert not POLICY.retry("transient", 2)  # the budget is spent
    assert not POLICY.retry("deterministic", 0)  # it would fail the same way again


def test_plan_by_latest_status() -> None:
    latest = {
        A.cell_id: ("ok", 1, None),
        B.cell_id: ("failed", 1, "transient"),
        C.cell_id: ("failed", 1, "deterministic"),
        D.cell_id: ("rejected", 3, None),
    }
    plan = plan_cells([A, B, C, D, E, E], latest, lambda cell: cell is not D, POLICY)
    assert plan.skipped == {A.cell_id: "ok", D.cell_id: "rejected"}  # D: still too big
    assert plan.failed_earlier == {C.cell_id: "failed"}
    assert plan.todo == [(B, 2), (E, 1)] and not plan.rejected  # E once
    assert plan.budget_base == {B.cell_id: 0, E.cell_id: 0}


def test_plan_rejected_cell_that_fits_now_runs_with_a_full_budget() -> None:
    plan = plan_cells([A], {A.cell_id: ("rejected", 3, None)}, lambda cell: True, POLICY)
    assert plan.todo == [(A, 4)] and plan.budget_base == {A.cell_id: 3}


def test_retry_failed_touches_failed_cells_only_with_a_fresh_budget() -> None:
    latest = {A.cell_id: ("failed", 2, "deterministic"), B.cell_id: ("ok", 1, None)}
    plan = plan_cells([A, B, C], latest, lambda cell: True, POLICY, retry_failed=True)
    assert plan.todo == [(A, 3)] and plan.budget_base == {A.cell_id: 2}


def test_cells_of_one_gang_shape_run_together() -> None:
    plan = plan_cells([BIG, A, B], {}, lambda cell: True, POLICY)
    assert [cell.world_size for cell, _ in plan.todo] == [2, 2, 4]
