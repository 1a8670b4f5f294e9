"""Booktabs table fragments from the processed dataset (``generated/tab_<name>.tex``).

No number in a report is typed by hand: every table is generated here and every number the
prose quotes goes through ``commprof.reporting.prose.Quotes``. This module imports no torch and
no ray.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from commprof.analysis.dataset import Processed
from commprof.analysis.dataset import rows as frame_rows
from commprof.caps import cap_label, cap_number
from commprof.reporting.prose import LONG_CAPTION, escape

MISSING = "--"
"""Shown in a table cell whose value is undefined (NaN); prose never prints it."""


def fmt(value: float | int | None, digits: int = 2) -> str:
    """A number as the reports print it: fixed decimals, thousands separated by commas.

    Args:
        value: the number (NaN or None prints :data:`MISSING`).
        digits: decimals.

    Returns:
        The text, e.g. ``1,234.50``.
    """
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    text = f"{float(value):,.{digits}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.,") else text  # no "-0"


def fmt_int(value: float | int | None) -> str:
    """An integer count, thousands separated by commas."""
    return fmt(value, 0)


LONG_ROWS = 40
"""A table with more body rows than this is a ``longtable``: it breaks across pages, its
column names repeated on each, where a float taller than the page would be cut off."""


def booktabs(
    columns: Sequence[tuple[str, str]],
    rows: Iterable[Sequence[str]],
    *,
    size: str = "small",
    colsep_pt: float | None = None,
    head: str = "",
) -> str:
    """A booktabs ``tabular`` (or ``tabularx`` when a column spec is ``X``) fragment; a
    ``longtable`` past :data:`LONG_ROWS` rows.

    Args:
        columns: (header, column spec) per column; header text is LaTeX.
        rows: cell texts, already LaTeX.
        size: a LaTeX font size command name (``small``, ``footnotesize``, ``scriptsize``).
        colsep_pt: ``\\tabcolsep`` in pt (None: the class default).
        head: a header row above the column names (with its rules), or empty.

    Returns:
        The fragment.
    """
    spec = "".join(c[1] for c in columns)
    body = [" & ".join(row) + r" \\" for row in rows]
    if not body:
        body = [rf"\multicolumn{{{len(columns)}}}{{l}}{{\emph{{none in this dataset}}}} \\"]
    env = "tabularx" if "X" in spec else "tabular"
    names = [" & ".join(c[0] for c in columns) + r" \\", r"\midrule"]
    if len(body) > LONG_ROWS and env == "tabular":
        top = [r"\toprule", *([head] if head else []), *names]
        lines = [r"\begingroup", f"\\{size}"]
        if colsep_pt is not None:
            lines.append(f"\\setlength{{\\tabcolsep}}{{{colsep_pt:g}pt}}")
        lines += [rf"\begin{{longtable}}{{{spec}}}", LONG_CAPTION, *top, r"\endfirsthead"]
        lines += [*top, r"\endhead", r"\bottomrule", r"\endlastfoot", *body]
        lines += [r"\end{longtable}", r"\endgroup"]
        return "\n".join(lines) + "\n"
    width = "{\\linewidth}" if env == "tabularx" else ""
    lines = [f"\\{size}"]
    if colsep_pt is not None:
        lines.append(f"\\setlength{{\\tabcolsep}}{{{colsep_pt:g}pt}}")
    lines += [rf"\begin{{{env}}}{width}{{{spec}}}", r"\toprule"]
    if head:
        lines.append(head)
    lines += [*names, *body, r"\bottomrule"]
    lines.append(rf"\end{{{env}}}")
    return "\n".join(line for line in lines if line) + "\n"


def _ms(ns: float) -> str:
    return fmt(ns / 1e6, 2)


PROFILED_NOTE = " $^\\dagger$ run under the profiler."
"""What a table's caption adds where a dagger marks a profiled row (:func:`profiled_note`)."""


def profiled_note(frame: object) -> str:
    """:data:`PROFILED_NOTE` where ``frame`` (a DataFrame with ``profile``) has a profiled row."""
    import pandas as pd

    assert isinstance(frame, pd.DataFrame)
    if "profile" not in frame or frame.empty:
        return ""
    return PROFILED_NOTE if frame["profile"].fillna(False).astype(bool).any() else ""


def model_cell(model: str, profile: object) -> str:
    """The model column: a dagger marks a profiled configuration (the caption says so)."""
    return escape(model) + ("$^\\dagger$" if bool(profile) else "")


