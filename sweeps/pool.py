"""The driver's gangs of rank actors: reused by shape, reserved while the cluster has room,
started once their placement group is placed, dropped to make room or when anything in them
failed.

Placing never blocks the driver's loop: a new gang's placement group is reserved
(``commprof.actors.gang.reserve``) and looked at again on the loop's next passes, so a cluster
that is busy with other work makes a cell wait while the running cells are still watched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, remove_placement_group

from commprof.actors.gang import Gang, bundle_for, reserve, start_gang
from commprof.matrix import Cell

log = logging.getLogger(__name__)

GANG_START_TRIES = 3
"""Starts of a gang whose actors die while starting before the pool gives up."""
FIRST_LOOK_S = 1.0
"""How long a fresh reservation is waited for at once (an idle cluster places it in
milliseconds; a busy one leaves it to the loop's later passes)."""


@dataclass(eq=False, kw_only=True)
class Reservation:
    """A placement group asked for and not placed yet."""

    shape: tuple[int, str, str]
    group: PlacementGroup
    ready: Any
    """``group.ready()``, asked once."""
    placed: bool = False
    """Seen placed (its ref is then no longer waited on: it would wake the loop every pass)."""
    since: float = field(default_factory=time.monotonic)
    last_warned: float = field(default_factory=time.monotonic)


class GangPool:
    """Every gang the driver holds; a gang is busy while it runs a cell.

    Args:
        ready_timeout_s: how long a placed gang's actors may take to start; also how long a
            reservation waits before idle gangs are dropped in case they fragment it, and how
            often a waiting reservation is logged.
        env: the matrix's ``env`` section, set in every rank actor.
    """

    def __init__(self, *, ready_timeout_s: float, env: dict[str, str] | None = None) -> None:
        self.gangs: list[Gang] = []
        self.reserved: dict[tuple[int, str, str], Reservation] = {}
        self.created = 0
        self.ready_timeout_s = ready_timeout_s
        self._start_failures: dict[tuple[int, str, str], int] = {}
        self.env = env or {}

    def idle(self) -> list[Gang]:
        """Gangs that run nothing now."""
        return [g for g in self.gangs if not g.busy]

    def waiting(self) -> list[Any]:
        """The ready refs of reservations not seen placed yet (the loop waits on them too)."""
        return [r.ready for r in self.reserved.values() if not r.placed]

    def newly_placed(self) -> bool:
        """Whether a reservation was placed since the last look (marks it placed)."""
        pending = {r.ready: r for r in self.reserved.values() if not r.placed}
        if not pending:
            return False
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
        for ref in ready:
            pending[ref].placed = True
        return bool(ready)

    def keep_only(self, shapes: set[tuple[int, str, str]]) -> None:
        """Give up the reservations of shapes no cell waits for any more."""
        for shape in [s for s in self.reserved if s not in shapes]:
            self.cancel(shape)

    def acquire(self, cell: Cell, total: dict[str, float], *, may_reserve: bool) -> Gang | None:
        """A gang for ``cell``, marked busy: an idle one of its shape, else a new one.

        Idle gangs of other shapes are dropped where the new one needs their resources.

        Args:
            cell: the cell to run.
            total: the cluster's resources (``ray.cluster_resources()``).
            may_reserve: whether a new placement group may be asked for (the driver's limit on
                concurrent cells counts reservations too).

        Returns:
            The gang, or None where its placement group is not placed yet (ask again later).

        Raises:
            RuntimeError: a gang of the shape failed to start ``GANG_START_TRIES`` times.
        """
        shape = cell.gang_shape
        gang = next((g for g in self.idle() if g.shape == shape), None)
        if gang is None:
            reservation = self.reserved.get(shape)
            if reservation is None:
                if not may_reserve or not self._make_room(cell, total):
                    return None
                reservation = self._reserve(shape)
                ray.wait([reservation.ready], timeout=FIRST_LOOK_S)
            gang = self._start(reservation)
        if gang is not None:
            gang.busy = True
        return gang

    def cancel(self, shape: tuple[int, str, str]) -> None:
        """Give up a waiting reservation (its cells are not run)."""
        reservation = self.reserved.pop(shape, None)
        if reservation is not None:
            _remove(reservation.group)

    def release(self, gang: Gang) -> None:
        """The gang finished its cell well: it may serve the next one."""
        gang.busy = False

    def drop(self, gang: Gang) -> None:
        """Kill the gang and forget it."""
        gang.kill()
        gang.busy = False
        self.gangs = [g for g in self.gangs if g is not gang]

    def close(self) -> None:
        """Kill every gang and give up every reservation."""
        for gang in self.gangs:
            gang.kill()
        self.gangs.clear()
        for shape in list(self.reserved):
            self.cancel(shape)

    def _make_room(self, cell: Cell, total: dict[str, float]) -> bool:
        """Drop idle gangs until the cell's gang fits in ``total``; False where it cannot (then
        no gang is dropped)."""
        need = {k: v * cell.world_size for k, v in bundle_for(cell.device).items()}
        for key, amount in need.items():
            droppable = sum(g.bundle().get(key, 0) * g.world_size for g in self.idle())
            if self._held(key) - droppable + amount > total.get(key, 0):
                return False  # even without every idle gang it would not fit
        for key, amount in need.items():
            while self._held(key) + amount > total.get(key, 0):
                idle = self.idle()
                if not idle:
                    return False
                self.drop(idle[0])  # an idle gang of another shape goes
        return True

    def _held(self, key: str) -> float:
        gangs = sum(g.bundle().get(key, 0) * g.world_size for g in self.gangs)
        waiting = sum(bundle_for(s[1]).get(key, 0) * s[0] for s in self.reserved)
        return gangs + waiting

    def _reserve(self, shape: tuple[int, str, str]) -> Reservation:
        group = reserve(shape)
        reservation = Reservation(shape=shape, group=group, ready=group.ready())
        self.reserved[shape] = reservation
        return reservation

    def _start(self, reservation: Reservation) -> Gang | None:
        """Start the gang of a placed reservation; None while it waits to be placed."""
        shape = reservation.shape
        if not reservation.placed and not ray.wait([reservation.ready], timeout=0)[0]:
            self._still_waiting(reservation)
            return None
        del self.reserved[shape]
        try:
            gang = start_gang(
                shape, reservation.group, ready_timeout_s=self.ready_timeout_s, env=self.env
            )
        except (RayActorError, GetTimeoutError) as err:  # placed; an actor died or was slow
            failures = self._start_failures.get(shape, 0) + 1
            self._start_failures[shape] = failures
            log.warning(
                "starting a gang of shape %s failed (try %d): %s",
                shape,
                failures,
                str(err).splitlines()[0],
            )
            if failures >= GANG_START_TRIES:
                raise RuntimeError(
                    f"could not start a gang of shape {shape} in {GANG_START_TRIES} tries; "
                    "see the warnings above"
                ) from err
            return None  # the next pass reserves again
        self._start_failures.pop(shape, None)
        self.gangs.append(gang)
        self.created += 1
        return gang

    def _still_waiting(self, reservation: Reservation) -> None:
        now = time.monotonic()
        if now - reservation.last_warned < self.ready_timeout_s:
            return
        reservation.last_warned = now
        log.warning(
            "a gang of shape %s has waited %.0f s for free resources (the cluster is busy); "
            "still waiting",
            reservation.shape,
            now - reservation.since,
        )
        for other in self.idle():  # their bundles may fragment what a STRICT placement needs
            self.drop(other)


def _remove(group: PlacementGroup) -> None:
    try:
        remove_placement_group(group)
    except Exception as err:  # already gone with its cluster
        log.debug("removing a waiting placement group: %s", err)
