"""The main report's sections, each a function of the processed dataset.

A section, sentence, figure or table appears only where the dataset supports it: one world size
gives no scaling figure and one fit sentence, no rejected cell gives a one-line guard section,
no repeats give no repeatability claim. Every number goes through :class:`prose.Quotes`. This
module imports no torch and no ray.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from commprof.analysis.dataset import Processed
from commprof.analysis.dataset import rows as records
from commprof.caps import cap_label, cap_mb
from commprof.matrix import RUN_SWEEP
from commprof.query import latest_attempts, ok_attempts
from commprof.reporting import instrument, prose, report_tables
from commprof.reporting.prose import Quotes, Section, escape, named, paragraph, words
from commprof.reporting.recommend import cap_choices
from commprof.reporting.recommend import cap_text as tex_cap
from commprof.reporting.recommend_step import step_finding


def key_of(r: Any) -> str:
    """A quote-name suffix for a configuration row."""
    prof = ",profiled" if bool(getattr(r, "profile", False)) else ""
    return f"[{r.model},p={int(r.world_size)},cap={cap_label(r.bucket_cap_mb)}{prof}]"


def fig_ref(name: str) -> str:
    return f"Figure~\\ref{{fig:{name}}}"


def tab_ref(name: str) -> str:
    return f"Table~\\ref{{tab:{name}}}"


def abstract(data: Processed, q: Quotes) -> str:
    """What the dataset holds: cells by status and where they come from, then the models, world
    sizes and caps of the configurations that completed (the rows of Table 1)."""
    status = data.status
    counts = status["status"].value_counts()
    parts = [
        f"{q.count(f'num_cells_{s}', int(counts.get(s, 0)))} {s}"
        for s in ("ok", "failed", "rejected")
        if counts.get(s, 0)
    ]
    if len(parts) == 1:  # one status: "3 cells, all ok"
        parts = [f"all {counts.index[0]}"]
    sentences = [
        "This report measures how much of a data-parallel training step goes to gradient "
        "communication, how much of it is hidden behind backward compute, and how well a "
        "calibrated ring all-reduce model predicts it.",
        f"The dataset holds {q.count('num_cells', len(status))} "
        f"{prose.plural(len(status), 'cell')} ({words(parts)}) {sources(data)}.",
    ]
    merged = data.merged
    if len(merged):
        caps = merged["bucket_cap_mb"]
        cap_names = [tex_cap(c) for c in sorted(caps.dropna().unique())]
        cap_names += [tex_cap(None)] if caps.isna().any() else []
        sizes = sorted(int(w) for w in merged["world_size"].unique())
        models = sorted(merged["model"].unique())
        q.claim(
            "ran",
            table="results",
            models=[str(m) for m in models],
            world_sizes=sizes,
            caps=[None if c != c else float(c) for c in sorted(caps.unique(), key=_cap_order)],
        )
        ranks = words(str(w) for w in sizes) + (" rank" if sizes == [1] else " ranks")
        done = "The completed configurations" if counts.get("ok", 0) < len(status) else "They"
        sentences.append(
            f"{done} ran {prose.plural(len(models), 'model')} "
            f"{words(escape(m) for m in models)} on {ranks} with "
            f"{prose.plural(len(cap_names), 'bucket cap')} {words(cap_names)} "
            f"({tab_ref('results')})."
        )
    return paragraph(sentences)


def _cap_order(cap: float) -> float:
    return float("inf") if cap != cap else float(cap)  # DDP's default (NaN) last


def sources(data: Processed) -> str:
    """Where the cells come from: ``from the sweeps a and b``, ``recorded by commprof.attach in
    the user's own training``, ``from commprof run`` (:func:`cell_origin`), joined."""
    cells = latest_attempts(data.tables["cells"])
    if cells.empty:
        return ""
    origin = cells.apply(cell_origin, axis=1)
    phrases = []
    attach = sorted(cells.loc[origin == "attach", "sweep"].unique())
    if attach:
        named_runs = [a for a in attach if a != "attach"]
        phrases.append(
            "recorded by \\texttt{commprof.attach} in the user's own training"
            + (f" (runs named {words(escape(a) for a in named_runs)})" if named_runs else "")
        )
    if (origin == "run").any():
        phrases.append("from \\texttt{commprof run}")
    sweeps = sorted(cells.loc[origin.isin(["ray", "other"]), "sweep"].unique())
    if sweeps:
        phrases.append(
            f"from {prose.plural(len(sweeps), 'the sweep', 'the sweeps')} "
            f"{words(escape(s) for s in sweeps)}"
        )
    return words(phrases)


