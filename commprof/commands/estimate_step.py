"""``commprof estimate --fit RESULTS``: the calibrated step simulator on the command line.

With a dataset folder, ``estimate`` calibrates the step simulator on one cell of the model
(``step.model.load_step_model``) and answers what-ifs with it: another cap
(``--bucket-cap-mb``), world size (``--world-size``; ``--same-host`` when the ranks would share
the calibration's CPU host) or link (``--interconnect``, or ``--cluster``: NCCL's collective
model on that cluster at ``--world-size`` GPUs; the measured compute timeline kept, the link
swapped). The idle ring model (every correction off) is printed beside it as the baseline.
Each correction (``step.corrections.CORRECTIONS``) is switched off on its own with ``--without
NAME`` (``--no-interference`` is ``--without interference``). Printed with every prediction:
what it assumed, each with its source (:func:`assumptions`), and its in-sample error, the same
model at the calibration cells' cap and world size against their measured step and exposed
communication (:func:`in_sample`), and where the calibration cells ran one bucket and the
prediction has several, that their overlap with backward is the model's, not measured
(:func:`extrapolation`).

It returns one :class:`~commprof.modeling.prediction.Prediction` (mode ``step``; its interval
the step range under the calibration's uncertainty); its body's keys are in docs/prediction.md.
With ``--recommend-bucket-cap`` the cap search's ``basis`` is ``model``: every cap predicted
without the residuals that give the calibration's own configuration its measurement back
(``step.corrections``' in-sample-only scope), so its point at that configuration is the
model's, not the measurement ``prediction`` shows there.

This module imports no torch and no ray.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from commprof.caps import cap_label, cap_number
from commprof.commands.estimate_request import EstimateRequest
from commprof.commands.links import ResolvedLink, resolve_link
from commprof.modeling.buckets import MIB, ParamSize, assign_buckets
from commprof.modeling.collective.cluster_link import ClusterLink, comm_interval, interval_line
from commprof.modeling.collective.dataset_fits import fit_to_dict
from commprof.modeling.collective.link import Link
from commprof.modeling.prediction import Assumption, Interval, Prediction
from commprof.modeling.step.calibration import split_hook
from commprof.modeling.step.cap_advice import baseline_label, recommend_cap, verdict_kind
from commprof.modeling.step.corrections import IDLE, Corrections, applied
from commprof.modeling.step.model import (
    CapPrediction,
    StepModel,
    in_sample_layout,
    load_step_model,
    predict_cap,
    recalibrated_without,
)
from commprof.modeling.step.spec import spec_doc, spec_text
from commprof.units import finite_or_none


def _prediction_doc(pred: CapPrediction) -> dict[str, Any]:
    return {
        "bucket_cap_mb": pred.bucket_cap_mb,
        "num_buckets": pred.num_buckets,
        "step_ns": round(pred.step_ns),
        "step_ns_low": round(pred.step_ns_range[0]),
        "step_ns_high": round(pred.step_ns_range[1]),
        "exposed_ns": round(pred.exposed_ns),
        "exposed_ns_low": round(pred.exposed_ns_range[0]),
        "exposed_ns_high": round(pred.exposed_ns_range[1]),
        "exposed_residual_ns": round(pred.prediction.exposed_residual_ns),
        "host_residual_ns": round(pred.prediction.host_residual_ns),
        "overlap_efficiency": finite_or_none(pred.overlap_efficiency),
        "compute_end_ns": round(pred.prediction.compute_end_ns),
        "buckets": [
            {k: (round(v) if isinstance(v, float) else v) for k, v in asdict(b).items()}
            for b in pred.prediction.buckets
        ],
    }


def _link(
    request: EstimateRequest,
    model: StepModel,
    resolved: ResolvedLink,
    corrections: Corrections,
) -> tuple[Link | None, str]:
    """The request's link (a cluster or a published one: the measured compute kept, the link
    swapped), else the link calibrated on the dataset (None) and its label."""
    if resolved.link is not None:
        return resolved.link, resolved.label or ""
    used = applied(model, link=None, corrections=corrections)
    label = f"fit of the microbenchmarks of {request.fit} ({model.link.method})"
    if used.stall_ns > 0:
        label += f" + {used.stall_ns / 1e6:.2f} ms stall an all-reduce"
    return None, label


def _fit_alpha_ns(model: StepModel) -> float:
    return model.link.alpha_ns  # a piecewise fit's: its smallest sizes' segment's


def assumptions(
    request: EstimateRequest,
    model: StepModel,
    resolved: ResolvedLink,
    label: str,
    batch_size: int | None = None,
) -> tuple[Assumption, ...]:
    """What the prediction assumed, each with its value and source: compute, tokens, link and
    latency (the step model's; ``estimate.idle_assumptions`` for the idle model's).
    ``batch_size``: the calibration cell's samples per rank, where the dataset has it."""
    cal = model.calibration
    cells = ", ".join(cal.cell_ids or (cal.cell_id,))
    where = f"{request.fit}: cells {cells}"
    if resolved.link is not None:
        source, latency, latency_source = (
            resolved.source,
            resolved.latency_ns,
            resolved.latency_source,
        )
    else:
        source = latency_source = f"fit from dataset {request.fit}"
        latency = _fit_alpha_ns(model)
    return (
        Assumption(
            name="compute",
            value=(
                f"backward {cal.compute_work_ns / 1e6:.2f} ms of work, forward "
                f"{cal.forward_ns / 1e6:.2f} ms, optimizer {cal.optimizer_ns / 1e6:.2f} ms"
            ),
            source=f"timeline measured in {where}",
            details={
                "backward_work_ns": round(cal.compute_work_ns),
                "forward_ns": round(cal.forward_ns),
                "optimizer_ns": round(cal.optimizer_ns),
            },
        ),
        Assumption(
            name="tokens",
            value=None if batch_size is None else f"batch size {batch_size} per rank",
            source=f"the calibration cells' batch, {where}",
            details={"batch_size": batch_size},
        ),
        Assumption(name="link", value=label, source=source),
        Assumption(
            name="latency",
            value=None if latency is None else round(latency),
            source=latency_source,
            unit="ns",
        ),
    )


