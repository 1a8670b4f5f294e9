"""A calibrated step model from a dataset and its predictions (public API).

:func:`load_step_model` picks a calibration cell of a model in a dataset (the one a single
``commprof run`` makes is enough) and its repeats, fits the ring model to the host's
microbenchmarks' typical (median) times and measures their stall per operation, reads the
interference factors, calibrates the simulator (``step_model``) and fits its residuals
(:func:`with_residuals`), so that at the calibration cap it gives the calibration cells' own step
and exposed communication. The corrections of the idle model are declared in
``step_corrections`` (one object each, switched on its own: ``step_corrections.Corrections``).
:func:`predict_cap` predicts the step at one cap, world size and link;
``cap_advice`` searches the caps with it. Both are what ``commprof estimate --fit RESULTS``
uses, and what a report calls::

    model = load_step_model(tables, "srn-10m", world_size=2, param_sizes=sizes)
    predict_cap(model, sizes, bucket_cap_mb=4.0).step_ns

This module imports no torch and no ray.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from commprof.matrix import INSTRUMENT_FIELDS, LINK_FIELDS, WORKLOAD_FIELDS
from commprof.modeling.buckets import DEFAULT_BUCKET_CAP_MB, ParamSize, assign_buckets
from commprof.modeling.collective.dataset_fits import fit_table
from commprof.modeling.collective.link import Link
from commprof.modeling.collective.ring_fit import MIN_POINTS, CalibrationWarning, Fit
from commprof.modeling.step import corrections as step_corrections
from commprof.modeling.step.calibration import (
    INTERFERENCE_STATISTIC,
    StepCalibration,
    WhatIf,
    calibrate_step,
    cpu_share_scale,
    host_hook_fixed_ns,
    interference_from_rows,
    predict_range,
    same_setting,
)
from commprof.modeling.step.corrections import (
    ALL_CORRECTIONS,
    CORRECTION_NAMES,
    IDLE,
    IN_SAMPLE_ONLY,
    Corrections,
    applied,
    link_stall_ns,
    without_in_sample,
)
from commprof.modeling.step.simulator import Interference, StepPrediction
from commprof.query import ok_attempts, resolve_cell

__all__ = [  # the corrections' names, where callers of the model find them too
    "ALL_CORRECTIONS",
    "CORRECTION_NAMES",
    "IDLE",
    "IN_SAMPLE_ONLY",
    "Corrections",
    "applied",
    "link_stall_ns",
    "without_in_sample",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepModel:
    """Everything the simulator needs from a dataset, for one model."""

    calibration: StepCalibration
    """The calibration cell's timeline and fixed step parts."""
    link: Fit
    """Ring fit of the host's microbenchmarks, typical times (:func:`link_fit`)."""
    interference: Interference
    """Factors from the host's interference rows (:func:`host_interference`; none: no
    slowdown)."""
    device: str
    """Where the calibration cell's tensors lived."""
    cores_per_rank_host: float
    """CPU cores of the calibration host over threads per rank (for :func:`cpu_share_scale`)."""
    stall_ns: float = 0.0
    """The stall correction's value (``step_corrections``, "stall"): expected stall of one
    all-reduce on the calibrated link, added to each bucket's time there."""
    exposed_residual_ns: float = 0.0
    """The exposed residual's value (``step_corrections.exposed_residual_ns``): measured exposed
    communication of the calibration cells minus the model's at their cap; added in sample only
    (the calibration's buckets and world size on the calibrated link,
    :func:`in_sample_layout`)."""
    host_residual_ns: float = 0.0
    """The host residual's value (``step_corrections.host_residual_ns``): measured step of the
    calibration cells minus the model's step at their cap, every other correction on; added in
    sample only, as the exposed residual."""
    hook_fixed_ns: float = 0.0
    """The hook split's value: the host's fixed hook cost a bucket
    (``step_model.host_hook_fixed_ns``), which splits a one-size calibration's hook cost
    (``step_model.split_hook``)."""


