"""The step model's part of the Recommendations section, and its Findings bullet.

Renders the tables of ``reporting.predicted``: the predicted cap per (model, world size) beside
the measured step where that cap ran, the model's out-of-sample error on the caps it was not
calibrated on, and the advice on two bundled clusters (the collective model). Every number in
the prose goes through ``prose.Quotes``; every prediction is called one. This module imports no
torch and no ray.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from commprof.analysis.dataset import Processed
from commprof.analysis.dataset import rows as records
from commprof.caps import cap_label
from commprof.modeling.step.cap_advice import TIE_TOLERANCE
from commprof.reporting import predicted, prose
from commprof.reporting.report_tables import MISSING, booktabs, fmt


def _cap(value: float | None) -> str:
    return prose.escape(cap_label(value))


def _tcap(value: float | None) -> str:
    return _cap(value).replace(" ", "~")


def _baseline(text: str) -> str:
    """A verdict's baseline (``cap_advice.baseline_label``) in the prose: its sizes are
    configuration labels, tied to their unit as every cap label of the text."""
    return prose.escape(text).replace(" MiB", "~MiB")


def _key(r: Any) -> str:
    return f"[{r.model},p={int(r.world_size)}]"


def _ms(value_ns: float) -> str:
    return fmt(value_ns / 1e6, 2) if math.isfinite(value_ns) else MISSING


BASIS_MODEL = "model"
"""The step basis column: predicted on the model, out of sample."""
BASIS_OWN = "model, not its cells"
"""The step basis at the calibration cap: the model too (the residuals that would give it its
measurement back left out, as for every cap compared), so it differs from "measured"."""


def _advice_table(advice: pd.DataFrame) -> tuple[str, str]:
    """The table and the caption's description of its optional columns."""
    changed = advice["moved"].any()
    measured = advice["measured_best_ns"].notna().any()
    tied = advice["tie_from_mb"].notna().any()
    columns = [("model", "l"), ("$p$", "r"), ("calibrated at", "l"), ("predicted cap", "l")]
    columns += [("as fast from", "l")] if tied else []
    columns += [("step (ms)", "r"), ("range (ms)", "r"), ("step basis", "l")]
    columns += [("measured (ms)", "r")] if measured else []
    columns += [("gain (\\%)", "r")] if changed else []
    columns += [("verdict", "l")]
    rows = []
    for r in records(advice):
        row = [prose.escape(r.model), str(int(r.world_size)), _cap(r.calibration_cap_mb)]
        row += [_cap(r.best_cap_mb)]
        row += [_cap(r.tie_from_mb) if math.isfinite(r.tie_from_mb) else MISSING] if tied else []
        row += [_ms(r.best_step_ns), f"{_ms(r.best_low_ns)}--{_ms(r.best_high_ns)}"]
        # every cap on the model, the calibrated one too: its step is not its measurement
        row += [BASIS_OWN if not r.moved else BASIS_MODEL]
        row += [_ms(r.measured_best_ns)] if measured else []
        same = not r.moved
        row += [MISSING if same else fmt(100.0 * r.predicted_gain, 1)] if changed else []
        row += [prose.escape(str(r.verdict_kind))]
        rows.append(row)
    notes = []
    if tied:
        notes.append(
            "as fast from: every cap searched from this one up is predicted at the same step"
        )
    if measured:
        notes.append(
            "measured: the median step where the predicted cap ran (unprofiled, repeats "
            f"pooled; {MISSING}: not run; at the calibration cap, the cells the model was "
            "calibrated on)"
        )
    if changed:
        notes.append(f"gain: predicted, over the calibration cap ({MISSING}: the same cap)")
    return booktabs(columns, rows, size="footnotesize", colsep_pt=4), "; ".join(notes)


def _oos_table(oos: pd.DataFrame) -> str:
    columns = [("model", "l"), ("$p$", "r"), ("cap", "l"), ("predicted (ms)", "r")]
    columns += [("range (ms)", "r"), ("measured (ms)", "r"), ("error (\\%)", "r")]
    rows = [
        [
            prose.escape(r.model),
            str(int(r.world_size)),
            _cap(r.bucket_cap_mb),
            _ms(r.predicted_ns),
            f"{_ms(r.low_ns)}--{_ms(r.high_ns)}",
            _ms(r.measured_ns),
            fmt(r.error_pct, 1),
        ]
        for r in records(oos)
    ]
    return booktabs(columns, rows, size="footnotesize", colsep_pt=4)


def _what_if_table(frame: pd.DataFrame) -> str:
    # the calibration's ranks and the GPUs predicted for are two numbers: each named
    columns = [("model", "l"), ("calibrated on $p$", "r"), ("cluster", "l")]
    columns += [("predicted for GPUs", "r")]
    columns += [("predicted cap", "l"), ("step (ms)", "r"), ("exposed (ms)", "r")]
    rows = [
        [
            prose.escape(r.model),
            str(int(r.world_size)),
            prose.escape(r.cluster),
            str(int(r.cluster_world_size)),
            _cap(r.best_cap_mb),
            _ms(r.best_step_ns),
            _ms(r.best_exposed_ns),
        ]
        for r in records(frame)
    ]
    return booktabs(columns, rows, size="footnotesize", colsep_pt=4)