def table_results(data: Processed) -> str:
    """Per configuration (repeats pooled): step time, exposed, overlap, all-reduce vs model."""
    per_cell = data.summary.groupby("config_key")[
        ["allreduce_sum_measured_ns", "allreduce_sum_modelled_ns", "allreduce_error_pct"]
    ].median()
    merged = data.merged.join(per_cell, on="config_key") if len(data.merged) else data.merged
    rows = [
        [
            model_cell(r.model, r.profile),
            str(int(r.world_size)),
            cap_number(r.bucket_cap_mb),
            str(int(r.num_repeats)),
            f"{_ms(r.step_ns_median)} [{_ms(r.step_ns_p25)}, {_ms(r.step_ns_p75)}]",
            _ms(r.exposed_ns_median),
            fmt(r.overlap_efficiency_median, 2),
            _ms(r.allreduce_sum_measured_ns),
            _ms(r.allreduce_sum_modelled_ns),
            fmt(r.allreduce_error_pct, 0),
        ]
        for r in frame_rows(merged)
    ]
    columns = [
        ("model", "l"),
        ("$p$", "r"),
        ("cap (MiB)", "r"),
        ("repeats", "r"),
        ("step (ms) [IQR]", "r"),
        ("exposed (ms)", "r"),
        ("overlap", "r"),
        ("all-red. (ms)", "r"),
        ("model (ms)", "r"),
        ("err. (\\%)", "r"),
    ]
    return booktabs(columns, rows, size="footnotesize", colsep_pt=4)


def table_fits(data: Processed) -> str:
    """The calibrated ring model per group, its in-sample and its out-of-sample error.

    One in-sample error: the MAPE over the points the fit was fitted to (every ok cell's p50 per
    microbenchmark size), ``modelled.fits_frame``. Out of sample: every gradient bucket of
    training against its median service time (``modelled.accuracy``).
    """
    keys = ["backend", "regime", "world_size"]
    table = data.fit_params.merge(data.accuracy, on=keys, how="left", suffixes=("", "_acc"))
    rows = [
        [
            escape(r.regime),
            str(int(r.world_size)),
            alpha_cell(r.alpha_ns, r.alpha_lo_ns, r.alpha_hi_ns),
            fmt(r.bandwidth_bytes_per_s / 1e6, 0),
            str(int(r.num_points)),
            fmt(r.fit_mape_pct, 1),
            fmt_int(r.num_buckets),
            fmt(r.bucket_mape_pct, 1),
            fmt(r.bucket_median_error_pct, 1),
        ]
        for r in frame_rows(table)
    ]
    columns = [
        ("regime", "l"),
        ("$p$", "r"),
        ("$\\alpha$ ($\\mu$s) [95\\% CI]", "r"),
        ("$1/\\beta$ (MB/s)", "r"),
        ("points", "r"),
        ("MAPE (\\%)", "r"),
        ("buckets", "r"),
        ("MAPE (\\%)", "r"),
        ("median err. (\\%)", "r"),
    ]
    head = (
        "\\multicolumn{4}{c}{fit} & \\multicolumn{2}{c}{in sample} & "
        "\\multicolumn{3}{c}{out of sample: buckets in training} \\\\\n"
        "\\cmidrule(lr){1-4}\\cmidrule(lr){5-6}\\cmidrule(lr){7-9}"
    )
    return booktabs(columns, rows, size="footnotesize", colsep_pt=4, head=head)


def alpha_cell(alpha_ns: float, lo_ns: float, hi_ns: float) -> str:
    """A latency in us with its interval: ``41.2 [12.0, 70.3]``; an interval whose lower end is
    below zero (a latency cannot be) reads ``[< 0, 302.8]``: the fit does not tell the latency
    from zero (the caption says so)."""
    low = "$<$ 0" if lo_ns < 0 else fmt(lo_ns / 1e3, 1)
    return f"{fmt(alpha_ns / 1e3, 1)} [{low}, {fmt(hi_ns / 1e3, 1)}]"


