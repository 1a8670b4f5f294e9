"""The step-model benchmark's ablation: the simulator with each correction off in turn.

A correction earns its place when switching it off raises the held-out error
(:func:`ablation_summary`); :func:`ablation_variants` is the one place that knows how each is
switched off. Used by ``step_model_analysis.py``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from commprof.modeling.buckets import ParamSize
from commprof.modeling.step.corrections import CORRECTIONS, Scope
from commprof.modeling.step.model import (
    StepModel,
    predict_cap,
    recalibrated_without,
    with_residuals,
)
from commprof.modeling.step.simulator import Interference

ABLATED = tuple(c.name for c in CORRECTIONS if c.scope is not Scope.IN_SAMPLE)
"""The corrections with an ablation row (``no_<name>``): every one of
``step_corrections.CORRECTIONS`` that acts out of sample. An in-sample correction has none: it
moves no held-out cell but one that DDP buckets as the calibration (srn-1m at 4 MiB, whose
prediction is its 25 MiB cells' measurement in every row); the residuals' rows from when they
applied out of sample are in benchmarks/README.md."""
ALTERNATIVES = ("median_factors",)
"""Rows of a rule rather than a correction: the median pair ratios in place of the mean
interference factors (the spec's ``interference_statistic``)."""
ABLATIONS = ("full", *(f"no_{name}" for name in ABLATED), *ALTERNATIVES)
"""The ablation's rows (:func:`ablation_variants`): the full simulator, then one correction off
(:data:`ABLATED`), then :data:`ALTERNATIVES`."""
RAISE_TOLERANCE_PTS = 0.05
"""How much a row's mean error must exceed the full model's to count as raised (percentage
points): half the table's 0.1. Two rows whose predictions are the same number (a correction that
does not act on a cell) differ by float rounding only, and must not count as a raise."""


def _raises(off: Sequence[float], full: Sequence[float]) -> bool:
    """Whether switching a correction off raises the mean error (by more than the tolerance)."""
    return bool(full) and statistics.mean(off) > statistics.mean(full) + RAISE_TOLERANCE_PTS


def errors(pred: tuple[float, float], step: float, exposed: float) -> dict[str, float]:
    return {
        "pred_step_ms": pred[0] / 1e6,
        "pred_exposed_ms": pred[1] / 1e6,
        "step_ape_pct": 100 * abs(pred[0] - step) / step,
        "exposed_err_pct_of_step": 100 * abs(pred[1] - exposed) / step,
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class HeldOut:
    """One held-out cell as measured: what a model is scored on."""

    key: str
    """How the report names it: the cap (``0.25``) or the world size and cap (``p3@25``)."""
    bucket_cap_mb: float
    """The cap (MiB)."""
    world_size: int
    """Ranks."""
    step_ns: float
    """Median step over its rounds."""
    exposed_ns: float
    """Median exposed communication over its rounds."""


def ablation_variants(
    model: StepModel, param_sizes: Sequence[ParamSize], *, median_interference: Interference
) -> dict[str, StepModel]:
    """The full simulator and each correction switched off, one at a time (:data:`ABLATIONS`).

    Each correction off is ``step_advice.recalibrated_without``, what ``commprof estimate
    --without NAME`` predicts with: the stall, the interference factors or the hook split
    removed and the residuals fitted again.
    ``median_factors`` takes the median pair ratios in place of the mean interference factors,
    the residuals fitted again. Every row reproduces what its corrections can of the
    calibration cells, so the rows differ in what the correction does to the other cells; the
    calibrated timeline (its compute, taken out of interference with the mean factors) is kept
    in every row.
    """
    variants = {
        "full": model,
        **{f"no_{name}": recalibrated_without(model, [name], param_sizes) for name in ABLATED},
        "median_factors": with_residuals(
            replace(model, interference=median_interference), param_sizes
        ),
    }
    assert tuple(variants) == ABLATIONS
    return variants


def ablation(
    model: StepModel, param_sizes: Sequence[ParamSize], held_out: Sequence[HeldOut], *,
    median_interference: Interference,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The simulator's held-out errors with each correction off (:func:`ablation_variants`).

    Args:
        model: the calibrated model (mean interference factors), the ``full`` row.
        param_sizes: its model's parameter sizes.
        held_out: the measured held-out cells (caps at the calibration's world size, and other
            world sizes, predicted with the ranks sharing the host, ``same_host``).
        median_interference: the host's median-pair-ratio factors (``median_factors``).

    Returns:
        Per variant: ``step_mape_pct`` and ``exposed_err_max_pct_of_step`` over the held-out
        caps at the calibration's world size (None where there are none), and per cell
        (``HeldOut.key``) its step APE and exposed error.
    """
    ws = model.calibration.world_size
    out: dict[str, dict[str, Any]] = {}
    variants = ablation_variants(model, param_sizes, median_interference=median_interference)
    for name, variant in variants.items():
        cells = {}
        for cell in held_out:
            pred = predict_cap(
                variant, param_sizes, bucket_cap_mb=cell.bucket_cap_mb,
                world_size=cell.world_size, same_host=True,
            )  # fmt: skip
            cells[cell.key] = errors((pred.step_ns, pred.exposed_ns), cell.step_ns, cell.exposed_ns)
        caps = [cells[c.key] for c in held_out if c.world_size == ws]
        out[name] = {
            "exposed_residual_ns": variant.exposed_residual_ns,
            "host_residual_ns": variant.host_residual_ns,
            "step_mape_pct": statistics.mean(e["step_ape_pct"] for e in caps) if caps else None,
            "exposed_err_max_pct_of_step": (
                max(e["exposed_err_pct_of_step"] for e in caps) if caps else None
            ),
            "cells": cells,
        }
    return out


def ablation_summary(per_model: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ablation table: per row and model of the split the held-out step MAPE, worst exposed
    error (% of the step) and each held-out world size's step APE (None: not collected); per
    correction whether it lowers the held-out error: its row's mean over the models scored of
    the step MAPE, or of the worst exposed error, or its mean step APE over the world-size
    cells, is above the full model's by more than :data:`RAISE_TOLERANCE_PTS` (switching it
    off raises that error)."""
    done = {n: r["ablation"] for n, r in per_model.items() if "ablation" in r}
    rows: dict[str, Any] = {}
    for variant in ABLATIONS:
        row: dict[str, Any] = {}
        for name, r in per_model.items():
            v = done[name][variant] if name in done else None
            entry = {
                m: None if v is None else round1(v[m])
                for m in ("step_mape_pct", "exposed_err_max_pct_of_step")
            }
            for key in r.get("world_sizes", {}):
                cell = None if v is None else v["cells"].get(key)
                entry[f"{key}_step_ape_pct"] = (
                    None if cell is None else round1(cell["step_ape_pct"])
                )
            row[name] = entry
        rows[variant] = row
    for variant in ABLATIONS[1:]:
        paired = _paired(done, variant)
        lowers = {m: _raises(off, full) for m, (off, full) in paired.items()}
        rows[variant]["lowers_held_out_error"] = any(lowers.values())
        rows[variant]["lowers"] = lowers
        rows[variant]["mean_off"] = {m: _mean(off) for m, (off, _) in paired.items()}
        rows[variant]["mean_full"] = {m: _mean(full) for m, (_, full) in paired.items()}
    return rows


MEASURES = ("step_mape_pct", "exposed_err_max_pct_of_step", "world_size_step_ape_pct")
"""What the verdict compares: per model its held-out step MAPE and worst exposed error, and
every world-size cell's step APE."""


def _paired(
    done: dict[str, dict[str, Any]], variant: str
) -> dict[str, tuple[list[float], list[float]]]:
    """Per measure (:data:`MEASURES`) the values with ``variant`` and with the full model, over
    the models scored (or the world-size cells), unrounded."""
    out = {}
    for measure in MEASURES[:2]:
        scored = [n for n in done if done[n]["full"][measure] is not None]
        out[measure] = (
            [done[n][variant][measure] for n in scored], [done[n]["full"][measure] for n in scored]
        )  # fmt: skip
    world = [(n, k) for n in done for k in done[n]["full"]["cells"] if k.startswith("p")]
    out[MEASURES[2]] = (
        [done[n][variant]["cells"][k]["step_ape_pct"] for n, k in world],
        [done[n]["full"]["cells"][k]["step_ape_pct"] for n, k in world],
    )
    return out


def _mean(values: list[float]) -> float | None:
    return round(statistics.mean(values), 2) if values else None


def pooled_verdict(runs: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The verdict over several runs of one split, each analysed by the same tree: the rule of
    :func:`ablation_summary` over every (run, model) as if one run had scored them all (each
    measure's mean over every run's models, or world-size cells, unrounded).

    Args:
        runs: per run's label, its per-model results (the analysis's ``models``: each with its
            ``ablation`` and ``world_sizes``).

    Returns:
        Per correction (``ABLATIONS[1:]``): ``lowers`` per measure, ``lowers_held_out_error``
        (any of them), ``mean_off`` and ``mean_full`` per measure; and ``runs``, the labels.
    """
    pooled = {
        f"{run}: {name}": result for run, models in runs.items()
        for name, result in models.items()
    }  # fmt: skip
    summary = ablation_summary(pooled)
    keys = ("lowers", "lowers_held_out_error", "mean_off", "mean_full")
    verdicts = {v: {k: summary[v][k] for k in keys} for v in ABLATIONS[1:]}
    return {"runs": list(runs), **verdicts}


def pooled_table(pooled: dict[str, Any]) -> str:
    """:func:`pooled_verdict` as a Markdown table: per correction the mean over the runs of each
    measure off (full model in brackets) and the verdict."""
    head = ["correction off", "step MAPE", "worst exposed", "world-size step APE", "verdict"]
    lines = [
        f"Pooled over {', '.join(pooled['runs'])}:",
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
    ]  # fmt: skip
    for variant in ABLATIONS[1:]:
        row = pooled[variant]
        cells = [
            f"{row['mean_off'][m]:.2f} ({row['mean_full'][m]:.2f})"
            if row["mean_off"][m] is not None else "n/c" for m in MEASURES
        ]  # fmt: skip
        verdict = "stays" if row["lowers_held_out_error"] else "goes"
        lines.append("| " + " | ".join([variant, *cells, verdict]) + " |")
    return "\n".join(lines)


def round1(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def ablation_table(summary: dict[str, Any]) -> str:
    """The ablation as a Markdown table (for the README): a row per variant; per model "held-out
    step MAPE / worst exposed error" (%), each held-out world size's step APE, and whether the
    correction lowers the held-out error; ``n/c``: not collected."""
    rows = summary["ablation"]
    names = list(rows["full"])
    worlds = [(n, k) for n in names for k in rows["full"][n] if k.endswith("_step_ape_pct")]
    head = [
        "correction off", *names, *(f"{n} {k.removesuffix('_step_ape_pct')}" for n, k in worlds),
        "lowers held-out error",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant in ABLATIONS:
        row = rows[variant]
        cells = [
            f"{_text(row[n]['step_mape_pct'])} / {_text(row[n]['exposed_err_max_pct_of_step'])}"
            for n in names
        ]
        cells += [_text(row[n][k]) for n, k in worlds]
        verdict = "(the full model)" if variant == "full" else (
            "yes" if row["lowers_held_out_error"] else "no: goes"
        )  # fmt: skip
        lines.append("| " + " | ".join([variant, *cells, verdict]) + " |")
    return "\n".join(lines)


def _text(value: float | None) -> str:
    return "n/c" if value is None else f"{value:.1f}"
