"""The collective model as a link: what ``estimate``, the step model and the report call.

:class:`ClusterLink` has the call shape of the ring fits (``RingFit.predict_ns(num_bytes,
world_size)`` in ``ring_fit``), so anything that takes a fit takes a cluster: each all-reduce of
``num_bytes`` on ``world_size`` ranks costs what :func:`collectives.predict` says NCCL would take
on that cluster (its algorithm and protocol chosen by size and scale, hierarchical across
nodes), optionally calibrated on the cluster's own nccl-tests logs. :func:`allreduce_time_ns` is
the same as one function.

Ranks fill whole nodes of the cluster (``Cluster.nodes_for``); one rank costs nothing (no
communication), as the ring model's ``2 (p - 1)`` terms give; a message of 0 bytes costs nothing
(NCCL returns at once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from commprof.modeling.collective.clusters import Cluster, load_cluster
from commprof.modeling.collective.collectives import NO_CALIBRATION, Calibration, predict


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterLink:
    """All-reduce times of a described cluster, in the ring fits' call shape."""

    cluster: Cluster
    """The topology (``clusters.load_cluster``)."""
    calibration: Calibration = NO_CALIBRATION
    """Scales fitted to the cluster's nccl-tests logs; the default is the description alone."""
    calibrated_on: tuple[str, ...] = ()
    """The logs the calibration was fitted on (empty: the description alone)."""

    def predict_ns(self, num_bytes: npt.ArrayLike, world_size: npt.ArrayLike) -> np.ndarray:
        """Predicted all-reduce time in nanoseconds (float64), broadcast shape of the inputs.

        Args:
            num_bytes: Message sizes in bytes (whole, >= 0).
            world_size: Ranks (>= 1; more than one node's GPUs must fill whole nodes).

        Returns:
            ``1000 * collectives.predict(...).time_us`` per element; 0 for one rank or 0 bytes.
        """
        sizes, ranks = np.broadcast_arrays(
            np.asarray(num_bytes, dtype=np.float64), np.asarray(world_size, dtype=np.int64)
        )
        if np.any(sizes < 0) or np.any(sizes != np.round(sizes)):
            raise ValueError("num_bytes must be whole numbers of bytes >= 0")
        if np.any(ranks < 1):
            raise ValueError(f"world_size must be >= 1, got {np.unique(ranks).tolist()}")
        out = np.zeros(sizes.shape, dtype=np.float64)
        for p in np.unique(ranks):
            where = (ranks == p) & (sizes > 0)
            if p == 1 or not where.any():
                continue
            rows = predict(
                self.cluster, int(p), sizes[where].astype(np.int64).tolist(),
                calibration=self.calibration,
            )  # fmt: skip
            out[where] = [1e3 * r.time_us for r in rows]
        return out

    def describe(self, world_size: int) -> str:
        """One line for output: the cluster, its nodes at ``world_size`` and the calibration."""
        nodes = self.cluster.nodes_for(world_size)
        how = (
            f"calibrated on {len(self.calibrated_on)} nccl-tests log(s)"
            if self.calibrated_on
            else "description alone"
        )
        return (
            f"cluster {self.cluster.name} ({world_size} GPUs on {nodes} node(s) of "
            f"{self.cluster.gpus_per_node}; NCCL's collective model, {how})"
        )

    # the Link protocol (commprof.modeling.collective.link)
    def label(self, world_size: int) -> str:
        """:meth:`describe`."""
        return self.describe(world_size)

    def interval(self) -> None:
        """None: the cluster model gives one time a call."""
        return None

    @property
    def backend(self) -> str:
        """``"nccl"``: the times are NCCL's on the cluster."""
        return "nccl"


def allreduce_time_ns(
    cluster: Cluster,
    world_size: int,
    num_bytes: npt.ArrayLike,
    calibration: Calibration = NO_CALIBRATION,
) -> np.ndarray:
    """All-reduce time in ns of each size on ``world_size`` ranks of ``cluster``.

    Args:
        cluster: The topology.
        world_size: Ranks.
        num_bytes: Message sizes in bytes.
        calibration: Fitted scales (default: the description alone).

    Returns:
        Times in nanoseconds (float64), the shape of ``num_bytes``.
    """
    return ClusterLink(cluster=cluster, calibration=calibration).predict_ns(num_bytes, world_size)


def cluster_link(name_or_path: str, world_size: int, nccl_tests: Sequence[str] = ()) -> ClusterLink:
    """The link of ``--cluster NAME|FILE`` at ``--world-size``, calibrated on ``nccl_tests`` logs
    of that cluster where given (``nccl_tests.calibrate``, all-reduce).

    Raises:
        ValueError: naming the flag: an unknown cluster, a world size that does not fit it, or a
            log that does not read or fit.
    """
    from commprof.modeling.collective.nccl_log import read_logs
    from commprof.modeling.collective.nccl_tests import calibrate

    cluster = load_cluster(name_or_path)
    if world_size < 2:
        raise ValueError(f"--world-size {world_size}: an all-reduce needs >= 2 ranks")
    cluster.nodes_for(world_size)  # the world size must fit the cluster: say so before anything
    if not nccl_tests:
        return ClusterLink(cluster=cluster)
    calibration = calibrate(cluster, read_logs(nccl_tests))
    return ClusterLink(cluster=cluster, calibration=calibration, calibrated_on=tuple(nccl_tests))