def findings(data: Processed, q: Quotes, figs: set[str]) -> Section:
    """The statements a reader acts on, each with its number and where it is shown."""
    merged = data.merged
    if merged.empty:
        return Section(
            title="Findings",
            label="findings",
            body="No cell completed, so nothing was measured; the postmortem lists every cell "
            "and why it did not run or failed.",
        )
    items = [
        _exposed_finding(data, q, figs),
        _cap_finding(data, q),
        _model_finding(data, q),
        step_finding(data, q),
    ]
    body = "\\begin{itemize}\n" + "\n".join(f"\\item {i}" for i in items if i) + "\n\\end{itemize}"
    return Section(title="Findings", label="findings", body=body)


def _exposed_finding(data: Processed, q: Quotes, figs: set[str]) -> str:
    merged = data.merged.sort_values("comm_overhead_fraction_median", ascending=False)
    plain = merged[~merged["profile"].astype(bool)]
    if len(plain):  # the profiler's own cost is not the finding
        kind = (
            "configurations run without the profiler"
            if len(plain) < len(merged)
            else ("configurations")
        )
        profiled: bool | None = False if len(plain) < len(merged) else None
        merged = plain
    else:
        kind, profiled = "configurations (every one run under the profiler)", True
    shown = [tab_ref("results")] + ([fig_ref("step_breakdown")] if "step_breakdown" in figs else [])
    worst: Any = records(merged)[0]
    k = key_of(worst)
    where = (
        f"Exposed communication takes the largest share of the step in "
        f"{named(q, worst, 'results')}: "
        if len(merged) > 1
        else f"In the one configuration measured, {named(q, worst, 'results')}, exposed "
        "communication takes "
    )
    text = (
        f"{where}"
        f"a median {q.pct('exposed_share' + k, worst.comm_overhead_fraction_median)}\\% of each "
        # the median of the per-step shares, quoted alone: the median exposed time over the
        # median step is another number, and a reader dividing the two would not find this one
        f"step (the median over its steps of exposed time over step time; {words(shown)})."
    )
    text += instrument.config_clause(data, q, worst)
    if len(merged) > 1:
        least: Any = records(merged)[-1]
        share = merged["comm_overhead_fraction_median"]
        count = {"count": len(merged)} | ({} if profiled is None else {"profiled": profiled})
        q.claim("configs_count", table="results", **count)
        text += (
            f" Across the {q.count('num_configs', len(merged))} {kind} the median share "
            f"is {q.pct('exposed_share_median', float(share.median()))}\\%, and the smallest "
            f"{q.pct('exposed_share' + key_of(least), least.comm_overhead_fraction_median)}\\% "
            f"({named(q, least, 'results')})."
        )
    return text


