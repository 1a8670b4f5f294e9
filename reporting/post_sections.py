"""The engineering postmortem's sections, each a function of the processed dataset.

Like ``main_sections``: a section or sentence appears only where the dataset supports it, and
every number goes through :class:`prose.Quotes`. Claims about the host (its load, whether it
was oversubscribed) are made only from what the cells recorded. This module imports no torch
and no ray.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from commprof.analysis.dataset import Processed
from commprof.query import is_ok
from commprof.reporting import instrument, prose, report_tables
from commprof.reporting.figures import hook_vs_trace
from commprof.reporting.main_sections import environment_sentence, fig_ref, sources, tab_ref
from commprof.reporting.prose import Quotes, Section, named, paragraph, plural, words


def what_ran(data: Processed, q: Quotes) -> Section:
    """Cells by final status, attempts and retries; the status table."""
    status = data.status
    counts = status["status"].value_counts()
    retried = int((is_ok(status) & (status["num_attempts"] > 1)).sum())
    num_attempts = len(data.tables["cells"])
    parts = []
    for name, words_ in (
        ("ok", "ok"),
        ("failed", "failed"),
        ("rejected", "rejected by the memory guard before they ran"),
    ):
        n = int(counts.get(name, 0))
        if n:
            parts.append(f"{q.count(f'num_cells_{name}', n)} {words_}")
    sentences = [
        f"The dataset holds {q.count('num_cells', len(status))} {plural(len(status), 'cell')} "
        f"{sources(data)}, run in {q.count('num_attempts', num_attempts)} "
        f"{plural(num_attempts, 'attempt')}: {words(parts)}."
    ]
    if retried:
        sentences.append(
            f"{q.count('num_cells_retried', retried)} ok {plural(retried, 'cell')} succeeded "
            "only after a failed attempt."
        )
    if is_ok(status).all() and not retried:
        sentences.append("No cell failed or was rejected, and no attempt failed.")
    sentences.append(f"{tab_ref('status')} lists every cell with its final status.")
    caption = (
        "Every cell: final status, number of attempts and the reason (first line; the full "
        "text follows in Section~\\ref{sec:arith})."
        if _has_failures(data)
        else "Every cell: final status and number of attempts."
    ) + report_tables.profiled_note(status)
    return Section(
        title="What ran",
        body=paragraph(sentences),
        floats=[prose.table("status", caption, report_tables.table_status(data))],
    )


def _has_failures(data: Processed) -> bool:
    status = data.status
    return bool((~is_ok(status) | (status["num_attempts"] > 1)).any())


def failures(data: Processed) -> Section | None:
    """The guard's arithmetic of every rejected cell and the errors of failed attempts."""
    if not _has_failures(data):
        return None
    body = paragraph(
        [
            "For a rejected cell the memory guard's arithmetic is printed as it was recorded: "
            "every term of every pool it draws on, the sum and the budget.",
            "For a failed attempt the ranks' errors are grouped by text, with the ranks that "
            "reported each; a failure classified as transient is retried up to the matrix's "
            "attempt limit, deterministic ones are not.",
        ]
    )
    return Section(
        title="Failed and rejected cells, with their arithmetic",
        label="arith",
        body=body + "\n\n" + report_tables.guard_arithmetic(data),
    )


def repeatability(data: Processed, q: Quotes) -> Section | None:
    """How far repeats disagree; absent without a configuration run twice."""
    rep = data.repeatability.dropna(subset=["cv", "max_min_ratio"])
    step = rep[rep["metric"] == "step_ns"]
    if step.empty:
        return None
    worst: Any = step.sort_values("cv").iloc[-1]
    sentences = [
        "Repeats of one configuration give one median per metric each; "
        f"{tab_ref('repeat')} shows how far they disagree: the coefficient of variation of the "
        "medians and the ratio of the largest to the smallest.",
        f"The largest step-time coefficient of variation is "
        f"{q.pct('max_step_cv_pct', worst.cv)}\\% (max/min "
        f"{q.num('max_step_cv_ratio', worst.max_min_ratio, 2)}, {named(q, worst, 'repeat')}).",
    ]
    lat = rep[rep["metric"] == "bucket_latency_ns"]
    if len(lat):
        sentences.append(
            "Repeats of the median bucket latency differ by up to a factor of "
            f"{q.num('max_latency_ratio', float(lat['max_min_ratio'].max()), 2)}."
        )
    caption = (
        "Disagreement between repeats: coefficient of variation (sample standard deviation over "
        "mean) and max/min ratio of the per-repeat medians."
    ) + report_tables.profiled_note(rep)
    return Section(
        title="Repeatability",
        body=paragraph(sentences),
        floats=[prose.table("repeat", caption, report_tables.table_repeatability(data))],
    )