def table_status(data: Processed) -> str:
    """Every cell: configuration, final status, attempts and the one-line reason (the reason
    column only where some cell has one)."""
    with_reason = bool((data.status["reason_short"].fillna("") != "").any())
    rows = [
        [
            rf"\texttt{{{r.cell_id[:8]}}}",
            model_cell(r.model, r.profile),
            str(int(r.world_size)),
            cap_number(r.bucket_cap_mb),
            str(int(r.repeat)),
            escape(r.status),
            str(int(r.num_attempts)),
            *([escape(r.reason_short)] if with_reason else []),
        ]
        for r in frame_rows(data.status)
    ]
    columns = [
        ("cell", "l"),
        ("model", "l"),
        ("$p$", "r"),
        ("cap", "r"),
        ("repeat", "r"),
        ("status", "l"),
        ("attempts", "r"),
        *([("reason", ">{\\raggedright\\arraybackslash}X")] if with_reason else []),
    ]
    return booktabs(columns, rows, size="scriptsize" if with_reason else "small", colsep_pt=4)


def table_repeatability(data: Processed) -> str:
    """Coefficient of variation and max/min ratio of the repeats' medians."""
    rows = [
        [
            model_cell(r.model, r.profile),
            str(int(r.world_size)),
            cap_number(r.bucket_cap_mb),
            escape(r.metric.removesuffix("_ns").replace("_", " ")),
            str(int(r.num_repeats)),
            fmt(100.0 * r.cv, 1),
            fmt(r.max_min_ratio, 2),
        ]
        for r in frame_rows(data.repeatability.dropna(subset=["cv", "max_min_ratio"]))
    ]
    columns = [
        ("model", "l"),
        ("$p$", "r"),
        ("cap (MiB)", "r"),
        ("metric (median)", "l"),
        ("repeats", "r"),
        ("CV (\\%)", "r"),
        ("max/min", "r"),
    ]
    return booktabs(columns, rows)


def table_overhead(data: Processed) -> str:
    """Hook critical-path time per cell, absolute and as a share of the median step."""
    config = ["model", "world_size", "bucket_cap_mb", "profile", "repeat"]
    hook = data.hook_overhead.merge(
        data.summary[["cell_id", *config, "step_ns_median"]]
    ).sort_values(config)
    rows = [
        [
            model_cell(r.model, r.profile),
            str(int(r.world_size)),
            cap_number(r.bucket_cap_mb),
            str(int(r.repeat)),
            fmt(r.hook_median_ns / 1e3, 1),
            fmt(r.hook_p95_ns / 1e3, 1),
            _ms(r.hook_per_step_ns),
            fmt(100.0 * r.hook_per_step_ns / r.step_ns_median, 1),
        ]
        for r in frame_rows(hook)
    ]
    columns = [
        ("model", "l"),
        ("$p$", "r"),
        ("cap (MiB)", "r"),
        ("repeat", "r"),
        ("median ($\\mu$s)", "r"),
        ("p95 ($\\mu$s)", "r"),
        ("per step (ms)", "r"),
        ("of step (\\%)", "r"),
    ]
    return booktabs(columns, rows)


def guard_arithmetic(data: Processed) -> str:
    """The memory guard's arithmetic of every rejected cell, and the errors of failed attempts."""
    parts = []
    for r in frame_rows(data.status):
        if r.status == "ok" and not r.reason:
            continue
        head = f"{escape(r.model)}, $p={int(r.world_size)}$, cap {cap_label(r.bucket_cap_mb)}"
        title = rf"\item[\texttt{{{r.cell_id}}}] {head}: \textbf{{{escape(r.status)}}}"
        title += f" after {int(r.num_attempts)} attempt(s)"
        if r.error_kind:
            title += f" ({escape(r.error_kind)})"
        lines = [escape(ln.strip()) for ln in str(r.reason).splitlines() if ln.strip()]
        body = r" \\ ".join(rf"\texttt{{{ln}}}" for ln in lines)
        parts.append(f"{title}\\\\\n{{\\footnotesize\\raggedright {body}\\par}}")
    if not parts:
        return "No cell was rejected and no attempt failed.\n"
    return "\\begin{description}\n" + "\n".join(parts) + "\n\\end{description}\n"


TABLES = {
    "results": table_results,
    "fits": table_fits,
    "status": table_status,
    "repeatability": table_repeatability,
    "overhead": table_overhead,
    "arithmetic": guard_arithmetic,
}
"""Every generated fragment by name (``generated/tab_<name>.tex``)."""


def write_latex_tables(data: Processed, out_dir: Path) -> list[Path]:
    """Write every fragment of ``TABLES`` into ``out_dir``.

    Args:
        data: the processed dataset.
        out_dir: the ``generated`` folder (created).

    Returns:
        The files written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in TABLES.items():
        path = out_dir / f"tab_{name}.tex"
        path.write_text(make(data), encoding="ascii")
        paths.append(path)
    return paths
