"""What the step model predicts for a dataset: the cap advice, its out-of-sample check, what-ifs.

The Recommendations section of the main report (``recommend``) renders these tables; they are
computed here with the public step-model API (``commprof.modeling.step_advice``) so that a test
can recompute every number the section prints with the same calls. Three tables:

- :func:`cap_advice`: per (model, world size) with a calibratable cell of that world size, the
  cap with the shortest predicted step and the predicted step at the calibration cell's cap;
- :func:`out_of_sample`: per configuration of the same model and world size run at another cap
  than the calibration cell's (unprofiled, repeats pooled), the predicted against the measured
  median step. The calibration configuration itself is never scored (that would be in sample);
- :func:`what_if`: the cap advice with the link swapped for a published interconnect, the
  measured compute timeline kept (a prediction only: nothing here ran on that link).

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
from commprof.modeling.cost_model import LinkParams
from commprof.modeling.estimate import DEFAULT_ALPHA_NS
from commprof.modeling.interconnects import Interconnect, builtin_interconnects
from commprof.modeling.step_advice import (
    CAP_GRID_MB,
    CapPrediction,
    StepModel,
    load_step_model,
    param_sizes_for,
    predict_cap,
    recommend_cap,
    repeats_of,
    select_calibration_cell,
)

WHAT_IF_LINKS = ("nvlink4", "ib-ndr")
"""Published interconnects of the what-if table (names in ``interconnects.yaml``)."""


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
    cal_cap: float | None, link: LinkParams | None = None,
) -> tuple[CapPrediction, CapPrediction, float]:  # fmt: skip
    """The point recommended, the point at the calibration cell's cap and :func:`tie_from` of
    the recommended step. The calibration cap is the cap in use: where it is predicted within
    ``step_advice.TIE_TOLERANCE`` of the cap the search would name, it is the one recommended
    (``step_advice.best_of``)."""
    advice = recommend_cap(model, sizes, caps_mb=caps, link=link, in_use_mb=cal_cap)
    chosen = next(c for c in advice.curve if same_cap(c.bucket_cap_mb, advice.best_cap_mb))
    at_cal = next(c for c in advice.curve if same_cap(c.bucket_cap_mb, cal_cap))
    return chosen, at_cal, tie_from(advice.curve, chosen.step_ns)


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
        measured_cal``, NaN where either is).
    """
    measured = measured_steps(data)
    rows = []
    for name, ws, fitted, cal_cap in calibrated(data):
        mine = measured[(measured["model"] == name) & (measured["world_size"] == ws)]
        best, at_cal, tied = _advice(
            fitted, param_sizes_for(data.tables, name), _caps(mine, cal_cap), cal_cap
        )
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
            pred = predict_cap(fitted, param_sizes_for(data.tables, name), bucket_cap_mb=cap)
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


def what_if_links() -> list[Interconnect]:
    """The published interconnects of the what-if table, from the shipped registry."""
    links = builtin_interconnects()
    return [links[n] for n in WHAT_IF_LINKS]


def what_if(data: Processed) -> pd.DataFrame:
    """The cap advice with each of :data:`WHAT_IF_LINKS` as the link (alpha assumed
    ``DEFAULT_ALPHA_NS``, the calibration's compute timeline and interference kept).

    Returns:
        Columns ``model, world_size, link, best_cap_mb, best_step_ns, best_exposed_ns,
        cal_cap_mb, cal_step_ns, predicted_gain``, one row per (model, world size, link).
    """
    measured = measured_steps(data)
    rows = []
    for name, ws, fitted, cal_cap in calibrated(data):
        mine = measured[(measured["model"] == name) & (measured["world_size"] == ws)]
        caps = _caps(mine, cal_cap)
        for link in what_if_links():
            params = LinkParams.from_bandwidth(
                bandwidth_bytes_per_s=link.per_direction_bytes_per_s, alpha_ns=DEFAULT_ALPHA_NS
            )
            best, at_cal, _ = _advice(
                fitted, param_sizes_for(data.tables, name), caps, cal_cap, link=params
            )
            rows.append(
                {
                    "model": name,
                    "world_size": ws,
                    "link": link.name,
                    "best_cap_mb": best.bucket_cap_mb,
                    "best_step_ns": best.step_ns,
                    "best_exposed_ns": best.exposed_ns,
                    "cal_cap_mb": cal_cap,
                    "cal_step_ns": at_cal.step_ns,
                    "predicted_gain": 1.0 - best.step_ns / at_cal.step_ns,
                }
            )
    return pd.DataFrame(rows)