def _cap_finding(data: Processed, q: Quotes) -> str:
    choices = cap_choices(data)
    if choices.empty:
        q.claim("no_multi_cap", table="results")
        caps = data.merged.groupby(["model", "world_size"])["config_key"].nunique()
        if (caps > 1).any():  # more caps, but under the profiler
            return (
                "No model ran with more than one bucket cap at one world size without the "
                "profiler; the profiled configurations are left out of the cap choice (the "
                "profiler's own cost would enter it), so this dataset does not show what the "
                "cap does."
            )
        return (
            "No model ran with more than one bucket cap at one world size, so this dataset "
            "does not show what the cap does."
        )
    clauses = []
    for r in records(choices):
        k = f"[{r.model},p={int(r.world_size)}]"
        q.claim(
            "fastest_cap",
            table="results",
            model=str(r.model),
            world_size=int(r.world_size),
            cap=cap_mb(r.best_cap_mb),
        )
        clause = (
            f"{tex_cap(r.best_cap_mb)} for {escape(r.model)} on {int(r.world_size)} "
            f"ranks (a step {q.pct('cap_gain' + k, r.gain)}\\% shorter than with "
            f"{tex_cap(r.worst_cap_mb)}"
        )
        clause += ")" if r.separated else ", within the interquartile ranges)"
        clauses.append(clause)
    return (
        f"The bucket cap with the shortest median step ({tab_ref('recommend')}) is "
        f"{words(clauses)}."
    )


def _model_finding(data: Processed, q: Quotes) -> str:
    err = data.summary["allreduce_error_pct"].dropna()
    err = err[np.isfinite(err)]
    buckets = data.buckets["error_pct"].dropna()
    if err.empty or buckets.empty:
        return (
            "The calibrated model could not be compared with training here: no all-reduce "
            "microbenchmark or no bucket timing to fit and test it on."
        )
    median_signed = float(err.median())
    direction = "under-predicts" if median_signed < 0 else "over-predicts"
    if len(err) > 1 and ((err < 0).all() or (err > 0).all()):
        per_cell = (
            f"the all-reduce time per step of every one of the "
            f"{q.count('num_cells_modelled', len(err))} cells, by a median "
            f"{q.num('cell_abs_err_median_pct', float(err.abs().median()))}\\% "
            f"({tab_ref('results')})"
        )
    elif len(err) == 1:
        per_cell = (
            f"the all-reduce time per step of the one cell by "
            f"{q.num('cell_abs_err_median_pct', float(err.abs().median()))}\\% "
            f"({tab_ref('results')})"
        )
    else:
        per_cell = (
            f"the all-reduce time per step of a cell: its median absolute error is "
            f"{q.num('cell_abs_err_median_pct', float(err.abs().median()))}\\% over "
            f"{q.count('num_cells_modelled', len(err))} cells (median signed error "
            f"{q.num('cell_err_median_pct', median_signed)}\\%, {tab_ref('results')})"
        )
    return (
        f"The calibrated ring model {direction} {per_cell}, and per "
        f"gradient bucket, out of sample, its mean absolute error is "
        f"{q.num('bucket_mape_pct', float(buckets.abs().mean()))}\\% over "
        f"{q.count('num_buckets_modelled', len(buckets))} buckets ({tab_ref('fits')}). It "
        "models the all-reduce alone, not the training step it is part of."
    )