def select_calibration_cell(
    tables: dict[str, pd.DataFrame], model: str, *, backend: str = "gloo", world_size: int
) -> str:
    """The cell to calibrate on: latest ok cell of ``model`` and ``backend``, preferring this
    world size, then DDP's default cap (25 MiB or unset), then a cell run without the profiler,
    then the latest start.

    Raises:
        ValueError: naming the models and backends the dataset has, when none matches.
    """
    cells = tables["cells"]
    ok = ok_attempts(cells)
    ok = ok[(ok["model"] == model) & (ok["backend"] == backend)]
    ok = ok[ok["cell_id"].isin(tables["buckets"]["cell_id"])]
    if ok.empty:
        have = sorted(set(zip(cells["model"], cells["backend"], strict=True)))
        raise ValueError(
            f"no completed {backend} cell of model {model!r} to calibrate on; the dataset has "
            f"(model, backend) {have}: run one, e.g. commprof run --model {model} --world-size "
            f"{world_size} --out DIR"
        )
    cap = ok["bucket_cap_mb"]
    profiled = ok["profile"].eq(True) if "profile" in ok else False  # NaN: not profiled
    ranked = ok.assign(
        _ws=(ok["world_size"] != world_size).astype(int),
        _cap=~(cap.isna() | (cap == DEFAULT_BUCKET_CAP_MB)),
        _prof=profiled,
    ).sort_values(["_ws", "_cap", "_prof", "started_unix_s"], ascending=[True, True, True, False])
    return str(ranked["cell_id"].iloc[0])


LINK_TIME = "time_p50_ns"
"""The microbenchmark column the step model's link is fitted on: the median (typical) time; the
stalls the mean adds are :func:`link_stall_ns`, one per all-reduce."""


def link_fit(tables: dict[str, pd.DataFrame], cell_ids: Sequence[str]) -> tuple[Fit, float]:
    """(ring fit, per-operation stall ns) of the cells' microbenchmarks, pooled.

    The fit is of the median over the cells' rows of each size's typical time
    (:data:`LINK_TIME`), the stall :func:`link_stall_ns` of the same rows. With fewer than
    ``MIN_POINTS`` sizes there (a dataset from before cells measured
    ``CALIBRATION_SIZES_BYTES`` by default), every ok cell's of the first cell's backend, device
    and world size.
    """
    cells = ok_attempts(tables["cells"])[["cell_id", "attempt", "backend", "device", "world_size"]]
    rows = tables["microbench"].merge(cells, on=["cell_id", "attempt"])
    if "num_wrong" in rows:
        rows = rows[rows["num_wrong"].fillna(0) == 0]
    first = rows[rows["cell_id"] == cell_ids[0]]
    if first.empty:
        raise ValueError(f"cell {cell_ids[0]} has no microbenchmark rows to fit the link on")
    group = first[["backend", "device", "world_size"]].iloc[0]
    in_group = (rows[list(group.index)] == group).all(axis=1)
    own = rows[in_group & rows["cell_id"].isin(cell_ids)]
    if own["num_bytes"].nunique() < MIN_POINTS:
        own = rows[in_group]
    typical = own.groupby([*group.index, "num_bytes"], as_index=False)[[LINK_TIME]].median()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        try:
            fits = fit_table(typical, time_column=LINK_TIME)
        except ValueError as err:
            raise ValueError(
                f"cell {cell_ids[0]}: {err}. A cell run by this version measures "
                "training.trainer.CALIBRATION_SIZES_BYTES by default; rerun it"
            ) from err
    return next(iter(fits.values())), link_stall_ns(own)