def _advice_sentences(advice: pd.DataFrame, q: prose.Quotes) -> list[str]:
    same, moved = advice[~advice["moved"]], advice[advice["moved"]]
    out = [
        "Table~\\ref{tab:step_advice} gives the step model's prediction: calibrated on one "
        "configuration per model and world size (its repeats pooled), it names the cap with "
        "the shortest predicted step among the powers of two from 0.125~MiB to 512~MiB and "
        "the caps run here."
    ]
    if len(same):
        pairs = [f"{prose.escape(r.model)} on {int(r.world_size)} ranks" for r in records(same)]
        who = "every model and world size here" if len(pairs) > 1 and not len(moved) else None
        who = who or prose.words(pairs)
        bases = _baseline(" or ".join(sorted({str(b) for b in same["baseline"]})))
        out.append(
            f"For {who} it predicts the cap it was calibrated at ({bases}) "
            f"within {q.pct('step_tie_tolerance', TIE_TOLERANCE, 0)}\\% of the cap it would name: "
            "verdict, keep that cap."
        )
    for r in records(moved):
        if r.verdict_kind == "no measurable difference":
            out.append(
                f"For {prose.escape(r.model)} on {int(r.world_size)} ranks it predicts "
                f"{_tcap(r.best_cap_mb)} a step "
                f"{q.pct('step_pred_gain' + _key(r), r.predicted_gain)}\\% shorter than "
                f"{_baseline(r.baseline)}, inside both predicted ranges: verdict, no "
                "measurable difference (keep the cap in use)."
            )
            continue
        text = (
            f"For {prose.escape(r.model)} on {int(r.world_size)} ranks it predicts "
            f"{_tcap(r.best_cap_mb)}, a step {q.pct('step_pred_gain' + _key(r), r.predicted_gain)}"
            f"\\% shorter than {_baseline(r.baseline)} (predicted; from "
            f"{q.pct('step_pred_gain_low' + _key(r), r.gain_low)}\\% to "
            f"{q.pct('step_pred_gain_high' + _key(r), r.gain_high)}\\% across the "
            "calibration's uncertainty)"
        )
        if math.isfinite(r.measured_gain):
            text += (
                f"; measured, that cap's median step is "
                f"{q.pct('step_meas_gain' + _key(r), r.measured_gain)}\\% shorter"
            )
        else:
            text += "; that cap was not run here"
        out.append(text + f": verdict, change to {_tcap(r.best_cap_mb)}.")
    return out


def _discrimination(advice: pd.DataFrame, oos: pd.DataFrame, q: prose.Quotes) -> str:
    """Whether the model tells apart the caps run here, and if so whether it picks the
    measured fastest (predicted steps at every cap run: the calibration cap and ``oos``)."""
    if oos.empty:
        return ""
    told = agree = 0
    for r in records(advice):
        mine = oos[(oos["model"] == r.model) & (oos["world_size"] == r.world_size)]
        if mine.empty:
            continue
        pred = [r.cal_step_ns, *mine["predicted_ns"]]
        meas = [r.measured_cal_ns, *mine["measured_ns"]]
        if min(pred) == max(pred) or not all(math.isfinite(m) for m in meas):
            continue
        told += 1
        agree += int(pred[meas.index(min(meas))] == min(pred))  # the measured fastest cap
    pairs = advice.merge(oos[["model", "world_size"]].drop_duplicates())
    if not told:
        return (
            "At every model and world size run with more than one cap, the model predicts the "
            "same step at each cap run, so it cannot tell them apart."
        )
    return (
        f"Of the {q.count('step_pairs_multi_cap', len(pairs))} model and world size pairs run "
        f"with more than one cap, it predicts different steps at the caps run for "
        f"{q.count('step_pairs_told', told)}; in {q.count('step_pairs_agree', agree)} of these "
        "the measured fastest cap is one it predicts fastest."
    )


def _oos_sentences(oos: pd.DataFrame, q: prose.Quotes) -> list[str]:
    if oos.empty:
        return [
            "No model ran at a cap other than the one the step model was calibrated on, so "
            "this dataset has no out-of-sample check of it and says nothing of its accuracy."
        ]
    err = oos["error_pct"]
    inside = int(oos["in_range"].sum())
    sign = (
        "under-predicts every one"
        if (err < 0).all()
        else "over-predicts every one"
        if (err > 0).all()
        else f"has a median signed error of {q.num('step_oos_err_median_pct', err.median())}\\%"
    )
    return [
        f"Out of sample, on the {q.count('step_oos_num', len(oos))} configurations run at "
        "another cap than their calibration cell's (Table~\\ref{tab:step_oos}), the model's "
        f"median absolute error on the median step is "
        f"{q.num('step_oos_abs_err_median_pct', err.abs().median())}\\% (largest "
        f"{q.num('step_oos_abs_err_max_pct', err.abs().max())}\\%); it {sign}, and "
        f"{q.count('step_oos_in_range', inside)} measured "
        f"{prose.plural(inside, 'median falls', 'medians fall')} inside the predicted range."
    ]


