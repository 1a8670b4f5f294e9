"""The sweep driver: cells -> gangs of rank actors -> the dataset, resumably.

The loop keeps as many cells running as the cluster's free resources allow (one at a time where
the matrix asks for exclusive use of the links), reuses idle gangs of the right shape, writes
every finished attempt atomically (``commprof.results.write_attempt``), resubmits transient
failures up to the matrix's attempt limit and never reruns a cell that is complete in the
dataset. A cell is rejected as "cannot be placed" only where the cluster is too small for it
(``commprof.sweeps.placement``); on a busy cluster it waits. A lost cluster
(``commprof.sweeps.cluster``) or a stop request (SIGINT, SIGTERM) ends the loop: the running
attempts are abandoned, nothing is recorded for them, and a rerun resumes.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import ray

from commprof import results
from commprof.actors.execution import CellExecution, Outcome
from commprof.actors.gang import Gang, bundle_for
from commprof.attempts import FailurePolicy, Plan, plan_cells, resume_state
from commprof.lock import DatasetLock
from commprof.matrix import Cell, Matrix
from commprof.sweeps import placement
from commprof.sweeps.cluster import ClusterLost, ClusterWatch
from commprof.sweeps.guard import GuardPlan, probe_budgets
from commprof.sweeps.plan import select
from commprof.sweeps.pool import GangPool
from commprof.sweeps.progress import Progress

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05
"""How long the loop waits for any rank to report before it looks at timeouts again."""
RECHECK_S = 1.0
"""While cells wait for resources, how often the loop tries to place them again."""
LOST_SETTLE_S = 4.0
"""How long a transient failure (a rank died) waits for the cluster watch before it is
committed: a rank that died with its cluster must not count as the cell's failure."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DriverOptions:
    """What the user asked of this run of the driver."""

    out: Path
    """The dataset folder."""
    retry_failed: bool = False
    """Rerun only cells whose latest attempt failed, with a fresh attempt budget."""
    only: tuple[str, ...] = ()
    """Keep cells matching any of these terms (``key=value`` or a cell-id prefix)."""
    exclude: tuple[str, ...] = ()
    """Drop cells matching any of these terms."""
    max_concurrent: int | None = None
    """At most this many cells at once (None: as many as resources allow)."""
    gang_ready_timeout_s: float = 60.0
    """How long a placed gang's actors may take to start (a gang waiting for free resources
    waits as long as it takes, logging every this many seconds)."""
    faults: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Test-only fault injection by cell id (``RankActor.run``); a fault applies to the
    attempts listed under its ``attempts`` key, the first only by default."""

    def __post_init__(self) -> None:
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"--max-concurrent must be >= 1, got {self.max_concurrent}")


@dataclass(kw_only=True, slots=True)
class Summary:
    """Counts of a driver run and the cells' final statuses (mutable: the driver fills it)."""

    planned: int = 0
    """Cells this run set out to run or reject."""
    skipped: int = 0
    """Cells already complete (ok, or still rejected) in the dataset."""
    ok: int = 0
    """Cells that completed in this run."""
    failed: int = 0
    """Cells that failed in this run and will not be retried."""
    rejected: int = 0
    """Cells recorded as rejected in this run (memory guard, or cannot be placed)."""
    failed_earlier: int = 0
    """Cells whose earlier failure stands (deterministic, or out of attempts)."""
    attempts: int = 0
    """Cell attempts started in this run."""
    gangs_created: int = 0
    """Gangs of rank actors started (reuse keeps this low)."""
    wall_s: float = 0.0
    """Wall time of the run."""
    statuses: dict[str, str] = field(default_factory=dict)
    """Final status by cell id."""
    stopped_by: str | None = None
    """The signal that stopped the run early (``SIGINT``, ``SIGTERM``), if one did."""
    abandoned: int = 0
    """Attempts that were running when the run stopped early (not recorded; a rerun runs them)."""


__all__ = ["ClusterLost", "Driver", "DriverOptions", "Summary", "select"]