def results(data: Processed, q: Quotes, figs: set[str]) -> Section | None:
    """Table 1 and the measured figures, each introduced only where it was drawn."""
    if data.merged.empty:
        return None
    sentences = [f"{tab_ref('results')} lists every configuration, repeats pooled."]
    caption = _RESULTS_CAPTION + report_tables.profiled_note(data.merged)
    floats = [prose.table("results", caption, report_tables.table_results(data))]
    if "step_breakdown" in figs:
        sentences.append(f"{fig_ref('step_breakdown')} splits the step into its categories.")
        floats.append(prose.figure("step_breakdown", _BREAKDOWN_CAPTION))
    if "overlap_vs_cap" in figs:
        ov = data.merged.dropna(subset=["overlap_efficiency_median"])
        best: Any = records(ov.sort_values("overlap_efficiency_median"))[-1]
        q.claim(
            "most_overlap",
            table="results",
            model=str(best.model),
            world_size=int(best.world_size),
            cap=cap_mb(best.bucket_cap_mb),
            profiled=bool(best.profile),
        )
        sentences.append(
            f"{fig_ref('overlap_vs_cap')} shows how much communication is hidden as the bucket "
            f"cap changes; the most is a median "
            f"{q.num('best_overlap' + key_of(best), best.overlap_efficiency_median, 2)} "
            f"of it, for {named(q, best, 'results')}."
        )
        profiled = data.merged["profile"].astype(bool).any()
        caption = _OVERLAP_CAPTION + (_OVERLAP_PROFILED if profiled else "")
        floats.append(prose.figure("overlap_vs_cap", caption))
    if "scaling" in figs:
        sentences.append(
            f"{fig_ref('scaling')} shows how the step and its communication grow with the "
            "world size."
        )
        floats.append(prose.figure("scaling", _SCALING_CAPTION))
    if "layer_attribution" in figs:
        sentences.append(_attribution_sentence(data, q))
        floats.append(prose.figure("layer_attribution", _ATTRIBUTION_CAPTION))
    body = paragraph(sentences) + "\n\n" + paragraph(instrument.summary_sentences(data, q))
    floats += instrument.table_float(data)
    return Section(title="Results", label="results", body=body, floats=floats)


def _attribution_sentence(data: Processed, q: Quotes) -> str:
    from commprof.reporting.figures import attribution_cells

    parts = []
    for cell in records(attribution_cells(data)):
        total = float(
            data.attribution.loc[data.attribution["cell_id"] == cell.cell_id]["transfer_ns"].sum()
        )
        parts.append(
            f"{q.ms(f'attributed_ms[{cell.cell_id}]', total)}~ms for {named(q, cell, 'results')}"
            + (
                f" (repeat {int(cell.repeat)}; {tab_ref('results')} gives the median over its "
                "repeats)"
                if cell.num_repeats > 1
                else ""
            )
        )
    return (
        f"{fig_ref('layer_attribution')} charges each bucket's all-reduce service time to the "
        f"layers whose gradients it carries; per step a cell's bars add up to its all-reduce "
        f"time ({tab_ref('results')}): {words(parts)}."
    )


_RESULTS_CAPTION = (
    "Per configuration (repeats pooled): median step time with its interquartile range, median "
    "exposed communication, median overlap efficiency, and the all-reduce time per step (the sum "
    "over buckets of their median service time; the median over repeats) beside the calibrated "
    "model and its signed error."
)
_BREAKDOWN_CAPTION = (
    "Step-time breakdown per configuration: mean over measured steps, ranks and repeats of "
    "compute, exposed communication, optimizer and idle/other (they add up to the mean step "
    "time)."
)
_OVERLAP_CAPTION = (
    "Overlap efficiency (share of communication hidden behind backward compute) against the DDP "
    "bucket cap, per model; markers are medians, bars the interquartile range."
)
_OVERLAP_PROFILED = (
    " Profiled configurations are dotted series of their own, drawn just right of their cap."
)
_SCALING_CAPTION = (
    "Median step time, exposed communication and all-reduce time per step against the world "
    "size, measured and modelled, for the cap run at the most world sizes."
)
_ATTRIBUTION_CAPTION = (
    "All-reduce service time per step charged to each module, named by its path in the model and "
    "its class (each bucket's median service "
    "time shared by the bytes of its gradients), for the cell with the most buckets of each "
    "model; the largest modules are shown. Service time excludes the wait behind earlier "
    "buckets, so the bars of a cell add up to its all-reduce time per step."
)


