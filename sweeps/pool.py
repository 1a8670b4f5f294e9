"""The driver's gangs of rank actors: reused by shape, started when resources allow, dropped
to make room or when anything in them failed."""

from __future__ import annotations

import logging

from ray.exceptions import GetTimeoutError, RayActorError

from commprof.actors.gang import Gang, PlacementTimeout, bundle_for, create_gang
from commprof.matrix import Cell

log = logging.getLogger(__name__)

GANG_START_TRIES = 3
"""Starts of a gang whose actors die while starting before the pool gives up."""


class GangPool:
    """Every gang the driver holds; a gang is busy while it runs a cell.

    Args:
        ready_timeout_s: how long a new gang may take to be placed and started.
        env: the matrix's ``env`` section, set in every rank actor.
    """

    def __init__(self, *, ready_timeout_s: float, env: dict[str, str] | None = None) -> None:
        self.gangs: list[Gang] = []
        self.created = 0
        self.ready_timeout_s = ready_timeout_s
        self.env = env or {}

    def idle(self) -> list[Gang]:
        """Gangs that run nothing now."""
        return [g for g in self.gangs if not g.busy]

    def acquire(self, cell: Cell, total: dict[str, float]) -> Gang | None:
        """A gang for ``cell``, marked busy: an idle one of its shape, else a new one.

        Idle gangs of other shapes are dropped where the new one needs their resources.

        Args:
            cell: the cell to run.
            total: the cluster's resources (``ray.cluster_resources()``).

        Returns:
            The gang, or None where it cannot be placed now.

        Raises:
            RuntimeError: a gang of the shape failed to start ``GANG_START_TRIES`` times.
        """
        gang = next((g for g in self.idle() if g.shape == cell.gang_shape), None)
        if gang is None and self._make_room(cell, total):
            gang = self._start(cell)
        if gang is not None:
            gang.busy = True
        return gang

    def release(self, gang: Gang) -> None:
        """The gang finished its cell well: it may serve the next one."""
        gang.busy = False

    def drop(self, gang: Gang) -> None:
        """Kill the gang and forget it."""
        gang.kill()
        gang.busy = False
        self.gangs = [g for g in self.gangs if g is not gang]

    def close(self) -> None:
        """Kill every gang."""
        for gang in self.gangs:
            gang.kill()
        self.gangs.clear()

    def _make_room(self, cell: Cell, total: dict[str, float]) -> bool:
        """Drop idle gangs until the cell's gang fits in ``total``; False where it cannot."""
        for key, amount in bundle_for(cell.device).items():
            while self._held(key) + amount * cell.world_size > total.get(key, 0):
                idle = self.idle()
                if not idle:
                    return False
                self.drop(idle[0])  # an idle gang of another shape goes
        return True

    def _held(self, key: str) -> float:
        return sum(g.bundle().get(key, 0) * g.world_size for g in self.gangs)

    def _start(self, cell: Cell) -> Gang | None:
        for attempt in range(1, GANG_START_TRIES + 1):
            try:
                gang = create_gang(
                    cell.gang_shape, ready_timeout_s=self.ready_timeout_s, env=self.env
                )
            except (RayActorError, GetTimeoutError) as err:  # placed; an actor died or was slow
                log.warning(
                    "starting a gang of shape %s failed (try %d): %s",
                    cell.gang_shape,
                    attempt,
                    str(err).splitlines()[0],
                )
                continue
            except PlacementTimeout as err:
                idle = self.idle()
                if not idle:  # cannot be placed now: wait for running cells (or give up)
                    log.warning("%s", err)
                    return None
                for other in idle:  # their bundles may fragment what a STRICT placement needs
                    self.drop(other)
                continue
            self.gangs.append(gang)
            self.created += 1
            return gang
        raise RuntimeError(
            f"could not start a gang of shape {cell.gang_shape} in {GANG_START_TRIES} tries; "
            "see the warnings above"
        )
