"""The bucket cap to use per model and world size: the Recommendations section of the main report.

One function, :func:`recommendations`, takes the processed dataset and returns the section (text
and table) or None where the dataset has no model and world size run with two caps or more.

Measured: per (model, world size) with at least two caps among the unprofiled configurations,
the cap whose median step was shortest, its median step, and the gain over the slowest cap
measured, with whether the interquartile ranges of the two separate them. Predicted (the step
model, ``reporting.predicted``): per (model, world size) with a calibratable cell, the cap with
the shortest predicted step and its gain over the calibration cell's cap, beside the measured
step where that cap ran; the model's error on the caps it was not calibrated on (out of sample
only: with one cap per model there is no check and no claim of accuracy); and the advice on two
published interconnects, every number of it marked predicted. This module imports no torch and
no ray.
"""

from __future__ import annotations

from typing import Any, cast

import pandas as pd

from commprof.analysis.dataset import Processed
from commprof.analysis.dataset import rows as records
from commprof.caps import cap_label
from commprof.reporting import predicted, prose
from commprof.reporting.recommend_step import step_paragraphs
from commprof.reporting.report_tables import booktabs, fmt


def cap_choices(data: Processed) -> pd.DataFrame:
    """Per (model, world size) run with two caps or more (unprofiled): fastest and slowest cap.

    Returns:
        Columns ``model, world_size, num_caps, best_cap_mb, best_step_ns, best_p75_ns,
        worst_cap_mb, worst_step_ns, worst_p25_ns, gain`` (``1 - best / worst``) and
        ``separated`` (the best cap's 75th percentile below the slowest cap's 25th).
    """
    merged = data.merged[~data.merged["profile"].astype(bool)]
    rows = []
    for key, part in merged.groupby(["model", "world_size"], sort=True):
        model, ws = cast(tuple[str, int], key)
        if len(part) < 2:
            continue
        ordered = part.sort_values("step_ns_median")
        best, worst = ordered.iloc[0], ordered.iloc[-1]
        rows.append(
            {
                "model": model,
                "world_size": int(ws),
                "num_caps": len(part),
                "best_cap_mb": best["bucket_cap_mb"],
                "best_step_ns": float(best["step_ns_median"]),
                "best_p75_ns": float(best["step_ns_p75"]),
                "worst_cap_mb": worst["bucket_cap_mb"],
                "worst_step_ns": float(worst["step_ns_median"]),
                "worst_p25_ns": float(worst["step_ns_p25"]),
                "gain": 1.0 - float(best["step_ns_median"]) / float(worst["step_ns_median"]),
                "separated": bool(best["step_ns_p75"] < worst["step_ns_p25"]),
            }
        )
    return pd.DataFrame(rows)


def cap_text(bucket_cap_mb: float | None) -> str:
    """A cap as LaTeX text that never breaks across lines (``25~MiB``)."""
    return prose.escape(cap_label(bucket_cap_mb)).replace(" ", "~")


def _table(choices: pd.DataFrame) -> str:
    rows = [
        [
            prose.escape(r.model),
            str(int(r.world_size)),
            str(int(r.num_caps)),
            prose.escape(cap_label(r.best_cap_mb)),
            fmt(r.best_step_ns / 1e6, 2),
            prose.escape(cap_label(r.worst_cap_mb)),
            fmt(r.worst_step_ns / 1e6, 2),
            fmt(100.0 * r.gain, 1),
            "yes" if r.separated else "no",
        ]
        for r in records(choices)
    ]
    columns = [
        ("model", "l"),
        ("$p$", "r"),
        ("caps", "r"),
        ("fastest cap", "l"),
        ("step (ms)", "r"),
        ("slowest cap", "l"),
        ("step (ms)", "r"),
        ("gain (\\%)", "r"),
        ("IQRs apart", "l"),
    ]
    return booktabs(columns, rows, size="footnotesize", colsep_pt=4)


def _measured(choices: pd.DataFrame, quotes: prose.Quotes) -> tuple[list[str], list[str]]:
    """The measured cap choice: its sentences and its table."""
    sentences = [
        "Table~\\ref{tab:recommend} gives, for every model and world size run with more than "
        "one bucket cap, the cap whose median step was shortest, as measured here (no "
        "prediction enters it)."
    ]
    apart = choices[choices["separated"]]
    if len(apart):
        top: Any = records(apart.sort_values("gain", ascending=False))[0]
        key = f"{top.model},p={int(top.world_size)}"
        sentences.append(
            f"The largest gain whose interquartile ranges do not overlap is "
            f"{quotes.pct(f'rec_gain[{key}]', top.gain)}\\% for {prose.escape(top.model)} on "
            f"{int(top.world_size)} ranks: use {cap_text(top.best_cap_mb)} "
            f"rather than {cap_text(top.worst_cap_mb)}."
        )
    else:
        sentences.append(
            "In every case the interquartile ranges of the fastest and the slowest cap "
            "overlap: this dataset does not show that any cap is better than another."
        )
    caption = (
        "Bucket cap with the shortest median step per model and world size (unprofiled "
        "configurations, repeats pooled), the slowest cap measured, and the gain "
        "$1 - \\mathrm{fastest}/\\mathrm{slowest}$; IQRs apart: the fastest cap's 75th "
        "percentile is below the slowest cap's 25th. Measured, not predicted."
    )
    return sentences, [prose.table("recommend", caption, _table(choices), here=True)]


def recommendations(data: Processed, quotes: prose.Quotes) -> prose.Section | None:
    """The Recommendations section: the cap to use per model and world size, measured and
    predicted by the step model.

    Args:
        data: the processed dataset.
        quotes: the report's quote registry.

    Returns:
        The section, or None where no (model, world size) ran with two caps or more and none
        has a cell the step model can be calibrated on.
    """
    choices = cap_choices(data)
    advice = predicted.cap_advice(data)
    if choices.empty and advice.empty:
        return None
    paragraphs: list[str] = []
    floats: list[str] = []
    if not choices.empty:
        sentences, tables = _measured(choices, quotes)
        paragraphs.append(prose.paragraph(sentences))
        floats += tables
    if not advice.empty:
        texts, tables = step_paragraphs(data, advice, quotes)
        paragraphs += texts
        floats += tables
    return prose.Section(
        title="Recommendations",
        label="recommend",
        body="\n\n".join(paragraphs),
        floats=floats,
    )
