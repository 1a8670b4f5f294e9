"""What the step model predicts for a dataset: the cap advice, its out-of-sample check, what-ifs.

The Recommendations section of the main report (``recommend``) renders these tables; they are
computed here with the public step-model API (``commprof.modeling.step.model``) so that a test
can recompute every number the section prints with the same calls. Three tables:

- :func:`cap_advice`: per (model, world size) with a calibratable cell of that world size, the
  cap with the shortest predicted step and the predicted step at the calibration cell's cap;
- :func:`out_of_sample`: per configuration of the same model and world size run at another cap
  than the calibration cell's (unprofiled, repeats pooled), the predicted against the measured
  median step. The calibration configuration itself is never scored (that would be in sample);
  the predictions are the model's, without the residuals that give the calibration's own
  buckets its measurement back (``step_advice.without_in_sample``), as the advice ranks caps, so
  a cap that DDP buckets as the calibration's is predicted too, not echoed;
- :func:`what_if`: the cap advice on bundled clusters (:data:`WHAT_IF_CLUSTERS`) at their
  GPU counts, each all-reduce from the collective model (``modeling.cluster_link``), the
  measured compute timeline kept (a prediction only: nothing here ran on those clusters).

This module imports no torch and no ray.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import pandas as pd

from commprof.analysis.dataset import Processed
from commprof.caps import cap_mb, same_cap
from commprof.modeling.buckets import ParamSize
from commprof.modeling.collective.cluster_link import ClusterLink
from commprof.modeling.collective.clusters import builtin_clusters
from commprof.modeling.step.cap_advice import (
    CAP_GRID_MB,
    baseline_label,
    recommend_cap,
    verdict_kind,
)
from commprof.modeling.step.model import (
    ALL_CORRECTIONS,
    CapPrediction,
    StepModel,
    load_step_model,
    param_sizes_for,
    predict_cap,
    repeats_of,
    select_calibration_cell,
    without_in_sample,
)

WHAT_IF_CLUSTERS: tuple[tuple[str, int], ...] = (("dgx-h100", 16), ("a100-ethernet", 16))
"""Bundled clusters of the what-if table (names in ``clusters.yaml``) and the GPUs each runs: two
nodes of H100s on NDR InfiniBand (a NIC a GPU), and two of A100s on one 100 GbE NIC a node."""


def measured_steps(data: Processed) -> pd.DataFrame:
    """Unprofiled ok configurations (repeats pooled): ``model, world_size, bucket_cap_mb,
    step_ns_median``."""
    merged = data.merged[~data.merged["profile"].astype(bool)]
    return merged[["model", "world_size", "bucket_cap_mb", "step_ns_median"]]


def calibrated(data: Processed) -> list[tuple[str, int, StepModel, float | None]]:
    """Per (model, world size) with an ok gloo cell of that world size the step model can be
    calibrated on (bucket timing rows, a microbenchmark to fit): the calibrated model and the
    calibration cell's cap (None: DDP's default)."""
    out: list[tuple[str, int, StepModel, float | None]] = []
    if data.summary.empty:
        return out
    pairs = data.summary[["model", "world_size"]].drop_duplicates()
    for model, ws in sorted(set(zip(pairs["model"], pairs["world_size"], strict=True))):
        try:
            cell = select_calibration_cell(data.tables, model, world_size=int(ws))
        except ValueError:  # no completed gloo cell of this model with bucket rows
            continue
        row = data.tables["cells"].set_index("cell_id").loc[[cell]].iloc[-1]
        if int(row["world_size"]) != int(ws):
            continue  # only another world size to calibrate on: not this pair's advice
        fitted = load_step_model(
            data.tables,
            model,
            world_size=int(ws),
            param_sizes=param_sizes_for(data.tables, model, cell),
            cell_id=repeats_of(data.tables, cell),  # its configuration's repeats pooled
        )
        out.append((model, int(ws), fitted, cap_mb(row["bucket_cap_mb"])))
    return out


def _caps(measured: pd.DataFrame, calibration_cap: float | None) -> list[float | None]:
    """The default grid, every cap measured and the calibration cap, ascending (None last)."""
    caps = {*CAP_GRID_MB, *(c for c in map(cap_mb, measured["bucket_cap_mb"]) if c is not None)}
    if calibration_cap is not None:
        caps.add(calibration_cap)
    ordered: list[float | None] = [*sorted(caps)]
    if calibration_cap is None or measured["bucket_cap_mb"].isna().any():
        ordered.append(None)
    return ordered


def tie_from(curve: Sequence[CapPrediction], step_ns: float) -> float:
    """The smallest cap from which every larger cap of ``curve`` (DDP's default aside) is
    predicted at ``step_ns`` (NaN where the largest is not): past it the model cannot tell
    caps apart (typically one bucket holds every gradient)."""
    sized = sorted((c for c in curve if c.bucket_cap_mb is not None), key=_cap_key)
    start = math.nan
    for point in reversed(sized):
        if point.step_ns != step_ns:
            break
        start = cast(float, point.bucket_cap_mb)
    return start


def _cap_key(point: CapPrediction) -> float:
    return cast(float, point.bucket_cap_mb)


def _advice(
    model: StepModel, sizes: Sequence[ParamSize], caps: list[float | None],
    cal_cap: float | None, link: ClusterLink | None = None, world_size: int | None = None,
) -> tuple[CapPrediction, CapPrediction, float]:  # fmt: skip
    """The point recommended, the point at the calibration cell's cap and :func:`tie_from` of
    the recommended step. The calibration cap is the cap in use: where it is predicted within
    ``cap_advice.TIE_TOLERANCE`` of the cap the search would name, it is the one recommended
    (``cap_advice.best_of``)."""
    advice = recommend_cap(
        model, sizes, caps_mb=caps, link=link, in_use_mb=cal_cap, world_size=world_size
    )
    assert advice.in_use is not None  # the calibration cap was given
    return advice.best, advice.in_use, tie_from(advice.curve, advice.best.step_ns)


def _gain_range(best: CapPrediction, at_cal: CapPrediction) -> dict[str, float]:
    """The predicted gain at the low and at the high ends of the calibration's uncertainty
    (each end is one parameter set for every cap), as ``gain_low`` <= ``gain_high``."""
    ends = [1.0 - best.step_ns_range[i] / at_cal.step_ns_range[i] for i in (0, 1)]
    return {"gain_low": min(ends), "gain_high": max(ends)}


def cap_advice(data: Processed) -> pd.DataFrame:
    """The step model's cap per (model, world size) with a calibratable cell.

    Returns:
        Columns ``model, world_size, cell_id, calibration_cap_mb, best_cap_mb, moved`` (the
        best cap is not the calibration cap; None and NaN are DDP's default), ``num_buckets,
        tie_from_mb`` (:func:`tie_from`), ``best_step_ns, best_low_ns, best_high_ns,
        cal_step_ns, cal_low_ns, cal_high_ns, predicted_gain`` (``1 - best / at calibration
        cap``, predicted), ``gain_low, gain_high`` (:func:`_gain_range`), ``measured_cal_ns``
        and ``measured_best_ns`` (the measured median
        step at those caps, NaN where not run) and ``measured_gain`` (``1 - measured_best /
        measured_cal``, NaN where either is), ``verdict_kind`` (``cap_advice.verdict_kind``: keep,
        no measurable difference, change; what ``estimate --fit --recommend-bucket-cap`` says)
        and ``baseline`` (what it compares against, ``cap_advice.baseline_label``).
    """
    measured = measured_steps(data)
    rows = []
    for name, ws, fitted, cal_cap in calibrated(data):
        mine = measured[(measured["model"] == name) & (measured["world_size"] == ws)]
        caps = _caps(mine, cal_cap)
        best, at_cal, tied = _advice(fitted, param_sizes_for(data.tables, name), caps, cal_cap)
        got = {
            cap_mb(c): float(s)
            for c, s in zip(mine["bucket_cap_mb"], mine["step_ns_median"], strict=True)
        }
        m_best, m_cal = got.get(best.bucket_cap_mb, math.nan), got.get(cal_cap, math.nan)
        rows.append(
            {
                "model": name,
                "world_size": ws,
                "cell_id": fitted.calibration.cell_id,
                "calibration_cap_mb": cal_cap,
                "best_cap_mb": best.bucket_cap_mb,
                "moved": not same_cap(best.bucket_cap_mb, cal_cap),
                "num_buckets": best.num_buckets,
                "tie_from_mb": tied,
                "best_step_ns": best.step_ns,
                "best_low_ns": best.step_ns_range[0],
                "best_high_ns": best.step_ns_range[1],
                "cal_step_ns": at_cal.step_ns,
                "cal_low_ns": at_cal.step_ns_range[0],
                "cal_high_ns": at_cal.step_ns_range[1],
                "predicted_gain": 1.0 - best.step_ns / at_cal.step_ns,
                **_gain_range(best, at_cal),
                "measured_cal_ns": m_cal,
                "measured_best_ns": m_best,
                "measured_gain": 1.0 - m_best / m_cal,
                # what `estimate --fit --recommend-bucket-cap` says of the same search
                "verdict_kind": verdict_kind(best, at_cal),
                "baseline": baseline_label(cal_cap, dataset=True),
            }
        )
    return pd.DataFrame(rows)


def out_of_sample(data: Processed) -> pd.DataFrame:
    """Predicted against measured median step at every cap other than the calibration cell's.

    Returns:
        Columns ``model, world_size, bucket_cap_mb, predicted_ns, low_ns, high_ns,
        measured_ns, error_pct`` (``100 (predicted - measured) / measured``) and ``in_range``
        (the measured median inside the predicted range); empty where no (model, world size)
        ran at a second cap.
    """
    measured = measured_steps(data)
    rows = []
    for name, ws, fitted, cal_cap in calibrated(data):
        mine = measured[(measured["model"] == name) & (measured["world_size"] == ws)]
        for cap_value, step in zip(mine["bucket_cap_mb"], mine["step_ns_median"], strict=True):
            cap = cap_mb(cap_value)
            if same_cap(cap, cal_cap):
                continue  # the calibration configuration: in sample
            pred = predict_cap(
                fitted, param_sizes_for(data.tables, name), bucket_cap_mb=cap,
                corrections=without_in_sample(ALL_CORRECTIONS),
            )  # fmt: skip
            low, high = pred.step_ns_range
            rows.append(
                {
                    "model": name,
                    "world_size": ws,
                    "bucket_cap_mb": cap,
                    "predicted_ns": pred.step_ns,
                    "low_ns": low,
                    "high_ns": high,
                    "measured_ns": float(step),
                    "error_pct": 100.0 * (pred.step_ns - float(step)) / float(step),
                    "in_range": bool(low <= float(step) <= high),
                }
            )
    return pd.DataFrame(rows)


def what_if_clusters() -> list[tuple[ClusterLink, int]]:
    """The clusters of the what-if table (description alone) and their GPU counts."""
    clusters = builtin_clusters()
    return [(ClusterLink(cluster=clusters[name]), gpus) for name, gpus in WHAT_IF_CLUSTERS]


def what_if(data: Processed) -> pd.DataFrame:
    """The cap advice on each of :data:`WHAT_IF_CLUSTERS` at its GPU count (each all-reduce
    NCCL's on that cluster by the collective model, the calibration's compute timeline and
    interference kept).

    Returns:
        Columns ``model, world_size`` (the calibration's), ``cluster, cluster_world_size,
        best_cap_mb, best_step_ns, best_exposed_ns, cal_cap_mb, cal_step_ns, predicted_gain``,
        one row per (model, world size, cluster).
    """
    measured = measured_steps(data)
    rows = []
    for name, ws, fitted, cal_cap in calibrated(data):
        mine = measured[(measured["model"] == name) & (measured["world_size"] == ws)]
        caps = _caps(mine, cal_cap)
        for link, gpus in what_if_clusters():
            best, at_cal, _ = _advice(
                fitted, param_sizes_for(data.tables, name), caps, cal_cap, link=link,
                world_size=gpus,
            )  # fmt: skip
            rows.append(
                {
                    "model": name,
                    "world_size": ws,
                    "cluster": link.cluster.name,
                    "cluster_world_size": gpus,
                    "best_cap_mb": best.bucket_cap_mb,
                    "best_step_ns": best.step_ns,
                    "best_exposed_ns": best.exposed_ns,
                    "cal_cap_mb": cal_cap,
                    "cal_step_ns": at_cal.step_ns,
                    "predicted_gain": 1.0 - best.step_ns / at_cal.step_ns,
                }
            )
    return pd.DataFrame(rows)