def in_sample(
    model: StepModel,
    param_sizes: Sequence[ParamSize],
    corrections: Corrections,
) -> dict[str, Any]:
    """The model (these corrections, the calibrated link) at the calibration cells' cap and
    world size against what the cells measured: step (error a fraction of the measured step)
    and exposed communication (error a fraction of the measured step)."""
    cal = model.calibration
    pred = predict_cap(model, param_sizes, bucket_cap_mb=cal.bucket_cap_mb, corrections=corrections)
    step, exposed = cal.measured_step_ns, cal.measured_exposed_ns
    return {
        "cells": list(cal.cell_ids or (cal.cell_id,)),
        "cell_step_ns": [round(v) for v in cal.cell_step_ns],
        "bucket_cap_mb": cal.bucket_cap_mb,
        "world_size": cal.world_size,
        "predicted_step_ns": round(pred.step_ns),
        "measured_step_ns": round(step),
        "step_error": finite_or_none((pred.step_ns - step) / step),
        "predicted_exposed_ns": round(pred.exposed_ns),
        "measured_exposed_ns": round(exposed) if math.isfinite(exposed) else None,
        "exposed_error_of_step": finite_or_none((pred.exposed_ns - exposed) / step),
    }


def extrapolation(
    model: StepModel, param_sizes: Sequence[ParamSize], buckets: int, *, search: bool = False
) -> dict[str, Any] | None:
    """Where the calibration cells ran their gradients in one bucket (all-reduced after backward,
    so no all-reduce of theirs overlapped compute) and a prediction of ``buckets`` has several:
    the overlap, and what it costs backward, come from the model alone (the interference arms,
    the stall, the hook), not from a measurement. None otherwise. ``search``: ``buckets`` is the
    most of a cap search's caps, and the text speaks of its caps.

    On the 2-core gloo host most such predictions of the step-model benchmark ran short, by up
    to 35 % for a latency-bound model, the others up to 12 % long (benchmarks/README.md, "Step
    model on configurations the split does not contain"): a calibration at one bucket cannot see
    what the first overlapped all-reduce costs.
    """
    cal = model.calibration
    seen = len(assign_buckets(param_sizes, bucket_cap_mb=cal.bucket_cap_mb))
    if seen > 1 or buckets <= 1:
        return None
    what = "the caps here with several buckets" if search else f"{buckets} buckets"
    return {
        "calibration_buckets": seen,
        "buckets": buckets,
        "text": (
            "extrapolated: the calibration cells ran one bucket, all-reduced after backward, so "
            f"none of their all-reduces overlapped compute; how {what} overlap backward, and "
            "slow it, is the model's, not measured: calibrate on a cell whose cap makes several "
            "buckets (--cell ID) to measure it"
        ),
    }


def _batch_size(tables: dict[str, Any], cell_id: str) -> int | None:
    cells = tables["cells"]
    sizes = cells.loc[cells["cell_id"] == cell_id, "batch_size"].dropna()
    return int(sizes.iloc[-1]) if len(sizes) else None