def param_sizes_for(
    tables: dict[str, pd.DataFrame], model: str, cell_id: str | None = None
) -> list[tuple[str, int]]:
    """(parameter name, numel) in registration order: from the catalog for a named model, else
    read back from the dataset's ``bucket_params`` rows (a user's own model recorded by
    ``commprof.attach``).

    Raises:
        ValueError: the model is not in the catalog and no cell of it recorded its buckets.
    """
    from commprof.catalog import parameter_sizes  # closed form, torch-free

    try:
        return parameter_sizes(model)
    except ValueError:
        pass
    ok = ok_attempts(tables["cells"])
    ids = [cell_id] if cell_id is not None else list(ok.loc[ok["model"] == model, "cell_id"])
    rows = tables["bucket_params"]
    rows = rows[rows["cell_id"].isin(ids)]
    if rows.empty:
        raise ValueError(
            f"model {model!r} is neither in the catalog nor recorded in the dataset's "
            "bucket_params table; name a catalog model or pass --params-file"
        )
    first = rows[
        (rows["cell_id"] == rows["cell_id"].iloc[0]) & (rows["attempt"] == rows["attempt"].iloc[0])
    ]
    # the rebuilt buckets hold the parameters in reverse gradient-ready order (bucket 0: the last
    # layers), which is the order DDP buckets any cap in from step 1
    ordered = first.sort_values(["bucket_index", "position"]).drop_duplicates("param_name")
    sizes = zip(ordered["param_name"], ordered["numel"], strict=True)
    return [(str(name), int(numel)) for name, numel in sizes][::-1]


def load_step_model(
    tables: dict[str, pd.DataFrame],
    model: str,
    *,
    world_size: int,
    param_sizes: Sequence[ParamSize],
    backend: str = "gloo",
    cell_id: str | Sequence[str] | None = None,
    interference_statistic: str = INTERFERENCE_STATISTIC,
    link_cells: Sequence[str] | None = None,
) -> StepModel:
    """Calibrate the simulator for ``model`` from a dataset.

    Args:
        tables: the dataset (``commprof.results.load``).
        model: the model name of the cells (``cells.model``).
        world_size: the world size asked about (a calibration cell of this size is preferred).
        param_sizes: the model's ``(name, numel[, element_size])`` in registration order.
        backend: the backend of the calibration cell.
        cell_id: calibrate on this cell, or pool these repeats of one configuration (their
            microbenchmarks pooled for the link fit), instead of choosing: by default the
            chosen cell and every repeat of its configuration (:func:`repeats_of`).
        interference_statistic: what the interference factors are made of
            (``step_model.FACTOR_STATISTICS``; the mean by default); they come from every
            cell of the calibration cell's group that ran the arms (:func:`host_interference`).
        link_cells: the cells whose microbenchmarks make the link fit and its stall
            (:func:`link_fit`), and whose hooks the host's fixed hook cost
            (``step_model.host_hook_fixed_ns``); by default every completed cell of the
            calibration cell's backend, device and world size (:func:`host_cells`): the link
            and the hook are the host's.

    Returns:
        The step model.
    """
    if cell_id is None:
        chosen = select_calibration_cell(tables, model, backend=backend, world_size=world_size)
        pooled = repeats_of(tables, chosen)
    else:
        pooled = [cell_id] if isinstance(cell_id, str) else list(cell_id)
    cells = tables["cells"]
    pooled = [resolve_cell(cells, c) for c in pooled]
    row = cells[cells["cell_id"] == pooled[0]].iloc[-1]
    interference = interference_from_rows(
        host_interference(tables, pooled[0]), statistic=interference_statistic
    )
    if link_cells is None:
        link_cells = list(host_cells(tables, pooled[0])["cell_id"])
    env = json.loads(row["env_json"]) if isinstance(row["env_json"], str) else {}
    cores = float(env.get("cpu_count") or 1) / float(env.get("num_threads") or 1)
    calibration = calibrate_step(tables, pooled, param_sizes, interference)
    host = [*pooled, *(c for c in link_cells if c not in pooled)]
    link, stall = link_fit(tables, host)
    hooked = _like(ok_attempts(cells, host), cells, pooled[0], HOOK_KEYS)
    fitted = StepModel(
        calibration=calibration,
        link=link,
        interference=interference,
        device=str(row["device"]),
        cores_per_rank_host=max(1.0, cores),
        stall_ns=stall,
        hook_fixed_ns=host_hook_fixed_ns(tables, hooked),
    )
    return with_residuals(fitted, param_sizes)


