"""The collective model as a link: what ``estimate``, the step model and the report call.

:class:`ClusterLink` has the call shape of the ring fits (``RingFit.predict_ns(num_bytes,
world_size)`` in ``ring_fit``), so anything that takes a fit takes a cluster: each all-reduce of
``num_bytes`` on ``world_size`` ranks costs what :func:`fitted_model.predict` says NCCL would take
on that cluster (its algorithm and protocol chosen by size and scale, hierarchical across
nodes; past two nodes the network's loss at scale), optionally calibrated on the cluster's own
nccl-tests logs. :func:`allreduce_time_ns` is
the same as one function.

Ranks fill whole nodes of the cluster (``Cluster.nodes_for``); one rank costs nothing (no
communication), as the ring model's ``2 (p - 1)`` terms give; a message of 0 bytes costs nothing
(NCCL returns at once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from commprof.modeling.collective.calibration import calibrate
from commprof.modeling.collective.calibration_fit import DESCRIPTION, Fit
from commprof.modeling.collective.clusters import Cluster, load_cluster
from commprof.modeling.collective.fitted_model import predict
from commprof.modeling.collective.nccl_log import read_logs
from commprof.modeling.collective.nccl_log_collective import (
    check_collective,
    placement_summary,
    skipped_summary,
)
from commprof.modeling.collective.scale_rule import interval_basis


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterLink:
    """All-reduce times of a described cluster, in the ring fits' call shape."""

    cluster: Cluster
    """The topology (``clusters.load_cluster``)."""
    calibration: Fit = DESCRIPTION
    """Factors fitted to the cluster's nccl-tests logs (``calibration.calibrate``); the default
    is the description alone."""
    calibrated_on: tuple[str, ...] = ()
    """The logs the calibration was fitted on (empty: the description alone)."""
    log_notes: tuple[str, ...] = ()
    """What reading those logs left out, said aloud (``skipped_summary``): rows skipped, runs of
    other collectives set aside, a collective inferred from its table; and hosts that are not the
    whole nodes the fit takes (``placement_summary``)."""
    end: int | None = None
    """Which time :meth:`predict_ns` answers: None the central one, 0 the low and 1 the high end
    of its 80 % interval (:meth:`interval`)."""

    def predict_ns(self, num_bytes: npt.ArrayLike, world_size: npt.ArrayLike) -> np.ndarray:
        """Predicted all-reduce time in nanoseconds (float64), broadcast shape of the inputs.

        Args:
            num_bytes: Message sizes in bytes (whole, >= 0).
            world_size: Ranks (>= 1; more than one node's GPUs must fill whole nodes).

        Returns:
            ``1000 * fitted_model.predict(...).time_us`` per element (``time_us_low`` or
            ``time_us_high`` at an :attr:`end`); 0 for one rank or 0 bytes.
        """
        return self.interval_ns(num_bytes, world_size)[0 if self.end is None else 1 + self.end]

    def interval_ns(
        self, num_bytes: npt.ArrayLike, world_size: npt.ArrayLike
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Predicted time and its 80 % interval in ns (``fitted_model.predict``): (time, low,
        high), each the broadcast shape of the inputs; 0 for one rank or 0 bytes."""
        sizes, ranks = np.broadcast_arrays(
            np.asarray(num_bytes, dtype=np.float64), np.asarray(world_size, dtype=np.int64)
        )
        if np.any(sizes < 0) or np.any(sizes != np.round(sizes)):
            raise ValueError("num_bytes must be whole numbers of bytes >= 0")
        if np.any(ranks < 1):
            raise ValueError(f"world_size must be >= 1, got {np.unique(ranks).tolist()}")
        out = [np.zeros(sizes.shape, dtype=np.float64) for _ in range(3)]
        for p in np.unique(ranks):
            where = (ranks == p) & (sizes > 0)
            if p == 1 or not where.any():
                continue
            rows = predict(
                self.cluster, int(p), sizes[where].astype(np.int64).tolist(),
                fit=self.calibration,
            )  # fmt: skip
            out[0][where] = [1e3 * r.time_us for r in rows]
            out[1][where] = [1e3 * r.time_us_low for r in rows]
            out[2][where] = [1e3 * r.time_us_high for r in rows]
        return out[0], out[1], out[2]

    def interval_basis(self, world_size: int) -> str:
        """Where the interval comes from, for output."""
        nodes = self.cluster.nodes_for(world_size)
        return interval_basis(self.calibration, world_size, "all_reduce", nodes)

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

    def interval(self) -> tuple[ClusterLink, ClusterLink]:
        """The link at the low, then the high, end of the collective model's 80 % interval
        (``fitted_model.predict``'s ``time_us_low`` and ``time_us_high``)."""
        return replace(self, end=0), replace(self, end=1)

    @property
    def backend(self) -> str:
        """``"nccl"``: the times are NCCL's on the cluster."""
        return "nccl"


def allreduce_time_ns(
    cluster: Cluster,
    world_size: int,
    num_bytes: npt.ArrayLike,
    calibration: Fit = DESCRIPTION,
) -> np.ndarray:
    """All-reduce time in ns of each size on ``world_size`` ranks of ``cluster``.

    Args:
        cluster: The topology.
        world_size: Ranks.
        num_bytes: Message sizes in bytes.
        calibration: Fitted factors (default: the description alone).

    Returns:
        Times in nanoseconds (float64), the shape of ``num_bytes``.
    """
    return ClusterLink(cluster=cluster, calibration=calibration).predict_ns(num_bytes, world_size)


def cluster_link(
    name_or_path: str, world_size: int, nccl_tests: Sequence[str] = (), run: str | None = None
) -> ClusterLink:
    """The link of ``--cluster NAME|FILE`` at ``--world-size``, calibrated on ``nccl_tests`` logs
    of that cluster where given (``calibration.calibrate``, all-reduce); ``run`` (``--run K|all``)
    picks the run of each log (``nccl_log.read_logs``).

    Raises:
        ValueError: naming the flag: an unknown cluster, a world size that does not fit it, a
            ``--run`` without logs, or a log that does not read or fit (a file of several runs
            and no ``--run``, listing its runs).
    """
    if run is not None and not nccl_tests:
        raise ValueError(f"--run {run}: give the logs it picks from with --nccl-tests LOG ...")

    cluster = load_cluster(name_or_path)
    if world_size < 2:
        raise ValueError(f"--world-size {world_size}: an all-reduce needs >= 2 ranks")
    cluster.nodes_for(world_size)  # the world size must fit the cluster: say so before anything
    if not nccl_tests:
        return ClusterLink(cluster=cluster)
    logs = read_logs(nccl_tests, run, "all_reduce")
    named = {log.collective for log in logs if log.collective and not log.run.inferred}
    if collectives := sorted(named - {"all_reduce"}):
        raise ValueError(
            f"--nccl-tests: runs of {', '.join(collectives)} are not all_reduce; pick the "
            "all_reduce run with --run K"
        )
    for log in logs:  # a log its header does not name: its table must fit an all-reduce
        check_collective(log, "all_reduce")
    return ClusterLink(
        cluster=cluster,
        calibration=calibrate(cluster, logs),
        calibrated_on=tuple(nccl_tests),
        log_notes=tuple(
            note
            for log in logs
            for note in (skipped_summary(log), placement_summary(log, cluster.gpus_per_node))
            if note is not None
        ),
    )


def comm_interval(link: ClusterLink, sizes_bytes: Sequence[int], world_size: int) -> dict[str, Any]:
    """The 80 % interval of each bucket's all-reduce and of their total on ``link``, for
    ``estimate --cluster``'s output (JSON ``communication_interval``)."""
    sizes = np.asarray(sizes_bytes, dtype=np.float64)
    _, low, high = link.interval_ns(sizes, world_size)
    return {
        "total_comm_ns_low": round(float(low.sum())),
        "total_comm_ns_high": round(float(high.sum())),
        "allreduce_ns_low": [round(float(x)) for x in low],
        "allreduce_ns_high": [round(float(x)) for x in high],
        "basis": link.interval_basis(world_size),
    }


def interval_line(interval: dict[str, Any]) -> str:
    """One line for a table: the total's 80 % interval and its basis."""
    return (
        f"total communication 80 % interval {interval['total_comm_ns_low'] / 1e6:.3f} to "
        f"{interval['total_comm_ns_high'] / 1e6:.3f} ms ({interval['basis']})"
    )