def memory_guard(data: Processed, q: Quotes, figs: set[str]) -> Section:
    """The guard's rejections with one example's arithmetic, or one line where there are none."""
    guard = data.guard
    rejected = guard[(guard["status"] == "rejected") & (~guard["ok"].astype(bool))]
    if rejected.empty:
        return Section(
            title="Memory guard",
            label="guard",
            body="The memory guard rejected no cell of this dataset.",
        )
    first: Any = records(rejected.sort_values(["model", "world_size"]))[0]
    num = int(rejected["cell_id"].nunique())
    cells = prose.plural(num, "cell was", "cells were")
    body = paragraph(
        [
            "Before a cell runs, its memory need is estimated per pool and compared with the "
            f"pool's budget; {q.count('num_cells_rejected', num)} {cells} rejected.",
            f"For example {escape(first.model)} on {int(first.world_size)} ranks needs "
            f"{q.num('rejected_need_gib', first.need_bytes / 2**30, 2)}~GiB of "
            f"{escape(first.pool)} memory against a budget of "
            f"{q.num('rejected_budget_gib', first.budget_bytes / 2**30, 2)}~GiB"
            + (f" ({fig_ref('memory_guard')})" if "memory_guard" in figs else "")
            + "; the postmortem prints the full arithmetic of every rejected cell.",
        ]
    )
    floats = []
    if "memory_guard" in figs:
        floats.append(
            prose.figure(
                "memory_guard",
                "Estimated need over budget per memory pool, per model and world size (the "
                "largest over bucket caps); bars right of the dotted line are over budget.",
            )
        )
    return Section(title="Memory guard", label="guard", body=body, floats=floats)


def environment_sentence(data: Processed, q: Quotes) -> str:
    """Versions, hosts and CPUs, from the cells' recorded environment."""
    env = data.tables["cells"]["env_json"].dropna()
    if env.empty:
        return "No cell recorded its environment (none completed)."
    frame = pd.DataFrame([json.loads(e) for e in env])
    phrases = []
    for key, name in (("torch", "PyTorch"), ("python", "Python")):
        if key in frame:
            phrases.append(
                f"{name} {words(escape(v) for v in sorted(frame[key].dropna().unique()))}"
            )
    hosts = sorted(frame["host"].dropna().unique()) if "host" in frame else []
    cpus = (
        sorted(int(c) for c in frame["cpu_count"].dropna().unique()) if "cpu_count" in frame else []
    )
    text = f"The cells ran with {words(phrases)}"
    if hosts:
        text += f" on {prose.plural(len(hosts), 'host')} {words(escape(h) for h in hosts)}"
    if cpus:
        text += (
            f" reporting {words(q.count(f'host_cpus[{c}]', c) for c in cpus)} "
            f"{prose.plural(cpus[-1], 'CPU')}"
        )
    return text + "."


ORIGINS = {
    "ray": "trained for a few steps by a gang of rank processes that Ray placed",
    "run": "trained for a few steps by rank processes that \\texttt{commprof run} started on "
    "one host",
    "attach": "recorded in the user's own training by \\texttt{commprof.attach}",
    "other": "trained for a few steps by a gang of rank processes",
}
"""How a cell's steps came to be measured, per origin (:func:`cell_origin`)."""


def cell_origin(row: Any) -> str:
    """Where a ``cells`` row comes from: ``attach`` (its configuration's ``source``), ``run``
    (the sweep name ``commprof run`` writes, which no matrix may take), ``ray`` (a sweep, whose
    gang recorded its Ray nodes) or ``other`` (rows written without nodes, as the benchmarks
    write them)."""
    config = json.loads(row["config_json"]) if isinstance(row["config_json"], str) else {}
    if config.get("source") == "attach":
        return "attach"
    if row["sweep"] == RUN_SWEEP:
        return "run"
    return "ray" if row["nodes"] else "other"