def _predict_at_calibration(
    model: StepModel, param_sizes: Sequence[ParamSize], corrections: Corrections
) -> CapPrediction:
    """The model at its calibration's cap and world size on the calibrated link (what the
    residuals are fitted against, ``step_corrections.Predict``)."""
    cal = model.calibration
    return predict_cap(model, param_sizes, bucket_cap_mb=cal.bucket_cap_mb, corrections=corrections)


def with_residuals(model: StepModel, param_sizes: Sequence[ParamSize]) -> StepModel:
    """The model with its residuals fitted on its calibration cells
    (``step_corrections.with_residuals``)."""
    return step_corrections.with_residuals(model, param_sizes, _predict_at_calibration)


def recalibrated_without(
    model: StepModel, names: Sequence[str], param_sizes: Sequence[ParamSize]
) -> StepModel:
    """The model as calibrating it with the corrections ``names`` (of
    ``step_corrections.CORRECTION_NAMES``) off would give
    (``step_corrections.recalibrated_without``): what ``estimate --without NAME`` predicts with,
    and the benchmark's ablation scores."""
    return step_corrections.recalibrated_without(model, names, param_sizes, _predict_at_calibration)


HOST_KEYS = LINK_FIELDS
"""Cells equal in these (backend, device, world size) share the link fit and the interference
factors (:func:`host_interference`)."""


HOOK_KEYS = ("hook", "profile")
"""Cells equal in these to the calibration's, among the host's, fit the host's fixed hook cost
(``step_model.host_hook_fixed_ns``): an fp16 hook casts inside ``launch - ready``, and the
profiler adds a cost an operation, which is what the fixed part measures."""


def host_cells(tables: dict[str, pd.DataFrame], cell_id: str) -> pd.DataFrame:
    """``cell_id`` and attempt of every completed cell (its latest attempt) of ``cell_id``'s
    backend, device and world size (:data:`HOST_KEYS`)."""
    cells = tables["cells"]
    return _like(ok_attempts(cells), cells, cell_id, HOST_KEYS)[["cell_id", "attempt"]]


def host_interference(tables: dict[str, pd.DataFrame], cell_id: str) -> pd.DataFrame:
    """The ``interference`` rows of every completed cell of ``cell_id``'s backend, device and
    world size (their latest attempts, :func:`host_cells`).

    The arms load the rank with a fixed matrix product, not the cell's model, so they measure
    the host and backend, and each cell runs few iterations of a time with rare long stalls
    (a factor at 64 KiB ranged from 0.4 to 21 over four cells of one host): the median over
    every cell of the group is the estimate, not one cell's.
    """
    return tables["interference"].merge(host_cells(tables, cell_id), on=["cell_id", "attempt"])


def _like(
    candidates: pd.DataFrame, cells: pd.DataFrame, cell_id: str, keys: Sequence[str]
) -> pd.DataFrame:
    """The rows of ``candidates`` whose ``keys`` equal those of ``cell_id``'s latest row
    (:func:`step_model.same_setting`: two missing values are equal)."""
    me = cells[cells["cell_id"] == cell_id].iloc[-1]
    return candidates[
        [all(same_setting(r[k], me[k]) for k in keys) for _, r in candidates.iterrows()]
    ]


REPEAT_KEYS = (*WORKLOAD_FIELDS, *INSTRUMENT_FIELDS)
"""Cells equal in these are repeats of one configuration, measured the same way (``repeat``,
seeds and measurement settings may differ): the cell's workload and instrument fields
(``commprof.matrix.FieldSpec.role``). The profiler moves the step (1.43 times in one run of the
README demo), so a profiled cell is no repeat of an unprofiled one for the step model, and the
reports compare its predictions with unprofiled cells."""


def repeats_of(tables: dict[str, pd.DataFrame], cell_id: str) -> list[str]:
    """``cell_id`` and the other completed cells of its configuration that recorded buckets
    (``cell_id`` first)."""
    cells = tables["cells"]
    ok = ok_attempts(cells)
    ok = ok[ok["cell_id"].isin(tables["buckets"]["cell_id"])]
    others = sorted(set(_like(ok, cells, cell_id, REPEAT_KEYS)["cell_id"]) - {cell_id})
    return [cell_id, *others]


