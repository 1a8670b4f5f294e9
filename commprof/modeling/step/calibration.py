"""The step simulator calibrated from a dataset: one cell's timeline, the link fit, interference.

Calibration (:func:`calibrate_step`), from one cell that completed (any cap; the default 25
MiB is the usual one) and the interference factors (:func:`interference_from_rows`):

* Per measured (rank, step), the timing hook gives each bucket's hook entry ``ready_ns`` and its
  all-reduce ``[launch_ns, done_ns]``, the steps table backward's start (``start + forward``).
  Backward compute ran slower wherever an all-reduce was in flight, so the compute *work* done
  by time x is ``W(x) = x - sum over in-flight pieces of len * (1 - 1 / f)``, ``f`` the compute
  slowdown at the in-flight bucket's size. Bucket k's ready work is ``W(ready_k) - k L``, with
  ``L`` the hooks' own time (``launch_ns - ready_ns``, its lower quartile per bucket size
  fitted as ``a + b * bytes``: PyTorch's ``allreduce_hook`` divides the bucket by the world
  size on the training thread before the enqueue), which the simulator adds back for the
  buckets another cap makes. Per step the slowest rank, then the median over steps.
* Parameters inside a bucket are placed between the previous bucket's work and this one's by
  cumulative bytes (as ``timeline.parameter_ready_ns`` does), so any cap can be re-bucketed
  (``buckets.assign_buckets``, DDP's rules).
* ``other_ns`` is what backward spends after its last all-reduce and compute (DDP's finalize:
  copying the reduced buckets back into the gradients), forward and optimizer are medians: all
  three are taken as they are at every cap.
* The measured step and exposed communication (``measured_step_ns``, ``measured_exposed_ns``:
  per cell the median over its rank-steps, the exposed time the timing hook's, then the median
  over cells), which the two residuals of ``step_advice`` are fitted to.

Prediction (:func:`predict_step`, for a :class:`WhatIf` and the corrections' values as
:class:`Applied`): the link gives each bucket's idle all-reduce time at the world size asked for
(the ring model's p dependence), the stall (``step_corrections``) is added to each,
:func:`step_sim.simulate_step` plays the step. ``compute_scale`` multiplies the compute (forward,
backward, hooks, optimizer): 1 on another link or world size whose ranks have their own devices;
on one CPU host whose cores the ranks share, the ratio of the ranks' core shares
(:func:`cpu_share_scale`). ``service_scale`` multiplies the link's all-reduce times (stall
included): the same core share on one CPU host (gloo over loopback moves and reduces the bytes
on the ranks' cores). The exposed residual (times ``compute_scale``) is added to the exposed
communication and communication time (:func:`with_exposed_residual`), the host residual (times
``compute_scale``) to the step; ``step_corrections`` applies both in sample only, where the
scale is 1. Uncertainty: the same prediction with alpha and beta at the ends of their 95 %
intervals and the interference factors at their quartiles (:func:`predict_range`).

This module imports no torch and no ray.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from commprof.caps import cap_mb
from commprof.matrix import WORKLOAD_FIELDS
from commprof.modeling.buckets import ParamSize, assign_buckets
from commprof.modeling.collective.cost_model import nonnegative_line
from commprof.modeling.collective.dataset_fits import STEP_KEYS
from commprof.modeling.collective.link import Link
from commprof.modeling.step.simulator import (
    BACKEND_CHANNELS,
    NO_INTERFERENCE,
    Interference,
    StepPrediction,
    simulate_step,
)
from commprof.modeling.step.timeline import spread_to_parameters
from commprof.query import cell_steps, keys_of, ok_cell

ARM_COMM = "comm_under_compute"
ARM_COMPUTE = "compute_under_comm"


FACTOR_STATISTICS = ("mean", "median")
"""What an interference factor is made of: ``mean`` (``slowdown_mean``: mean loaded over mean
alone time, so stalls of a few iterations count as they count in a step's time) or ``median``
(``slowdown``: the median pair ratio)."""
INTERFERENCE_STATISTIC = "mean"
"""The statistic the step model's factors are made of (its spec, ``step_spec``): a step pays
for the stalls of a few loaded all-reduces, which a median hides."""


def interference_from_rows(
    rows: pd.DataFrame, *, statistic: str = INTERFERENCE_STATISTIC
) -> Interference:
    """Interference factors from ``interference`` table rows (median over cells per size).

    Args:
        rows: rows of the dataset's ``interference`` table (one or more cells).
        statistic: one of :data:`FACTOR_STATISTICS`; rows written before ``slowdown_mean``
            existed (null there) fall back to ``slowdown``.

    Returns:
        Factors per measured size, at least 1 (overlap speeds neither side up: a factor below
        1 is the noise of a loaded host), spread the half interquartile range; without rows
        :data:`NO_INTERFERENCE`.
    """
    if statistic not in FACTOR_STATISTICS:
        raise ValueError(f"statistic must be one of {FACTOR_STATISTICS}, got {statistic!r}")
    if rows.empty:
        return NO_INTERFERENCE
    rows = rows.assign(factor=rows["slowdown"])
    if statistic == "mean" and "slowdown_mean" in rows:
        rows["factor"] = rows["slowdown_mean"].fillna(rows["slowdown"])
    med = rows.groupby(["arm", "num_bytes"])[["factor", "slowdown_q25", "slowdown_q75"]].median()
    sizes = sorted({int(n) for n in rows["num_bytes"]})

    table = med.to_dict("index")

    def column(arm: str) -> tuple[list[float], list[float]]:
        factors, spread = [], []
        for n in sizes:
            row = table.get((arm, n))
            factors.append(1.0 if row is None else max(1.0, float(row["factor"])))
            spread.append(
                0.0 if row is None else float(row["slowdown_q75"] - row["slowdown_q25"]) / 2.0
            )
        return factors, spread

    comm, comm_spread = column(ARM_COMM)
    comp, comp_spread = column(ARM_COMPUTE)
    return Interference(
        sizes_bytes=tuple(float(n) for n in sizes),
        comm_slowdown=tuple(comm),
        compute_slowdown=tuple(comp),
        comm_spread=tuple(comm_spread),
        compute_spread=tuple(comp_spread),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class StepCalibration:
    """A cell's step, in idle compute units, ready to be replayed at another cap or link."""

    cell_id: str
    """The calibration cell (the first one where several are pooled)."""
    cell_ids: tuple[str, ...] = ()
    """Every cell whose steps were pooled (``cell_id`` first)."""
    world_size: int
    """Its ranks."""
    backend: str
    """Its backend."""
    param_ready_work_ns: tuple[float, ...]
    """Per parameter (registration order): backward compute work until its gradient is ready."""
    compute_work_ns: float
    """Backward compute work in all (hooks excluded)."""
    hook_fixed_ns: float
    """Training-thread time of one hook, fixed part (fit of launch_ns - ready_ns on bytes)."""
    hook_ns_per_byte: float
    """Training-thread time of one hook per bucket byte (``allreduce_hook`` divides the bucket
    by the world size before the enqueue)."""
    hook_sizes_bytes: tuple[int, ...] = ()
    """The bucket sizes the hook's fit saw (:func:`hook_fit`); with one, the fit cannot split
    its cost into fixed and per-byte parts (:func:`split_hook`)."""
    forward_ns: float
    """Median forward time."""
    optimizer_ns: float
    """Median optimizer time."""
    other_ns: float
    """Median backward time after the last all-reduce and compute (DDP's finalize)."""
    measured_step_ns: float
    """Measured step time of the calibration cells: the median over cells of each cell's
    median over its measured rank-steps (what the host residual is fitted to)."""
    measured_exposed_ns: float = math.nan
    """Measured exposed communication, the timing hook's (``analysis.breakdown``), as
    ``measured_step_ns`` is made."""
    cell_step_ns: tuple[float, ...] = ()
    """Each calibration cell's median step time (``cell_ids`` order)."""
    bucket_cap_mb: float | None
    """The calibration cells' cap (MiB; None: DDP's default)."""


def _work_at(x: np.ndarray, pieces: list[tuple[float, float, float]]) -> np.ndarray:
    """W(x): time minus what in-flight pieces (start, end, factor) took from compute."""
    out = x.astype(np.float64).copy()
    for s, e, f in pieces:
        overlap = np.clip(np.minimum(x, e) - s, 0.0, None)
        out -= overlap * (1.0 - 1.0 / f)
    return out


def _in_flight_pieces(
    launch: np.ndarray, done: np.ndarray, nbytes: np.ndarray, interference: Interference
) -> list[tuple[float, float, float]]:
    # The union of the all-reduce intervals, each stretch charged to the bucket that first
    # covered it (sorted by start; the covered frontier only moves right).
    pieces: list[tuple[float, float, float]] = []
    covered = -math.inf
    for k in np.argsort(launch, kind="stable"):
        s = max(float(launch[k]), covered)
        if float(done[k]) > s:
            pieces.append((s, float(done[k]), interference.compute_factor(float(nbytes[k]))))
        covered = max(covered, float(done[k]))
    return pieces


def same_setting(a: object, b: object) -> bool:
    """Equal cell settings, two missing values (NaN, None: DDP's default cap) counting equal."""
    return bool(a == b) or bool(pd.isna(a) and pd.isna(b))  # type: ignore[call-overload]


def _pooled_rows(tables: dict[str, pd.DataFrame], cell_ids: Sequence[str]) -> list[pd.Series]:
    """The latest ok attempt of each cell; they must be one configuration (same buckets)."""
    if not cell_ids:
        raise ValueError("calibrate_step needs at least one cell")
    rows = [ok_cell(tables["cells"], c) for c in cell_ids]
    first = rows[0]
    for row in rows[1:]:
        for key in WORKLOAD_FIELDS:
            a, b = first.get(key), row.get(key)
            if not same_setting(a, b):
                raise ValueError(
                    f"cells {first['cell_id']} and {row['cell_id']} differ in {key} "
                    f"({a!r} vs {b!r}): pool only repeats of one configuration"
                )
    return rows


def calibrate_step(
    tables: dict[str, pd.DataFrame],
    cell_id: str | Sequence[str],
    param_sizes: Sequence[ParamSize],
    interference: Interference,
) -> StepCalibration:
    """Idle compute timeline and fixed step parts of one cell or of repeats of one (module
    docstring).

    Args:
        tables: the dataset (``commprof.results.load``).
        cell_id: the calibration cell (or a unique prefix), or several cells of one
            configuration (repeats, as interleaved rounds make them): their measured steps are
            pooled, so no one cell's minute of host load sets the timeline.
        param_sizes: its model's ``(name, numel[, element_size])`` in registration order.
        interference: the factors used to take interference out of the measured timeline.

    Returns:
        The calibration.
    """
    rows = _pooled_rows(tables, [cell_id] if isinstance(cell_id, str) else list(cell_id))
    row = rows[0]
    keys = keys_of(rows)
    steps = cell_steps(tables, keys)
    if steps.empty or steps["start_ns"].isna().any():
        raise ValueError(f"cell {row['cell_id']} has no measured steps with start times; rerun it")
    buckets = tables["buckets"].merge(steps, on=list(STEP_KEYS))
    if buckets.empty:
        raise ValueError(f"cell {row['cell_id']} has no bucket rows of measured steps; rerun it")
    if (buckets.groupby("bucket_index")["num_bytes"].nunique() > 1).any():
        raise ValueError(
            f"cells {sorted(keys['cell_id'])} bucket the model differently: pool only repeats"
        )
    # Per (rank, step): the compute work at each hook entry and at the last hand-over.
    works: dict[tuple[str, int], list[np.ndarray]] = {}
    other: list[float] = []
    exposed: dict[tuple[str, int], list[float]] = {}
    for (cell, _, _), group in buckets.groupby(["cell_id", "rank", "step"]):
        group = group.sort_values("bucket_index")
        origin = float(group["start_ns"].iloc[0] + group["forward_ns"].iloc[0])
        ready = group["ready_ns"].to_numpy(np.float64) - origin
        launch = group["launch_ns"].to_numpy(np.float64) - origin
        done = group["done_ns"].to_numpy(np.float64) - origin
        pieces = _in_flight_pieces(launch, done, group["num_bytes"].to_numpy(), interference)
        works.setdefault((str(cell), int(group["step"].iloc[0])), []).append(
            _work_at(np.append(ready, launch[-1]), pieces)
        )
        other.append(float(group["backward_ns"].iloc[0]) - max(float(done.max()), launch[-1]))
        exposed.setdefault((str(cell), int(group["step"].iloc[0])), []).append(
            # the hook's exposed time: a union of [max(ready_k, R), done_k) is [R, max done)
            max(0.0, float(done.max() - ready.max()))
        )
    index = np.sort(buckets["bucket_index"].unique())
    # An all-reduce starts when the slowest rank hands its bucket over: per step, the max over
    # ranks of each bucket's ready work (and of the compute's end), then the median over steps.
    slowest = np.stack([np.max(np.stack(w), axis=0) for w in works.values()])
    per_bucket = {int(k): slowest[:, i].tolist() for i, k in enumerate(index)}
    compute = slowest[:, -1]
    fixed, per_byte = hook_fit(buckets)
    sizes = buckets.groupby("bucket_index")["num_bytes"].first().sort_index()
    hooks = fixed + per_byte * sizes.to_numpy(np.float64)
    before = np.concatenate([[0.0], np.cumsum(hooks)])
    offsets = pd.Series(
        {k: float(np.median(v)) - before[i] for i, (k, v) in enumerate(sorted(per_bucket.items()))}
    )
    # per cell the median over its rank-steps, then the median over cells (as repeats are judged)
    per_cell = steps.groupby("cell_id", sort=False)["step_ns"].median()
    missing = sorted(set(keys["cell_id"]) - set(per_cell.index))
    if missing:
        raise ValueError(f"calibration cells {missing} have no measured step: leave them out")
    cell_exposed = pd.Series(
        [e for v in exposed.values() for e in v],
        index=[key[0] for key, v in exposed.items() for _ in v],
        dtype=np.float64,
    )
    cell_exposed = cell_exposed.groupby(level=0).median()
    params = tables["bucket_params"]
    params = params[params["cell_id"] == row["cell_id"]]
    ready_work = spread_to_parameters(offsets, params, param_sizes)
    return StepCalibration(
        cell_id=str(row["cell_id"]),
        cell_ids=tuple(str(c) for c in keys["cell_id"]),
        world_size=int(row["world_size"]),
        backend=str(row["backend"]),
        param_ready_work_ns=tuple(float(v) for v in ready_work),
        compute_work_ns=max(float(np.median(compute)) - before[-1], ready_work.max()),
        hook_fixed_ns=fixed,
        hook_ns_per_byte=per_byte,
        hook_sizes_bytes=tuple(int(n) for n in sorted(set(sizes))),
        forward_ns=float(steps["forward_ns"].median()),
        optimizer_ns=float(steps["optimizer_ns"].median()),
        other_ns=max(0.0, float(np.median(other))),
        measured_step_ns=float(per_cell.median()),
        measured_exposed_ns=float(cell_exposed.median()),
        cell_step_ns=tuple(float(per_cell[c]) for c in keys["cell_id"]),
        bucket_cap_mb=cap_mb(row.get("bucket_cap_mb")),
    )


HOOK_QUANTILE = 0.25
"""Quantile of the hook's time per bucket size taken as its cost: on a shared host the training
thread is sometimes descheduled inside the hook for a whole all-reduce (tens of ms against a
fraction of one), noise that only adds, so a low quantile estimates the cost, not the median."""


def hook_fit(buckets: pd.DataFrame) -> tuple[float, float]:
    """(fixed ns, ns per byte) of the hook's time ``launch_ns - ready_ns``.

    A line through the ``HOOK_QUANTILE`` of each bucket size. With one size (a model in one
    bucket) the two cannot be told apart and all of it is taken per byte: the hook's cost is
    ``allreduce_hook``'s division of the bucket, the enqueue is tens of microseconds
    (docs/design.md). A negative slope means no per-byte cost was seen (the quantile's median
    is the fixed part); a negative intercept, a line through the origin.
    """
    hook = (buckets["launch_ns"] - buckets["ready_ns"]).astype(np.float64)
    low = hook.groupby(buckets["num_bytes"]).quantile(HOOK_QUANTILE)
    x, y = low.index.to_numpy(np.float64), low.to_numpy(np.float64)
    if x.size < 2:
        return 0.0, max(0.0, float(y[0])) / float(x[0])
    return nonnegative_line(x, y)


def host_hook_fixed_ns(tables: dict[str, pd.DataFrame], keys: pd.DataFrame) -> float:
    """The fixed part ``a`` of :func:`hook_fit` over the measured steps of the attempts in
    ``keys`` pooled (the host's cells with the calibration's hook, several models and bucket
    sizes): the hook's cost a bucket whatever its size. 0 where they hold fewer than two bucket
    sizes.

    An unweighted line through one point a size: with sizes from 0.4 to 30 MB (the step-model
    benchmark's) the smallest size weighs most on the intercept, and a 5 % change of the largest
    size's cost moves it by about 14 us.
    """
    steps = cell_steps(tables, keys)
    buckets = tables["buckets"].merge(steps[list(STEP_KEYS)], on=list(STEP_KEYS))
    if buckets["num_bytes"].nunique() < 2:
        return 0.0
    return hook_fit(buckets)[0]


def split_hook(calibration: StepCalibration, fixed_ns: float) -> StepCalibration:
    """The calibration with a one-size hook cost split: ``fixed_ns`` a bucket (at most the whole
    cost) and the rest per byte, the same cost at the calibration's own size.

    :func:`hook_fit` puts all of one size's cost per byte, so a cap that cuts the model into
    more, smaller buckets pays the same hook time in all, though each hook's Python call,
    clock and enqueue cost the same whatever the size: a cost a bucket, which grows with the
    number of buckets. The host's cells with the same hook, at other sizes, measure that
    fixed part (:func:`host_hook_fixed_ns`). Unchanged where the calibration saw two or more
    sizes (its own line) or ``fixed_ns`` is 0.
    """
    if len(calibration.hook_sizes_bytes) != 1 or fixed_ns <= 0:
        return calibration
    size = float(calibration.hook_sizes_bytes[0])
    cost = calibration.hook_fixed_ns + calibration.hook_ns_per_byte * size
    fixed = min(fixed_ns, cost)
    return replace(calibration, hook_fixed_ns=fixed, hook_ns_per_byte=(cost - fixed) / size)


def cpu_share_scale(world_size: int, calibrated_world_size: int, *, num_cores: int) -> float:
    """Compute slowdown of ranks sharing one host's cores (one compute thread a rank).

    ``max(1, p / cores) / max(1, p_cal / cores)``: with more ranks than cores each rank gets
    ``cores / p`` of a core. Only for ranks on one CPU host; 1 elsewhere.
    """
    if min(world_size, calibrated_world_size, num_cores) < 1:
        raise ValueError("world sizes and num_cores must be >= 1")
    return max(1.0, world_size / num_cores) / max(1.0, calibrated_world_size / num_cores)


@dataclass(frozen=True, kw_only=True, slots=True)
class WhatIf:
    """The configuration a prediction is asked about, resolved (``step_advice.predict_cap``
    makes it from a cap, world size, link and host)."""

    bucket_cap_mb: float | None
    """DDP cap (MiB); None is DDP's default."""
    link: Link
    """A calibrated fit, published link parameters or a cluster's collective model."""
    world_size: int | None = None
    """Ranks (None: the calibration's)."""
    num_channels: int | None = None
    """Collectives in flight at once (None: the backend's; NCCL's on a cluster, whose GPUs run
    NCCL)."""
    compute_scale: float = 1.0
    """Multiplies forward, backward compute, hooks and optimizer (module docstring)."""
    service_scale: float = 1.0
    """Multiplies every bucket's all-reduce time, stall included (the core share of ranks that
    share one CPU host)."""

    def __post_init__(self) -> None:
        for name in ("compute_scale", "service_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Applied:
    """The values of the step model's corrections as one prediction applies them
    (``step_corrections.applied``; one field each, named as ``StepModel``'s): neutral where a
    correction is off or out of its scope. The default is the idle model."""

    interference: Interference = NO_INTERFERENCE
    """Slowdown factors of overlapped communication and compute."""
    stall_ns: float = 0.0
    """Added to every bucket's idle all-reduce time from the link before the service scale:
    the expected stall of one operation on the calibrated link."""
    hook_fixed_ns: float = 0.0
    """The fixed part a one-size hook cost is split by (:func:`split_hook`)."""
    exposed_residual_ns: float = 0.0
    """Times ``compute_scale``, added to the exposed communication and communication time
    (:func:`with_exposed_residual`)."""
    host_residual_ns: float = 0.0
    """Times ``compute_scale``, added to the step (``StepPrediction.host_residual_ns``)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.stall_ns) and self.stall_ns >= 0):
            raise ValueError(f"stall_ns must be finite and >= 0, got {self.stall_ns}")
        for name in ("hook_fixed_ns", "exposed_residual_ns", "host_residual_ns"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")


IDLE_APPLIED = Applied()
"""Every correction neutral: the idle model."""


def predict_step(
    calibration: StepCalibration,
    param_sizes: Sequence[ParamSize],
    what_if: WhatIf,
    applied: Applied = IDLE_APPLIED,
) -> StepPrediction:
    """Simulate the calibrated step at a cap, link and world size.

    Args:
        calibration: from :func:`calibrate_step`.
        param_sizes: the same model's parameter sizes.
        what_if: the cap, link, world size and scales asked about.
        applied: the corrections' values (:class:`Applied`; the default: the idle model).

    Returns:
        The simulated step.
    """
    if len(param_sizes) != len(calibration.param_ready_work_ns):
        raise ValueError(
            f"the model has {len(param_sizes)} parameters, the calibration cell "
            f"{calibration.cell_id} {len(calibration.param_ready_work_ns)}: use its own model"
        )
    ws = calibration.world_size if what_if.world_size is None else what_if.world_size
    if ws < 2:
        raise ValueError(f"world_size must be >= 2 for gradient all-reduce, got {ws}")
    calibration = split_hook(calibration, applied.hook_fixed_ns)
    compute_scale, link = what_if.compute_scale, what_if.link
    buckets = assign_buckets(param_sizes, bucket_cap_mb=what_if.bucket_cap_mb)
    work = calibration.param_ready_work_ns
    ready = [compute_scale * max(work[i] for i in b.param_indices) for b in buckets]
    sizes = np.array([b.num_bytes for b in buckets], dtype=np.float64)
    backend = link.backend or calibration.backend
    channels = what_if.num_channels
    channels = BACKEND_CHANNELS.get(backend, 1) if channels is None else channels
    service = link.predict_ns(sizes, ws) + applied.stall_ns
    slowest = simulate_step(
        ready_work_ns=ready,
        service_ns=(what_if.service_scale * service).tolist(),
        num_bytes=[b.num_bytes for b in buckets],
        compute_work_ns=max(compute_scale * calibration.compute_work_ns, max(ready)),
        num_channels=channels,
        interference=applied.interference,
        launch_overhead_ns=[
            compute_scale * (calibration.hook_fixed_ns + calibration.hook_ns_per_byte * n)
            for n in sizes
        ],
        forward_ns=compute_scale * calibration.forward_ns,
        optimizer_ns=compute_scale * calibration.optimizer_ns,
        other_ns=calibration.other_ns,
    )
    residual = compute_scale * applied.host_residual_ns
    if residual:
        slowest = replace(slowest, step_ns=slowest.step_ns + residual, host_residual_ns=residual)
    return with_exposed_residual(slowest, compute_scale * applied.exposed_residual_ns)


def with_exposed_residual(prediction: StepPrediction, residual_ns: float) -> StepPrediction:
    """The simulated step as the calibration cells' hooks measure it: ``residual_ns`` (signed)
    added to the exposed communication and the communication time, the exposed time kept within
    [0, step] and the communication at least the exposed (the step is the same)."""
    if residual_ns == 0 or prediction.comm_busy_ns == 0:
        return prediction
    exposed = min(prediction.step_ns, max(0.0, prediction.exposed_ns + residual_ns))
    busy = max(exposed, prediction.comm_busy_ns + residual_ns)
    return replace(
        prediction,
        exposed_ns=exposed,
        comm_busy_ns=busy,
        overlap_efficiency=min(1.0, max(0.0, busy - exposed) / busy) if busy else math.nan,
        exposed_residual_ns=exposed - prediction.exposed_ns,
    )


def predict_range(
    calibration: StepCalibration,
    param_sizes: Sequence[ParamSize],
    what_if: WhatIf,
    applied: Applied = IDLE_APPLIED,
) -> tuple[StepPrediction, StepPrediction, StepPrediction]:
    """(low, central, high) predictions: the calibration's uncertainty carried through.

    Low: alpha and beta at the lower ends of their 95 % intervals and the interference factors
    at their lower quartiles; high: the upper ends. A cluster's link is at the ends of its
    collective model's 80 % interval; a published link has no interval.
    """
    central = predict_step(calibration, param_sizes, what_if, applied)
    ends = []
    link = what_if.link
    bounds = link.interval()
    for side, sign in ((0, -1.0), (1, 1.0)):
        bound = link if bounds is None else bounds[side]
        ends.append(
            predict_step(
                calibration,
                param_sizes,
                replace(what_if, link=bound),
                replace(applied, interference=applied.interference.shifted(sign)),
            )
        )
    return ends[0], central, ends[1]