def _origin_sentence(data: Processed, q: Quotes) -> str:
    """The Method's first sentence: what a cell is and how its steps came to be measured."""
    ok = ok_attempts(data.tables["cells"])
    origins: dict[str, int] = (
        {str(k): int(n) for k, n in ok.apply(cell_origin, axis=1).value_counts().items()}
        if len(ok)
        else {}
    )
    head = (
        "Each cell is one configuration (model, world size $p$, bucket cap, backend, device, "
        "placement, repeat)"
    )
    tail = (
        "with PyTorch DDP and a timing communication hook; the hook records, for every gradient "
        "bucket, when it became ready, when its all-reduce was launched and when it completed."
    )
    if len(origins) <= 1:
        return f"{head} {ORIGINS[next(iter(origins), 'other')]}, {tail}"
    parts = [f"{q.count(f'cells_{o}', origins[o])} {ORIGINS[o]}" for o in sorted(origins)]
    return f"{head}; of the completed cells, {words(parts)}; all {tail}"


def method(data: Processed, q: Quotes) -> Section:
    """How the numbers were measured and modelled (definitions), and where."""
    repeats = (data.merged["num_repeats"] > 1).any() if len(data.merged) else False
    body = paragraph(
        [
            _origin_sentence(data, q),
            "After training each cell measures all-reduce alone at fixed sizes and at its own "
            "bucket sizes. Statistics are over measured steps (warm-up steps are excluded) and "
            "ranks: the median, with the interquartile range as spread.",
            "Repeats of a configuration are pooled; how far they disagree is in the postmortem."
            if repeats
            else "",
        ]
    )
    body += "\n\n" + _METHOD_DEFINITIONS
    body += "\n\n\\paragraph{Environment.} " + environment_sentence(data, q)
    return Section(title="Method", label="method", body=body)


_METHOD_DEFINITIONS = r"""\paragraph{Step-time breakdown.} Per rank and step, with $t_c$ the time
the last bucket became ready (the end of backward compute), communication $C$ is the union
of the buckets' $[\mathrm{ready}, \mathrm{done})$ intervals and exposed communication $E$
the union of $[\max(\mathrm{ready}, t_c), \mathrm{done})$. Compute is forward plus backward
minus $E$ (backward returns only after every bucket is reduced), the optimizer is its own
category and idle/other is the rest of the step, so
$\mathrm{compute} + E + \mathrm{optimizer} + \mathrm{other} = \mathrm{step}$ exactly. Overlap
efficiency is $(|C| - |E|)/|C|$ and the share of the step left exposed $|E|/\mathrm{step}$.
$t_c$ is the rank's own, so a rank that ends its compute before another counts its wait for
the slower rank's buckets in $E$; the step model counts that wait as well.

\paragraph{Service time.} A bucket's service time is $\mathrm{done} - \max(\mathrm{ready}, d)$,
with $d$ the latest completion of an earlier bucket of the step that finished before it: its
own all-reduce, without the wait behind earlier buckets. The all-reduce time per step of a cell
is the sum over its buckets of their median service time; the per-layer attribution shares
each bucket's service time among its gradients by bytes. A bucket's latency
$\mathrm{done} - \mathrm{ready}$ also holds that wait, and a sum of latencies would count a
transfer once for every bucket waiting behind it, so no figure or table sums latencies.

\paragraph{Model.} The ring all-reduce of Patarasuk and Yuan,
$T(n,p) = 2(p-1)\alpha + 2\frac{p-1}{p} n \beta$, is fitted per backend, regime and world size
to the microbenchmark (weighted least squares of the relative error). It is then used out of
sample on the buckets measured during training, against each bucket's service time. Errors are
signed, $100\,(\mathrm{modelled} - \mathrm{measured})/\mathrm{measured}$; MAPE is their mean
absolute value. Bus bandwidth follows nccl-tests:
$\mathrm{busbw} = \frac{n}{t}\cdot\frac{2(p-1)}{p}$, in decimal GB/s."""