def predict_step_mode(request: EstimateRequest, param_sizes: Sequence[ParamSize]) -> Prediction:
    """``estimate --fit DIR``: the step model calibrated on the dataset, at the request's cap,
    world size and link, beside the idle ring model; with ``--recommend-bucket-cap`` the cap
    search (a validated request: ``EstimateRequest.validate``)."""
    from commprof.results import load

    world_size = request.world_size
    assert world_size is not None  # validate() asks for it
    resolved = resolve_link(request, world_size)  # before the dataset is read
    corrections = request.corrections()
    tables = load(str(request.fit))
    if request.cell:
        ids = sorted(set(tables["cells"]["cell_id"].astype(str)))
        found = [i for i in ids if i.startswith(request.cell)]
        if len(found) != 1:
            what = "no cell" if not found else f"{len(found)} cells ({', '.join(found[:4])}...)"
            raise ValueError(
                f"--cell {request.cell!r} matches {what} of {request.fit}; give a cell id of the "
                "dataset or a unique prefix of one"
            )
    model = load_step_model(
        tables, request.model or "", world_size=world_size, param_sizes=param_sizes,
        backend=request.fit_backend, cell_id=request.cell,
    )  # fmt: skip
    model = recalibrated_without(model, sorted(corrections.off), param_sizes)
    link, label = _link(request, model, resolved, corrections)
    what_if: dict[str, Any] = {
        "link": link, "same_host": request.same_host, "corrections": corrections
    }  # fmt: skip
    main = predict_cap(
        model,
        param_sizes,
        bucket_cap_mb=request.bucket_cap_mb,
        world_size=world_size,
        **what_if,
    )
    idle = predict_cap(
        model, param_sizes, bucket_cap_mb=request.bucket_cap_mb, world_size=world_size,
        link=link, same_host=request.same_host, corrections=IDLE,
    )  # fmt: skip
    cal = model.calibration
    own = in_sample_layout(
        model, param_sizes, bucket_cap_mb=request.bucket_cap_mb,
        world_size=world_size or cal.world_size,
    )  # fmt: skip
    fitted = applied(model, link=link, corrections=corrections)
    used = applied(model, link=link, corrections=corrections, in_sample=own)
    doc: dict[str, Any] = {
        "prediction": _prediction_doc(main),
        "idle_ring": {k: v for k, v in _prediction_doc(idle).items() if k != "buckets"},
        "calibration": {
            "cell_id": cal.cell_id,
            "cell_ids": list(cal.cell_ids),
            "world_size": cal.world_size,
            "bucket_cap_mb": cal.bucket_cap_mb,
            "link": label,
            "fit": fit_to_dict(model.link) if link is None else None,
            "corrections": corrections.as_dict(),
            "stall_ns": round(fitted.stall_ns),
            "exposed_residual_ns": round(fitted.exposed_residual_ns),
            "host_residual_ns": round(fitted.host_residual_ns),
            "hook_fixed_ns": round(fitted.hook_fixed_ns),
            "hook_split_applies": split_hook(cal, fitted.hook_fixed_ns) is not cal,
            "interference": (
                asdict(model.interference) if corrections.on("interference") else None
            ),
            "measured_step_ns": round(cal.measured_step_ns),
        },
        "in_sample": in_sample(model, param_sizes, corrections),
        "extrapolation": extrapolation(model, param_sizes, main.num_buckets),
        "spec": spec_doc(model, used, corrections, calibrated_link=link is None),
    }
    text = [
        spec_text(doc["spec"]),
        in_sample_text(doc["in_sample"]),
    ]
    if isinstance(link, ClusterLink):  # the collective model's interval on each bucket
        sizes = [b.num_bytes for b in main.prediction.buckets]
        doc["communication_interval"] = comm_interval(
            link, sizes, request.world_size or cal.world_size
        )
        text.append(interval_line(doc["communication_interval"]))
    if doc["extrapolation"]:
        text.append(doc["extrapolation"]["text"])
    if request.recommend_bucket_cap:
        # the baseline: the cap asked for, else the dataset's cap in use (the report's too)
        given = request.bucket_cap_mb_given
        in_use_mb = request.bucket_cap_mb if given else cal.bucket_cap_mb
        baseline = baseline_label(in_use_mb, dataset=not given)
        advice = recommend_cap(
            model, param_sizes, world_size=world_size, in_use_mb=in_use_mb, **what_if
        )
        verdict = advice.verdict(baseline=baseline)
        most = max(c.num_buckets for c in advice.curve)
        unseen = extrapolation(model, param_sizes, most, search=True)
        doc["recommendation"] = {
            "best_bucket_cap_mb": advice.best_cap_mb,
            "in_use_bucket_cap_mb": in_use_mb,
            "baseline": baseline,
            "kept_cap_in_use": advice.best is advice.in_use,
            "verdict_kind": verdict_kind(advice.best, advice.in_use) if advice.in_use else None,
            "verdict": verdict,
            "basis": "model",  # every cap without the in-sample residuals
            "extrapolation": unseen,
            "curve": [
                {k: v for k, v in _prediction_doc(c).items() if k != "buckets"}
                for c in advice.curve
            ],
        }
        text.append(
            "\ncaps compared on the model, every one out of sample (the residuals that give the "
            "calibration's own cap its measurement back left out)"
        )
        text.append(
            f"{'cap MiB':>8} {'buckets':>7} {'step ms':>9} {'range ms':>17} {'exposed ms':>10}"
        )
        for c in advice.curve:
            mark = "  <- best" if c is advice.best else ""
            mark += "  (in use)" if c is advice.in_use else ""
            cap = cap_number(c.bucket_cap_mb)
            text.append(
                f"{cap:>8} {c.num_buckets:>7} {c.step_ns / 1e6:>9.2f} "
                f"{c.step_ns_range[0] / 1e6:>8.2f}-{c.step_ns_range[1] / 1e6:<8.2f} "
                f"{c.exposed_ns / 1e6:>10.2f}{mark}"
            )
        if unseen:
            text.append(unseen["text"])
        text.append(verdict)
    interval = Interval(
        quantity="step_ns",
        low_ns=main.step_ns_range[0],
        high_ns=main.step_ns_range[1],
        basis="the calibration's uncertainty: the link at the ends of its interval, the "
        "interference factors at their quartiles",
        title="step range",
    )
    return Prediction(
        mode="step",
        link=label,
        world_size=world_size,
        interval=interval,
        assumptions=assumptions(request, model, resolved, label, _batch_size(tables, cal.cell_id)),
        body=doc,
        lines=(_table(main, idle, label, world_size, cal.cell_id),),
        notes=tuple(text),
    )


