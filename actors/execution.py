"""One attempt of one cell on a gang: start the ranks, watch them, stop them all on failure.

Failure handling, as Ray Train's worker-group poller does it: when any rank fails, the others
get a short grace period to report their own errors (a ring neighbour fails within
milliseconds), then the whole gang is killed, so no rank waits out a process-group timeout.
The ranks' errors are reported as one message grouped by text, and the failure is classified:
``deterministic`` failures (a bad configuration, an out-of-memory) would repeat and are not
retried blindly; ``transient`` ones (a lost actor or peer) and ``timeout`` are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from commprof.actors.gang import Gang
from commprof.actors.rank_actor import LOOPBACK
from commprof.matrix import Cell
from commprof.outcomes import classify_error_texts, group_errors

PEER_ERROR_GRACE_S = 2.0
"""After the first rank failed, how long the others may take to report before the kill."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What one attempt produced."""

    status: str
    """ok or failed."""
    results: list[dict[str, Any]] = field(default_factory=list)
    """Per rank, in rank order (ok only): records, traces, env, wall_s."""
    error: str | None = None
    """The ranks' errors grouped by text (failed only)."""
    error_kind: str | None = None
    """transient, deterministic or timeout (failed only)."""
    wall_s: float = 0.0
    """Attempt wall time, driver side."""


def classify(errors: dict[int, BaseException | str]) -> str:
    """Classify a failed attempt from its ranks' errors (see module docstring)."""
    return classify_error_texts(_texts(errors).values())


def _error_text(err: BaseException) -> str:
    if isinstance(err, RayTaskError):
        cause = err.cause
        return f"{type(cause).__name__}: {cause}"
    if isinstance(err, RayActorError):
        return f"rank actor died: {type(err).__name__}: {str(err).splitlines()[0]}"
    return f"{type(err).__name__}: {err}"


class CellExecution:
    """A running attempt. Call :meth:`poll` until it returns an :class:`Outcome`.

    Args:
        cell: the cell.
        gang: an idle gang of the cell's shape.
        timeout_s: the attempt's wall-clock limit.
        pg_timeout_s: the process-group timeout passed to the ranks.
        fault: test-only fault injection passed to the ranks (``RankActor.run``).
    """

    def __init__(
        self,
        cell: Cell,
        gang: Gang,
        *,
        timeout_s: float,
        pg_timeout_s: float,
        fault: dict[str, Any] | None = None,
    ) -> None:
        self.cell = cell
        self.gang = gang
        self.started = time.monotonic()
        self.started_unix_s = time.time()
        self.deadline = self.started + timeout_s
        self.timeout_s = timeout_s
        self.errors: dict[int, BaseException | str] = {}
        self.results: dict[int, dict[str, Any]] = {}
        self.first_error_at: float | None = None
        loopback = gang.single_node
        host = rendezvous_host(gang)
        port = ray.get(
            gang.actors[0].open_store.remote(host, cell.world_size, pg_timeout_s), timeout=30
        )
        local_ranks = gang.local_ranks()
        self.refs = [
            actor.run.remote(
                cell.config(),
                rank=rank,
                local_rank=local_ranks[rank],
                master_addr=host,
                master_port=port,
                timeout_s=pg_timeout_s,
                loopback=loopback,
                fault=fault,
            )
            for rank, actor in enumerate(gang.actors)
        ]
        self.rank_of = {ref: rank for rank, ref in enumerate(self.refs)}

    @property
    def pending(self) -> list[Any]:
        """Object refs of ranks that have not reported yet."""
        return [ref for ref, rank in self.rank_of.items() if rank not in self._reported]

    @property
    def _reported(self) -> set[int]:
        return set(self.results) | set(self.errors)

    def poll(self) -> Outcome | None:
        """Collect what the ranks reported; decide the outcome once there is one."""
        ready, _ = ray.wait(self.pending, num_returns=len(self.pending), timeout=0)
        for ref in ready:
            rank = self.rank_of[ref]
            try:
                self.results[rank] = ray.get(ref)
            except (RayTaskError, RayActorError, GetTimeoutError) as err:
                self.errors[rank] = err
                if self.first_error_at is None:
                    self.first_error_at = time.monotonic()
        now = time.monotonic()
        wall_s = now - self.started
        if len(self.results) == self.cell.world_size:
            return Outcome(
                status="ok", results=[self.results[r] for r in range(len(self.refs))], wall_s=wall_s
            )
        if self.first_error_at is not None and (
            len(self._reported) == self.cell.world_size
            or now - self.first_error_at > PEER_ERROR_GRACE_S
        ):
            kind = classify(self.errors)
            return self._fail(group_errors(_texts(self.errors)), kind, wall_s)
        if now > self.deadline:
            silent = [r for r in range(self.cell.world_size) if r not in self._reported]
            message = f"cell timed out after {self.timeout_s:.0f} s; ranks {silent} never reported"
            if self.errors:
                message += "; " + group_errors(_texts(self.errors))
            return self._fail(message, "timeout", wall_s)
        return None

    def _fail(self, message: str, kind: str, wall_s: float) -> Outcome:
        self.gang.kill()  # never reuse a gang in which anything failed
        return Outcome(status="failed", error=message, error_kind=kind, wall_s=wall_s)


def rendezvous_host(gang: Gang) -> str:
    """Where the ranks meet: rank 0's node address (never the driver's), loopback on one node
    (gloo talks over ``lo`` there; docs/design.md, Measured facts)."""
    return LOOPBACK if gang.single_node else gang.nodes[0][1]


def _texts(errors: dict[int, BaseException | str]) -> dict[int, str]:
    return {rank: e if isinstance(e, str) else _error_text(e) for rank, e in errors.items()}