class Driver:
    """Runs the cells of a matrix into a dataset folder.

    The jobs are split: :func:`~commprof.attempts.plan_cells` decides what runs,
    :class:`~commprof.attempts.FailurePolicy` whether a failure runs again,
    :class:`~commprof.sweeps.pool.GangPool` holds the gangs, :class:`Progress` draws the line;
    this class runs the loop and commits every attempt (``commprof.results``).

    Args:
        matrix: the validated matrix.
        options: the run's options.
        stream: where progress goes (stderr by default).
        watch: the watch on the cluster's GCS (:func:`commprof.sweeps.cluster.ClusterWatch`);
            None trusts the cluster to stay.
        lock: the dataset folder's lock this process holds; every write to the folder runs
            under :meth:`~commprof.lock.DatasetLock.writing`, so a driver that lost the folder
            stops before writing (None: the caller keeps the folder to itself).
    """

    def __init__(
        self,
        matrix: Matrix,
        options: DriverOptions,
        stream: TextIO | None = None,
        *,
        watch: ClusterWatch | None = None,
        lock: DatasetLock | None = None,
    ):
        self.matrix = matrix
        self.watch = watch
        self.lock = lock
        self.stop_signal: int | None = None
        self.options = options
        self.pool = GangPool(ready_timeout_s=options.gang_ready_timeout_s, env=matrix.env)
        self.policy = FailurePolicy(max_attempts=matrix.run.max_attempts)
        self.progress = Progress(stream or sys.stderr)
        self.summary = Summary()
        self._guard: GuardPlan | None = None
        self._budget_base: dict[str, int] = {}
        self._unplaceable: set[tuple[int, str, str]] = set()
        self._placeable: dict[tuple[int, str, str], bool] = {}
        self._nodes: list[dict[str, float]] | None = None
        self._total: dict[str, float] = {}
        self._last_start_pass = 0.0
        self._last_wait_log = time.monotonic()

    @property
    def guard(self) -> GuardPlan:
        """Guard decisions with the budgets of the nodes that hold ranks."""
        if self._guard is None:
            nodes = [n for n in ray.nodes() if n.get("Alive")] if ray.is_initialized() else []
            # nodes that can hold a rank: a head that advertises no CPUs holds none
            workers = [n for n in nodes if n.get("Resources", {}).get("CPU", 0) > 0]
            self._guard = GuardPlan(
                self.matrix, num_nodes=max(1, len(workers)), node_budgets=probe_budgets(workers)
            )
        return self._guard

    def plan(self) -> Plan:
        """What this run does with each selected cell, from the dataset as it is now.

        Damaged attempts (files missing, unreadable or changed since their commit) are first
        moved to ``DIR/damaged/``; their cells run again.
        """
        with self._writing():  # setting damaged attempts aside moves files
            latest = resume_state(self.options.out)
        return plan_cells(
            select(self.matrix.cells, self.options.only, self.options.exclude),
            latest,
            lambda cell: self.guard.decide(cell).feasible,
            self.policy,
            retry_failed=self.options.retry_failed,
        )

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        """One write to the dataset folder, refused (LockLost) where the folder was taken over."""
        return self.lock.writing() if self.lock is not None else contextlib.nullcontext()

    # -- running -----------------------------------------------------------------------------

    def request_stop(self, signum: int) -> None:
        """Stop after the current pass: start nothing more, abandon the running attempts.

        Safe to call from a signal handler (it only sets a flag the loop reads).
        """
        self.stop_signal = signum

    def run(self) -> Summary:
        """Run every planned cell to completion (or its attempt limit), or until stopped.

        Raises:
            ClusterLost: the cluster's GCS stopped answering (nothing recorded for the running
                attempts; a rerun resumes).
        """
        started = time.monotonic()
        plan = self.plan()
        self._budget_base = plan.budget_base
        self.summary.skipped = len(plan.skipped)
        self.summary.failed_earlier = len(plan.failed_earlier)
        self.summary.statuses.update(plan.skipped)
        self.summary.statuses.update(plan.failed_earlier)
        for cell, attempt in plan.rejected:
            decision = self.guard.decide(cell)
            self._reject(cell, attempt, decision.explain(), decision.to_record())
        self.summary.planned = len(plan.todo) + len(plan.rejected)
        queue = collections.deque(plan.todo)
        running: list[CellExecution] = []
        lost = False
        try:
            self._loop(queue, running)
        except ClusterLost:
            lost = True  # its actors and groups went with it; calls to it would only block
            raise
        finally:
            self.summary.abandoned = len(running)
            if not lost:
                for ex in running:
                    ex.gang.kill()
                self.pool.close()
        if self.stop_signal is not None and (queue or running):  # a signal after the last cell
            self.summary.stopped_by = signal.Signals(self.stop_signal).name  # stopped nothing
        self.summary.gangs_created = self.pool.created
        self.summary.wall_s = time.monotonic() - started
        self.progress.show(self.summary, 0, 0, final=True)
        return self.summary

    def _loop(
        self, queue: collections.deque[tuple[Cell, int]], running: list[CellExecution]
    ) -> None:
        attempts: dict[str, int] = {}
        changed = True  # replan only when a cell finished: placing is a control-plane call
        while (queue or running) and self.stop_signal is None:
            if self.watch is not None:
                self.watch.check()
            if self.lock is not None:
                self.lock.check()  # taken over (presumed dead): stop, start nothing more
            room = len(running) < self._limit()
            if changed or (queue and room and self._placement_due(idle=not running)):
                self._start_ready(queue, running, attempts)
                changed = False
            waiting = [ref for ex in running for ref in ex.pending] + self.pool.waiting()
            if waiting:
                ray.wait(waiting, num_returns=1, timeout=POLL_INTERVAL_S)
            else:
                time.sleep(POLL_INTERVAL_S)
            for ex in list(running):
                outcome = ex.poll()
                if outcome is None:
                    continue
                if outcome.status != "ok":
                    self._confirm_cluster(outcome)  # a rank lost with the cluster is no failure
                running.remove(ex)
                attempt = attempts[ex.cell.cell_id]
                self._finish(ex.cell, ex.gang, ex.started_unix_s, outcome, attempt, queue)
                changed = True
            self.progress.show(self.summary, len(queue), len(running))

    def _placement_due(self, *, idle: bool) -> bool:
        """Cells wait for resources: try again once a reservation is placed, or now and then
        while none of this driver's cells runs (a finished one would trigger a pass anyway)."""
        if self.pool.progressed():
            return True
        due = idle and time.monotonic() - self._last_start_pass > RECHECK_S
        if due and not self.pool.reserved:
            self._log_waiting()
        return due

    def _log_waiting(self) -> None:
        now = time.monotonic()
        if now - self._last_wait_log > self.options.gang_ready_timeout_s:
            self._last_wait_log = now
            log.warning("cells wait for free resources (the cluster is busy: %s)", self._total)

    def _confirm_cluster(self, outcome: Outcome) -> None:
        """Before a failure is committed: raise ClusterLost if the cluster went with it.

        ``ray stop`` kills the raylet (and the ranks) first and the GCS last, so a rank's
        death is confirmed over the watch's detection window, not with one probe.
        """
        if self.watch is not None:
            settle_s = LOST_SETTLE_S if outcome.error_kind == "transient" else 0.0
            self.watch.confirm(settle_s)

    def _limit(self) -> int:
        if self.matrix.run.exclusive:
            return 1
        return self.options.max_concurrent or 1_000_000

    def _fits_cluster(self, cell: Cell) -> bool:
        """Whether the cluster, empty, could hold the cell's gang (asked once per shape)."""
        shape = cell.gang_shape
        if shape not in self._placeable:
            self._placeable[shape] = placement.fits(
                self._node_resources(), bundle_for(cell.device), cell.world_size, cell.placement
            )
        return self._placeable[shape]

    def _node_resources(self) -> list[dict[str, float]]:
        if self._nodes is None:
            self._nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        return self._nodes

    def _start_ready(
        self,
        queue: collections.deque[tuple[Cell, int]],
        running: list[CellExecution],
        attempts: dict[str, int],
    ) -> None:
        self._last_start_pass = time.monotonic()
        deferred = []
        blocked: set[tuple[int, str, str]] = set()  # shapes that got no gang in this pass
        total = ray.cluster_resources()  # one control-plane round trip per pass, not per cell
        if total != self._total:  # nodes came or went: decide placeability again
            self._total, self._nodes = total, None
            self._placeable.clear()
        while queue and len(running) < self._limit():
            cell, attempt = queue.popleft()
            if cell.gang_shape in self._unplaceable or not self._fits_cluster(cell):
                self._reject_unplaceable(cell, attempt)
                continue
            may_reserve = len(running) + len(self.pool.reserved) < self._limit()
            gang = (
                None
                if cell.gang_shape in blocked
                else self.pool.acquire(cell, total, may_reserve=may_reserve)
            )
            if gang is None:  # the cluster is busy: wait for free resources
                blocked.add(cell.gang_shape)
                deferred.append((cell, attempt))
                continue
            fault = self.options.faults.get(cell.cell_id)
            if fault is not None and attempt not in fault.get("attempts", (1,)):
                fault = None
            attempts[cell.cell_id] = attempt
            self.summary.attempts += 1
            try:
                running.append(
                    CellExecution(
                        cell,
                        gang,
                        timeout_s=self.matrix.run.cell_timeout_s,
                        pg_timeout_s=self.matrix.run.pg_timeout_s,
                        fault=fault,
                    )
                )
            except Exception as err:  # the gang broke before the cell started: a failed attempt
                failed = Outcome(
                    status="failed",
                    error=f"gang {gang.gang_id} could not start the cell: {err}",
                    error_kind="transient",
                )
                self._confirm_cluster(failed)
                self._finish(cell, gang, time.time(), failed, attempt, queue)
        queue.extendleft(reversed(deferred))
        self.pool.keep_only({cell.gang_shape for cell, _ in queue})

    def _reject_unplaceable(self, cell: Cell, attempt: int) -> None:
        """Record a cell whose gang the cluster could not hold even if it were empty."""
        bundle = bundle_for(cell.device)
        self._reject(
            cell,
            attempt,
            f"cannot be placed: needs {cell.world_size} ranks of {bundle} ({cell.placement}); "
            f"the cluster has {placement.describe(self._node_resources(), bundle)} such ranks. "
            "Add nodes or resources, or --exclude it.",
        )
        self._unplaceable.add(cell.gang_shape)
        self.pool.cancel(cell.gang_shape)

    # -- committing --------------------------------------------------------------------------

    def _reject(
        self, cell: Cell, attempt: int, why: str, guard: dict[str, Any] | None = None
    ) -> None:
        """Record a cell that is not run, with the arithmetic of why."""
        row = results.cell_row(
            cell,
            sweep=self.matrix.name,
            attempt=attempt,
            status="rejected",
            num_params=self.guard.num_params(cell),
            error=why,
            guard=guard,
            load_avg_1m=results.host_load_avg_1m(),
        )
        with self._writing():
            results.write_attempt(self.options.out, row, {})
        self.summary.rejected += 1
        self.summary.statuses[cell.cell_id] = "rejected"

    def _finish(
        self,
        cell: Cell,
        gang: Gang,
        started_unix_s: float,
        outcome: Outcome,
        attempt: int,
        queue: collections.deque[tuple[Cell, int]],
    ) -> None:
        """Commit an attempt's outcome; keep the gang if it succeeded, resubmit if allowed."""
        common: dict[str, Any] = {
            "sweep": self.matrix.name,
            "attempt": attempt,
            "num_params": self.guard.num_params(cell),
            "guard": self.guard.decide(cell).to_record(),
            "nodes": sorted({node for node, _ in gang.nodes}),
            "started_unix_s": started_unix_s,
            "wall_s": outcome.wall_s,
        }
        if outcome.status == "ok":
            self.pool.release(gang)
            with self._writing():
                results.commit_attempt(self.options.out, cell, per_rank=outcome.results, **common)
            self.summary.ok += 1
            self.summary.statuses[cell.cell_id] = "ok"
            self.progress.cell_done(outcome.wall_s)
            return
        self.pool.drop(gang)
        with self._writing():
            results.commit_attempt(
                self.options.out, cell, error=outcome.error, error_kind=outcome.error_kind, **common
            )
        used = attempt - self._budget_base.get(cell.cell_id, 0)
        retry = self.policy.retry(outcome.error_kind, used)
        log.warning(
            "cell %s attempt %d failed (%s)%s: %s",
            cell.cell_id,
            attempt,
            outcome.error_kind,
            "; resubmitting" if retry else "",
            outcome.error,
        )
        if retry:
            queue.append((cell, attempt + 1))
            return
        self.summary.failed += 1
        self.summary.statuses[cell.cell_id] = "failed"