def in_sample_text(doc: dict[str, Any]) -> str:
    """The ``in_sample`` document as one line."""
    line = (
        f"in sample ({len(doc['cells'])} calibration cell(s) at cap "
        f"{cap_label(doc['bucket_cap_mb'], with_size=True)}, world size {doc['world_size']}): step "
        f"{doc['predicted_step_ns'] / 1e6:.2f} ms predicted, {doc['measured_step_ns'] / 1e6:.2f} "
        f"measured ({doc['step_error']:+.1%})"
    )
    if doc["measured_exposed_ns"] is not None:
        line += (
            f"; exposed {doc['predicted_exposed_ns'] / 1e6:.2f} ms predicted, "
            f"{doc['measured_exposed_ns'] / 1e6:.2f} measured "
            f"({doc['exposed_error_of_step']:+.1%} of the step)"
        )
    return line


def _table(main: CapPrediction, idle: CapPrediction, label: str, ws: int, cell: str) -> str:
    cap = cap_label(main.bucket_cap_mb, with_size=True)
    lines = [
        f"step simulator calibrated on cell {cell}; link: {label}; world size {ws}; cap {cap}; "
        "buckets of the slowest rank",
        f"{'bucket':>6} {'MiB':>9} {'ready ms':>9} {'start ms':>9} {'end ms':>9} {'idle ms':>8}",
    ]
    for b in main.prediction.buckets:
        lines.append(
            f"{b.index:>6} {b.num_bytes / MIB:>9.3f} {b.ready_ns / 1e6:>9.3f} "
            f"{b.start_ns / 1e6:>9.3f} {b.end_ns / 1e6:>9.3f} {b.service_ns / 1e6:>8.3f}"
        )
    eff = main.overlap_efficiency
    exposed_residual = main.prediction.exposed_residual_ns
    residual = main.prediction.host_residual_ns
    lines.append(
        f"step {main.step_ns / 1e6:.2f} ms ({main.step_ns_range[0] / 1e6:.2f} to "
        f"{main.step_ns_range[1] / 1e6:.2f})"
        + (f" with {residual / 1e6:+.2f} host residual" if residual else "")
        + f", exposed communication {main.exposed_ns / 1e6:.2f} ms "
        f"({main.exposed_ns_range[0] / 1e6:.2f} to {main.exposed_ns_range[1] / 1e6:.2f})"
        + (f" with {exposed_residual / 1e6:+.2f} exposed residual" if exposed_residual else "")
        + f", overlap efficiency {'n/a' if not math.isfinite(eff) else f'{eff:.2f}'}"
    )
    lines.append(
        f"idle ring model (every correction off): step {idle.step_ns / 1e6:.2f} ms, exposed "
        f"{idle.exposed_ns / 1e6:.2f} ms"
    )
    return "\n".join(lines)