def _what_if_sentences(frame: pd.DataFrame, q: prose.Quotes) -> list[str]:
    clusters = predicted.what_if_clusters()
    names = [f"{prose.escape(c.cluster.name)} at {gpus} GPUs" for c, gpus in clusters]
    out = [
        f"Table~\\ref{{tab:what_if}} is a what-if, predicted only: the same cap search on "
        f"{prose.words(names)}, each all-reduce the time the collective model gives for NCCL on "
        "that cluster's description (algorithm and protocol by size and scale, across its "
        "nodes), the measured compute timeline and interference kept (nothing here ran on those "
        "clusters)."
    ]
    if (frame["best_exposed_ns"] == 0).all():
        out.append(
            "On both it predicts no exposed communication at any model and world size here: on "
            "those clusters the compute measured here would hide every all-reduce."
        )
    else:
        exposed = [
            f"{q.ms(f'whatif_exposed_max_ms[{name}]', worst)}~ms on {prose.escape(name)}"
            for c, _ in clusters
            for name in [c.cluster.name]
            for worst in [float(frame.loc[frame["cluster"] == name, "best_exposed_ns"].max())]
        ]
        out.append(f"The largest exposed communication it predicts is {prose.words(exposed)}.")
    return out


def step_paragraphs(
    data: Processed, advice: pd.DataFrame, q: prose.Quotes
) -> tuple[list[str], list[str]]:
    """The predicted part of Recommendations: paragraphs and tables (``advice`` not empty)."""
    oos = predicted.out_of_sample(data)
    frame = predicted.what_if(data)
    paragraphs = [
        prose.paragraph([*_advice_sentences(advice, q), _discrimination(advice, oos, q)]),
        prose.paragraph(_oos_sentences(oos, q)),
        prose.paragraph(_what_if_sentences(frame, q)),
    ]
    fragment, notes = _advice_table(advice)
    caption = _ADVICE_CAPTION + (f"; {notes}." if notes else ".")
    floats = [prose.table("step_advice", caption, fragment, here=True)]
    if not oos.empty:
        floats.append(prose.table("step_oos", _OOS_CAPTION, _oos_table(oos), here=True))
    described = "; ".join(
        f"{prose.escape(c.cluster.name)}: {prose.escape(c.cluster.description)}"
        for c, _ in predicted.what_if_clusters()
    )
    caption = _WHAT_IF_CAPTION.format(clusters=described)
    floats.append(prose.table("what_if", caption, _what_if_table(frame), here=True))
    return paragraphs, floats


def step_finding(data: Processed, q: prose.Quotes) -> str:
    """The Findings bullet on the step model's out-of-sample error ('' where there is none)."""
    oos = predicted.out_of_sample(data)
    if oos.empty:
        return ""
    err = oos["error_pct"]
    sign = (
        ", under-predicting every one"
        if (err < 0).all()
        else ", over-predicting every one"
        if (err > 0).all()
        else ""
    )
    return (
        f"The step model predicts the median training step, out of sample (caps it was not "
        f"calibrated at), with a median absolute error of "
        f"{q.num('step_oos_abs_err_median_pct', err.abs().median())}\\% over "
        f"{q.count('step_oos_num', len(oos))} configurations{sign} "
        "(Section~\\ref{sec:recommend})."
    )


_ADVICE_CAPTION = (
    "Predicted: the step model's cap per model and world size, calibrated on one configuration "
    "(its repeats pooled; the link a fit of the host's microbenchmarks plus their expected "
    "stall per all-reduce, and two residuals fitted so that the model gives the configuration's "
    "measured step and exposed communication there, and there only: the caps are compared "
    "without them) at the cap named, and its predicted median step "
    "with the range under the calibration's uncertainty (link fit at its 95\\% interval ends, "
    "interference at its quartiles); caps predicted within "
    f"{fmt(100 * TIE_TOLERANCE, 0)}\\% of the fastest count as tied and the one with fewest "
    "buckets is named, or the calibration cap where it is predicted within as much of that one"
)
_OOS_CAPTION = (
    "Out of sample: the step model's predicted median step at each cap run here other than its "
    "calibration cell's (the model alone, as the caps are compared: a cap that makes the "
    "calibration's buckets is predicted, not given the calibration's measurement), against the "
    "measured median step (unprofiled, repeats pooled); error "
    "$100\\,(\\mathrm{predicted} - \\mathrm{measured})/\\mathrm{measured}$."
)
_WHAT_IF_CAPTION = (
    "What-if, predicted only: the step model's cap and median step on a bundled cluster at the "
    "GPUs named, each all-reduce the collective model's for NCCL on the cluster's description "
    "(not calibrated; its error against public nccl-tests results is in the project's "
    "benchmarks), the calibration's compute timeline and interference kept ({clusters})."
)