def instrumentation(data: Processed, q: Quotes, figs: set[str]) -> Section | None:
    """What the timing hook and the profiler cost, and hook against trace where both exist."""
    hook = data.hook_overhead.merge(data.summary[["cell_id", "step_ns_median"]])
    if hook.empty:
        return None
    share = 100.0 * hook["hook_per_step_ns"] / hook["step_ns_median"]
    measured = not instrument.cost_frame(data).empty
    parts = [
        "\\paragraph{Timing hook.} Per bucket, the time from hook entry to the launched "
        "all-reduce is the hook's own clock reads plus the inner hook's work (dividing the "
        "gradients, enqueueing the all-reduce), which plain DDP does as well: an upper bound on "
        "what the timing adds to backward, not its cost. "
        f"Its median is {q.num('hook_median_us', float(hook['hook_median_ns'].median()) / 1e3)}"
        f"~$\\mu$s per bucket; summed per step it is a median "
        f"{q.num('hook_share_median_pct', float(share.median()))}\\% of the median step (at most "
        f"{q.num('hook_share_max_pct', float(share.max()))}\\%, {tab_ref('overhead')})."
        + (
            " What it costs beyond plain DDP is measured below."
            if measured
            else " " + instrument.not_measured(data)
        )
    ]
    if measured:
        parts.append(
            "\\paragraph{Hook against plain DDP.} "
            + paragraph(instrument.summary_sentences(data, q))
        )
    prof = data.profiler_overhead
    if len(prof):
        parts.append(
            "\\paragraph{Profiler.} The median step-time ratio of profiled to unprofiled runs of "
            f"one configuration is {q.num('profiler_ratio', float(prof['ratio'].median()), 2)}"
            + (
                "; below 1, the profiled run was the faster one, so the profiler's cost is not "
                "resolved by this dataset."
                if float(prof["ratio"].median()) < 1
                else "."
            )
        )
    trace = _hook_vs_trace_text(data, q, figs)
    if trace:
        parts.append(trace)
    floats = [
        prose.table(
            "overhead",
            "Hook critical path (hook entry to launched all-reduce, the inner hook's enqueue "
            "included) per ok cell: per bucket, per step, and as a share of the cell's median "
            "step." + report_tables.profiled_note(data.summary),
            report_tables.table_overhead(data),
        ),
        *instrument.table_float(data),
    ]
    if "hook_vs_trace" in figs:
        floats.append(
            prose.figure(
                "hook_vs_trace",
                "Overlap efficiency of the same profiled rank-steps, from the timing hook and "
                "from the profiler trace (box: quartiles; whiskers: 1.5 IQR).",
            )
        )
    return Section(
        title="Overhead of the instrumentation, as measured", body="\n\n".join(parts), floats=floats
    )


def _hook_vs_trace_text(data: Processed, q: Quotes, figs: set[str]) -> str:
    both = hook_vs_trace(data)
    if both.empty:
        return ""
    hook_ov, trace_ov = (
        float(both["overlap_efficiency"].median()),
        float(both["trace_overlap_efficiency"].median()),
    )
    hook_c, trace_c = float(both["comm_ns"].median()), float(both["trace_comm_ns"].median())
    text = (
        "\\paragraph{Hook against trace.} Both measure overlap efficiency as hidden over total "
        "communication, but of different intervals. The hook's communication of a bucket runs "
        "from the moment it became ready to its completion, waiting behind earlier buckets "
        "included, and counts as hidden until the last bucket is ready (the end of backward "
        "compute). The trace's is the collective's own run on gloo's threads, hidden only while "
        "a compute operator runs at the same moment. "
        f"On the {q.count('num_trace_steps', len(both))} profiled rank-steps the hook gives a "
        f"median overlap efficiency of {q.num('hook_overlap_median', hook_ov, 2)} and the trace "
        f"{q.num('trace_overlap_median', trace_ov, 2)}"
        + (f" ({fig_ref('hook_vs_trace')})" if "hook_vs_trace" in figs else "")
        + f"; communication per step is a median {q.ms('hook_comm_ms', hook_c)}~ms by the hook "
        f"and {q.ms('trace_comm_ms', trace_c)}~ms in the trace."
    )
    if abs(hook_c - trace_c) <= 0.15 * trace_c:
        text += (
            " The two see about the same communication time, so their difference lies in what "
            "each counts as hidden."
        )
    return text


