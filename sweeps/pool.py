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

from commprof.actors.gang import Gang, bundle_for, reserve, spawn_gang
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
    gang: Gang | None = None
    """The gang spawned in the placed group, its actors still starting."""
    spawned: float = 0.0
    """When the gang was spawned (``time.monotonic``)."""
    patience_s: float = 0.0
    """How long its actors may take to start, from ``spawned``: ``ready_timeout_s``, doubled
    at each warning while none of them died (``GANG_START_TRIES`` periods at most)."""
    slow_warnings: int = 0
    """Warnings given that its actors are still starting."""
    since: float = field(default_factory=time.monotonic)
    last_warned: float = field(default_factory=time.monotonic)


class GangPool:
    """Every gang the driver holds; a gang is busy while it runs a cell.

    Args:
        ready_timeout_s: how long a placed gang's actors may take to start before a warning
            (the wait then doubles while none died: ``_still_starting``); also how long a
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
        """What the loop waits on for the reservations: placement, then the actors' start."""
        refs = []
        for r in self.reserved.values():
            refs.extend(r.gang.where if r.gang is not None else [] if r.placed else [r.ready])
        return refs

    def progressed(self) -> bool:
        """Whether a reservation was placed, or its gang's actors all started, since the last
        look (a placed one is marked so)."""
        refs = self.waiting()
        if not refs:
            return False
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        moved = False
        for r in self.reserved.values():
            if r.gang is not None:
                moved |= all(ref in done for ref in r.gang.where)
            elif not r.placed and r.ready in done:
                r.placed = moved = True
        return moved

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
        if reservation is not None and reservation.gang is not None:
            reservation.gang.kill()  # its actors started or starting, and the group
        elif reservation is not None:
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
        """The gang of a reservation once it is placed and its actors run; None before that.

        Never blocks: the group is placed, then the actors start, while the loop goes on.
        """
        shape = reservation.shape
        if not reservation.placed:
            if not ray.wait([reservation.ready], timeout=0)[0]:
                self._still_waiting(reservation)
                return None
            reservation.placed = True
        if reservation.gang is None:
            reservation.gang = spawn_gang(shape, reservation.group, env=self.env)
            reservation.spawned = time.monotonic()
            reservation.patience_s = self.ready_timeout_s
        gang = reservation.gang
        started, _ = ray.wait(gang.where, num_returns=len(gang.where), timeout=0)
        try:
            if len(started) < len(gang.where) and not self._still_starting(reservation, started):
                waited = time.monotonic() - reservation.spawned
                raise GetTimeoutError(f"actors did not start within {waited:.0f} s")
            if len(started) < len(gang.where):
                return None
            gang.locate()  # resolved: returns at once, or raises for an actor that died
        except (RayActorError, GetTimeoutError) as err:
            self._start_failed(reservation, err)
            return None  # the next pass reserves again
        del self.reserved[shape]
        self._start_failures.pop(shape, None)
        self.gangs.append(gang)
        self.created += 1
        return gang

    def _still_starting(self, reservation: Reservation, started: list[Any]) -> bool:
        """Whether to wait on for a gang whose actors have not all started.

        An actor that died raises here (``RayActorError``). Past its patience, none having
        died, the patience doubles, with a warning, up to ``GANG_START_TRIES`` periods: a
        loaded host starts a fresh actor slowly, and killing it to spawn another would only
        start over (on a 2-core host under a 2x CPU hog two rank actors took over 60 s).
        """
        if started:  # raises for an actor that died: the rest need not be awaited
            ray.get(started, timeout=0)
        waited = time.monotonic() - reservation.spawned
        if waited <= reservation.patience_s:
            return True
        if reservation.slow_warnings + 1 >= GANG_START_TRIES:
            return False
        reservation.slow_warnings += 1
        reservation.patience_s += self.ready_timeout_s * 2**reservation.slow_warnings
        assert reservation.gang is not None
        log.warning(
            "a gang of shape %s: %d of %d actors started in %.0f s (a loaded host starts them "
            "slowly); waiting up to %.0f s in all",
            reservation.shape,
            len(started),
            len(reservation.gang.where),
            waited,
            reservation.patience_s,
        )
        return True

    def _start_failed(self, reservation: Reservation, err: Exception) -> None:
        shape = reservation.shape
        del self.reserved[shape]
        if reservation.gang is not None:
            reservation.gang.kill()  # the actors and the placement group
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
