"""nccl-tests / rccl-tests output as input: the reader's names, and calibration of the model.

The reader is :mod:`commprof.modeling.collective.nccl_log` (logs as clusters print them: launcher
prefixes,
interleaved NCCL lines, several runs a file, 0-byte and wrong rows counted); its names are
re-exported here for the modules that read logs through this one.

Calibration (:func:`calibrate`) fits the three scales of
:class:`~commprof.modeling.collective.collectives.Calibration` to logs of one cluster by least
squares on
``log(predicted / measured)`` over the out-of-place times of sizes >= ``FIT_MIN_BYTES``; a scale
the logs cannot identify (the network's, from single-node logs) stays 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import least_squares

from commprof.modeling.collective.clusters import Cluster
from commprof.modeling.collective.collectives import (
    COLLECTIVES,
    CORRECTIONS,
    Calibration,
    Corrections,
    predict,
)
from commprof.modeling.collective.nccl_log import (  # noqa: F401 -- re-exported
    NcclTestsLog,
    Row,
    Run,
    log_world_size,
    parse_text,
    read_log,
    read_logs,
)

FIT_MIN_BYTES = 1 << 20
"""Smallest size calibration fits (1 MiB: gradient buckets are larger; below it latency noise of
a few microseconds dominates)."""
SCALE_BOUNDS = (0.1, 10.0)
"""Bounds of a fitted scale."""


def calibrate(
    cluster: Cluster,
    logs: Sequence[NcclTestsLog],
    collective: str = "all_reduce",
    *,
    min_bytes: int = FIT_MIN_BYTES,
    algorithms: Sequence[str] | None = None,
    nvls_correction: bool = False,
    corrections: Corrections = CORRECTIONS,
) -> Calibration:
    """Fit the model's scales to nccl-tests logs of ``cluster``.

    Least squares on ``log(predicted / measured)`` (relative error, so small and large sizes
    weigh alike) over every row >= ``min_bytes`` of every log. The network scale is fitted only
    where a log spans several nodes; otherwise it stays 1.0 (the logs say nothing of it).

    Args:
        cluster: The description to calibrate.
        logs: Logs of that cluster (any world sizes it allows).
        collective: The logs' collective.
        min_bytes: Smallest size fitted.
        algorithms: Restrict the algorithms as the runs did (``NCCL_ALGO``), or None.
        nvls_correction: Fit NVLS's own scale on NVLink SHARP clusters (the correction of
            ``Calibration.nvls_scale``); False: the ablation without it.
        corrections: The model's corrections the fit is made with (``collectives.Corrections``).

    Returns:
        The fitted calibration.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"--collective {collective!r}: choose one of {', '.join(COLLECTIVES)}")
    points: list[tuple[int, list[int], np.ndarray]] = []
    multi_node = False
    for log in logs:
        if log.collective is not None and log.collective != collective:
            raise ValueError(f"{log.source}: is a {log.collective} log, not {collective}")
        p = log_world_size(log)
        multi_node |= cluster.nodes_for(p) > 1
        kept = [r for r in log.rows if r.num_bytes >= min_bytes]
        if kept:
            points.append((p, [r.num_bytes for r in kept], np.array([r.time_us for r in kept])))
    if not points:
        raise ValueError(f"no row of {len(logs)} log(s) is >= {min_bytes} bytes; nothing to fit")
    names = ["intra_scale", "latency_scale"] + (["net_scale"] if multi_node else [])
    if nvls_correction and cluster.nvls:
        names.append("nvls_scale")

    def residuals(log_scales: np.ndarray) -> np.ndarray:
        cal = Calibration(**dict(zip(names, np.exp(log_scales).tolist(), strict=True)))
        out = []
        for p, sizes, measured in points:
            pred = np.array([r.time_us for r in predict(cluster, p, sizes, collective, cal,
                                                        algorithms, corrections)])  # fmt: skip
            out.append(np.log(pred / measured))
        return np.concatenate(out)

    bounds = (math.log(SCALE_BOUNDS[0]), math.log(SCALE_BOUNDS[1]))
    fit = least_squares(residuals, np.zeros(len(names)), bounds=bounds, diff_step=1e-3)
    return Calibration(**dict(zip(names, np.exp(fit.x).tolist(), strict=True)))