def environment(data: Processed, q: Quotes) -> Section:
    """Versions, hosts, CPUs, measured load, steps and wall time, from the dataset."""
    cells = data.tables["cells"]
    sentences = [environment_sentence(data, q)]
    load = cells["load_avg_1m"].dropna() if "load_avg_1m" in cells else pd.Series(dtype=float)
    if load.empty:
        sentences.append("The dataset does not record the host's load average.")
    else:
        sentences.append(_load_sentence(data, q, load))
    steps = data.breakdown.groupby(["cell_id", "attempt", "rank"]).size()
    if len(steps):
        lo, hi = int(steps.min()), int(steps.max())
        span = (
            f"{q.count('steps_per_rank_min', lo)}"
            if lo == hi
            else f"{q.count('steps_per_rank_min', lo)} to {q.count('steps_per_rank_max', hi)}"
        )
        sentences.append(
            f"Each ok cell has {span} measured {plural(hi, 'step')} per rank, "
            f"{q.count('num_measured_steps', len(data.breakdown))} rank-steps in all"
            + (", so its medians rest on few samples." if hi < 30 else ".")
        )
    wall = data.status["wall_s"].dropna()
    sentences.append(
        "The dataset does not record the cells' wall time."
        if wall.empty
        else f"The cells took {q.num('sweep_wall_s', float(wall.sum()))}~s of wall time."
    )
    return Section(title="Environment", body=paragraph(sentences))


def _load_sentence(data: Processed, q: Quotes, load: pd.Series) -> str:
    cells = data.tables["cells"]
    cpus = [json.loads(e).get("cpu_count") for e in cells.loc[load.index, "env_json"].dropna()]
    cpu_count = max((int(c) for c in cpus if c), default=0)
    text = (
        f"The host's 1-minute load average, read when each attempt ended, was a median "
        f"{q.num('load_median', float(load.median()), 2)} and at most "
        f"{q.num('load_max', float(load.max()), 2)} over {q.count('num_load', len(load))} "
        f"{plural(len(load), 'attempt')}"
    )
    if cpu_count:
        over = int((load > cpu_count).sum())
        if over:
            text += (
                f"; in {q.count('num_load_over', over)} of them it exceeded the "
                f"{q.count('load_cpus', cpu_count)} CPUs, so more work was runnable than the "
                "host had CPUs (the cell's own ranks included)"
            )
        else:
            text += f", never above the {q.count('load_cpus', cpu_count)} CPUs"
    return text + "."


def limitations(data: Processed, q: Quotes) -> Section:
    """What the method cannot see, with the dataset's own numbers where they apply."""
    items = [
        "Bucket timestamps are host clocks read in the hook and in the future's callback, so a "
        "bucket's latency runs from hook entry (the enqueue included) to completion; the "
        "callback can run late while it waits for the interpreter lock.",
        "The end of backward compute is taken as the time the last bucket became ready; work "
        "after it inside backward (DDP's finalisation) counts as exposed communication.",
        "The calibrated ring model sees neither contention with compute nor gloo's several "
        "worker threads; the step model behind the main report's recommendations takes both "
        "in (the interference arms, two channels sharing the link), and states its error out "
        "of sample only where the dataset has caps beyond its calibration.",
    ]
    envs = data.tables["cells"]["env_json"].dropna()
    cpus = max((int(json.loads(e).get("cpu_count") or 0) for e in envs), default=0)
    ran = data.status[data.status["status"] != "rejected"]
    max_ws = int(ran["world_size"].max()) if len(ran) else 0
    if cpus and max_ws > cpus:
        items.append(
            f"Cells ran up to {q.count('max_ranks', max_ws)} ranks on a host reporting "
            f"{q.count('host_cpus_limit', cpus)} CPUs, so ranks shared cores."
        )
    if data.notes:
        items.append("Analysis notes: " + prose.escape("; ".join(data.notes)) + ".")
    body = "\\begin{itemize}\n" + "\n".join(f"\\item {i}" for i in items) + "\n\\end{itemize}"
    return Section(title="Limitations", body=body)


__all__ = [
    "environment",
    "failures",
    "instrumentation",
    "limitations",
    "repeatability",
    "what_ran",
]