def model_accuracy(data: Processed, q: Quotes, figs: set[str]) -> Section | None:
    """The fits and their error, one sentence per fitted group; absent without a fit."""
    keys = ["backend", "regime", "world_size"]
    fits = data.fit_params.merge(data.accuracy, on=keys, how="left", suffixes=("", "_acc"))
    if fits.empty:
        return None
    sentences = [f"{tab_ref('fits')} gives the fitted parameters and the model's error."]
    for r in records(fits):
        k = f"[{r.regime},p={int(r.world_size)}]"
        unresolved = (
            f" (its {q.pct('ci_level', 0.95, 0)}\\% interval reaches below zero: the fit does "
            "not tell it from 0)"
        )
        text = (
            f"For $p = {int(r.world_size)}$ ({escape(r.regime)}) the fit gives "
            f"$\\alpha$ = {q.num('alpha_us' + k, r.alpha_ns / 1e3)}~$\\mu$s"
            + (unresolved if r.alpha_lo_ns < 0 else "")
            + " and "
            f"$1/\\beta$ = {q.num('bandwidth_mbs' + k, r.bandwidth_bytes_per_s / 1e6, 0)}~MB/s; "
            f"on the {q.count('fit_points' + k, r.num_points)} points it was fitted to (every ok "
            f"cell's median at each microbenchmark size) its MAPE is "
            f"{q.num('fit_mape_pct' + k, r.fit_mape_pct)}\\%"
        )
        if np.isfinite(r.bucket_mape_pct):
            text += (
                f", and out of sample, on the {q.count('num_buckets' + k, r.num_buckets)} "
                f"gradient buckets of training, "
                f"{q.num('bucket_mape_pct' + k, r.bucket_mape_pct)}\\% with a median signed "
                f"error of {q.num('bucket_median_err_pct' + k, r.bucket_median_error_pct)}\\%"
            )
        sentences.append(text + ".")
    under = fits["bucket_median_error_pct"].dropna()
    if len(under) and (under < 0).all():
        sentences.append(
            "The model under-predicts the buckets of training"
            + (" at every world size" if len(under) > 1 else "")
            + "; unlike the microbenchmark, which runs alone, their all-reduce shares the cores "
            "with backward compute."
        )
    caption = _FITS_CAPTION.format(
        below_zero=_BELOW_ZERO if (fits["alpha_lo_ns"] < 0).any() else ""
    )
    floats = [prose.table("fits", caption, report_tables.table_fits(data))]
    shown = [n for n in ("allreduce_vs_size", "model_accuracy") if n in figs]
    if shown:
        sentences.append(
            f"{words(fig_ref(n) for n in shown)} "
            + ("shows" if len(shown) == 1 else "show")
            + " the data"
            + (
                "; the microbenchmark markers there are medians over cells per size, which "
                "scatter less than the points of the fit."
                if len(data.summary) > 1
                else "."
            )
        )
    if "allreduce_vs_size" in figs:
        floats.append(prose.figure("allreduce_vs_size", _SIZE_CAPTION))
    if "model_accuracy" in figs:
        floats.append(prose.figure("model_accuracy", _ACCURACY_CAPTION))
    return Section(title="Model accuracy", label="model", body=paragraph(sentences), floats=floats)


_FITS_CAPTION = (
    "Calibrated ring model per regime and world size: $\\alpha$ with its 95\\% confidence "
    "interval{below_zero} and $1/\\beta$; in sample, the MAPE over the points the fit was "
    "fitted to; out of sample, the MAPE and median signed error over the gradient buckets of "
    "training (against their service time)."
)
_BELOW_ZERO = (
    " ($<$ 0: the interval reaches below zero, so the fit does not tell the latency from 0)"
)
_SIZE_CAPTION = (
    "All-reduce time (top) and bus bandwidth (bottom) against message size, measured (median "
    "over cells of the per-size p50, bars from the fastest to the slowest iteration) and "
    "modelled."
)
_ACCURACY_CAPTION = (
    "Modelled against measured all-reduce time, per gradient bucket during training (service "
    "time) and per microbenchmark size (median over cells); the grey line is perfect agreement."
)
