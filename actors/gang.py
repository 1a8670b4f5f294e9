"""Gangs: ``world_size`` rank actors in one placement group, reused across cells of one shape.

A gang's shape is (world size, device, placement strategy). A gang in which anything failed is
killed whole and its placement group removed; the next cell of that shape gets a new one.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from commprof.actors.rank_actor import RankActor

log = logging.getLogger(__name__)

PLACEMENT_READY_TIMEOUT_S = 60.0
"""How long a placed gang's actors may take to start and report where they run."""
ACTOR_NAMESPACE = "commprof"
"""Ray namespace of the driver; rank actors are named ``<driver>-gang<N>-rank<R>`` in it."""

_gang_ids = itertools.count()


_DRIVER_TAG = uuid.uuid4().hex[:8]
"""Distinguishes this driver's actor names from another driver's on the same cluster."""


@dataclass(eq=False)
class Gang:
    """A placement group and its rank actors."""

    shape: tuple[int, str, str]
    """(world size, device, placement strategy)."""
    group: PlacementGroup
    """The placement group holding one bundle per rank."""
    actors: list[Any]
    """Rank actor handles, in rank order."""
    gang_id: int
    """Sequence number of the gang in this driver (names its actors)."""
    nodes: list[tuple[str, str]] = field(default_factory=list)
    """(node id, IP) of each rank, filled in by :meth:`locate`."""
    busy: bool = False
    """Running a cell (set and cleared by the driver's gang pool)."""
    where: list[Any] = field(default_factory=list)
    """Each actor's ``node()`` call, asked when it was spawned: all resolve once every actor
    runs (:func:`spawn_gang`)."""

    @property
    def world_size(self) -> int:
        return self.shape[0]

    def bundle(self) -> dict[str, float]:
        """Resources of one rank: a GPU and a CPU on GPU cells, a CPU otherwise."""
        return bundle_for(self.shape[1])

    def locate(self, timeout_s: float = PLACEMENT_READY_TIMEOUT_S) -> None:
        """Ask each actor where it runs (also proves that every actor has started)."""
        self.nodes = ray.get(
            self.where or [a.node.remote() for a in self.actors], timeout=timeout_s
        )

    @property
    def single_node(self) -> bool:
        return len({node for node, _ in self.nodes}) == 1

    def local_ranks(self) -> list[int]:
        """Each rank's index among the gang's ranks on the same node."""
        seen: dict[str, int] = {}
        out = []
        for node, _ in self.nodes:
            out.append(seen.get(node, 0))
            seen[node] = out[-1] + 1
        return out

    def kill(self) -> None:
        """Kill every actor and free the placement group (idempotent)."""
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as err:  # an actor that is already gone is fine
                log.debug("kill of a rank actor of gang %d: %s", self.gang_id, err)
        self.actors = []
        try:
            remove_placement_group(self.group)
        except Exception as err:
            log.debug("removing placement group of gang %d: %s", self.gang_id, err)


def bundle_for(device: str) -> dict[str, float]:
    """Resources of one rank: one GPU on GPU cells, a CPU otherwise (docs/design.md, Data flow)."""
    return {"CPU": 1.0, "GPU": 1.0} if device == "cuda" else {"CPU": 1.0}


DEAD_RANK_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
"""Every rank: NCCL errors and timeouts abort the communicator and raise, so a rank whose peer
died fails within the process-group timeout, not after the NCCL watchdog's 10 to 30 minutes."""
GPU_RANK_ENV = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
"""GPU ranks: Ray leaves CUDA_VISIBLE_DEVICES alone; the rank takes its GPU by index
(:meth:`commprof.actors.rank_actor.RankActor.gpu_index`; ray-project/ray issue 61073)."""


def rank_env(device: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables of a rank actor: the defaults above, then the matrix's ``env``
    section (it may override ``TORCH_NCCL_ASYNC_ERROR_HANDLING``)."""
    return {**DEAD_RANK_ENV, **(GPU_RANK_ENV if device == "cuda" else {}), **(env or {})}


def reserve(shape: tuple[int, str, str]) -> PlacementGroup:
    """Ask the cluster for a placement group of ``shape``; returns at once (placing is async).

    ``group.ready()`` resolves once every bundle is placed; until then the group holds nothing,
    so a cluster that is busy keeps it waiting without blocking the caller.
    """
    world_size, device, strategy = shape
    return placement_group([bundle_for(device) for _ in range(world_size)], strategy=strategy)


def spawn_gang(
    shape: tuple[int, str, str], group: PlacementGroup, *, env: dict[str, str] | None = None
) -> Gang:
    """Start one rank actor per bundle of a placed ``group``; returns at once.

    The actors start in the background (a process, ``import torch``: seconds on a loaded
    machine); ``gang.where`` resolves once every one runs, then :meth:`Gang.locate` reads it.

    Args:
        shape: (world size, device, placement strategy).
        group: the placed placement group (:func:`reserve`).
        env: the matrix's ``env`` section, set in every rank actor (:func:`rank_env`).
    """
    world_size, device, _ = shape
    bundle = bundle_for(device)
    gang_id = next(_gang_ids)
    remote = ray.remote(RankActor)
    gang = Gang(shape=shape, group=group, actors=[], gang_id=gang_id)
    try:  # whatever fails from here, the placement group and the actors go with it
        for rank in range(world_size):
            bundle_slot = PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=rank
            )
            gang.actors.append(
                remote.options(
                    name=f"{_DRIVER_TAG}-gang{gang_id}-rank{rank}",
                    namespace=ACTOR_NAMESPACE,
                    num_cpus=bundle["CPU"],
                    num_gpus=bundle.get("GPU", 0),
                    max_restarts=0,
                    scheduling_strategy=bundle_slot,
                    runtime_env={"env_vars": rank_env(device, env)},
                ).remote()
            )
        gang.where = [actor.node.remote() for actor in gang.actors]
    except Exception:
        gang.kill()
        raise
    return gang


def start_gang(
    shape: tuple[int, str, str],
    group: PlacementGroup,
    *,
    ready_timeout_s: float,
    env: dict[str, str] | None = None,
) -> Gang:
    """:func:`spawn_gang`, then wait until every actor runs.

    Raises:
        ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError: an actor did not start
            in time, or died starting (the group and the actors are gone then).
    """
    gang = spawn_gang(shape, group, env=env)
    try:
        gang.locate(ready_timeout_s)
    except Exception:
        gang.kill()
        raise
    log.debug("gang %d of shape %s on nodes %s", gang.gang_id, shape, gang.nodes)
    return gang