@dataclass(frozen=True, kw_only=True, slots=True)
class CapPrediction:
    """The predicted step at one cap, with the calibration's uncertainty."""

    bucket_cap_mb: float | None
    """The cap (MiB); None is DDP's default."""
    num_buckets: int
    """Buckets DDP makes at this cap."""
    step_ns: float
    """Predicted step time."""
    exposed_ns: float
    """Predicted exposed communication."""
    overlap_efficiency: float
    """Predicted overlap efficiency."""
    step_ns_range: tuple[float, float]
    """(low, high) step time under the calibration's uncertainty."""
    exposed_ns_range: tuple[float, float]
    """(low, high) exposed communication."""
    prediction: StepPrediction
    """The central simulation, per bucket."""


def predict_cap(
    model: StepModel,
    param_sizes: Sequence[ParamSize],
    *,
    bucket_cap_mb: float | None,
    world_size: int | None = None,
    link: Link | None = None,
    same_host: bool = False,
    corrections: Corrections = ALL_CORRECTIONS,
) -> CapPrediction:
    """One what-if: a cap, a world size, a link (default: the calibrated ones).

    Args:
        model: from :func:`load_step_model`.
        param_sizes: the model's parameter sizes.
        bucket_cap_mb: DDP cap (MiB); None is DDP's default.
        world_size: ranks (default: the calibration's).
        link: another link (a published interconnect's parameters, or a cluster's
            ``cluster_link.ClusterLink``), keeping the measured compute timeline; default the
            calibrated fit.
        same_host: the ranks share the calibration's CPU host, so compute, and gloo's
            transfers on the calibrated link, slow by the core share
            (:func:`step_model.cpu_share_scale`); else each rank has its own.
        corrections: which corrections apply (``step_corrections.Corrections``; ``IDLE``: the
            idle model); ``step_corrections.applied`` gives their values.

    Returns:
        The prediction with its range.
    """
    cal = model.calibration
    ws = cal.world_size if world_size is None else world_size
    scale = 1.0
    if same_host and model.device == "cpu":
        scale = cpu_share_scale(ws, cal.world_size, num_cores=int(model.cores_per_rank_host))
    own = in_sample_layout(model, param_sizes, bucket_cap_mb=bucket_cap_mb, world_size=ws)
    used = applied(model, link=link, corrections=corrections, in_sample=own)
    what_if = WhatIf(
        bucket_cap_mb=bucket_cap_mb,
        link=model.link if link is None else link,
        world_size=ws,
        compute_scale=scale,
        service_scale=scale if link is None else 1.0,
    )
    low, mid, high = predict_range(cal, param_sizes, what_if, used)
    return CapPrediction(
        bucket_cap_mb=bucket_cap_mb,
        num_buckets=len(mid.buckets),
        step_ns=mid.step_ns,
        exposed_ns=mid.exposed_ns,
        overlap_efficiency=mid.overlap_efficiency,
        step_ns_range=(min(low.step_ns, high.step_ns), max(low.step_ns, high.step_ns)),
        exposed_ns_range=(
            min(low.exposed_ns, high.exposed_ns),
            max(low.exposed_ns, high.exposed_ns),
        ),
        prediction=mid,
    )


def in_sample_layout(
    model: StepModel, param_sizes: Sequence[ParamSize], *, bucket_cap_mb: float | None,
    world_size: int,
) -> bool:  # fmt: skip
    """Whether a prediction at ``bucket_cap_mb`` and ``world_size`` is the calibration's own
    configuration: its world size, and DDP's buckets of the same sizes as at its cap (two caps
    can make the same buckets)."""
    cal = model.calibration
    if world_size != cal.world_size:
        return False
    here = assign_buckets(param_sizes, bucket_cap_mb=bucket_cap_mb)
    there = assign_buckets(param_sizes, bucket_cap_mb=cal.bucket_cap_mb)
    return [b.num_bytes for b in here] == [b.num_bytes for b in there]
