"""What the timing hook costs a step, as the reports say it: beside the step times it could bias.

The dataset's ``hook_cost`` table holds, per cell that ran ``hook_cost_pairs``, interleaved
pairs of steps with commprof's timing hook and of a plain DDP replica without it
(``commprof.training.hook_cost``); ``commprof.analysis.hook_cost`` gives per configuration the
median paired difference and its order-statistics 95 % interval. Here that becomes a table and
sentences. Where the interval crosses zero the cost is not resolved: the reports say so and give
the interval's upper end as the most the hook can have cost (never a negative bound as if it
were a cost). Where no cell measured it, they say the step times include an unmeasured cost.
This module imports no torch and no ray.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from commprof.analysis.dataset import Processed
from commprof.analysis.dataset import rows as records
from commprof.analysis.hook_cost import LEVEL
from commprof.caps import cap_label, cap_number
from commprof.reporting import prose
from commprof.reporting.prose import Quotes
from commprof.reporting.report_tables import booktabs, fmt, model_cell, profiled_note

TABLE = "hook_cost"
"""The table's label suffix (``tab:hook_cost``), in both reports."""


def cost_frame(data: Processed) -> pd.DataFrame:
    """The hook's cost per configuration beside its configuration columns, in Table 1's order."""
    cost = data.hook_cost
    if cost.empty or data.merged.empty:
        return pd.DataFrame()
    config = data.merged[["config_key", "model", "world_size", "bucket_cap_mb", "profile"]]
    return config.merge(cost, on="config_key").reset_index(drop=True)


def _ms(ns: float) -> str:
    return fmt(ns / 1e6, 2)


def cost_cell(r: Any) -> str:
    """The cost column: ``0.21 [0.05, 0.40]`` where resolved, ``at most 0.30`` where the
    interval crosses zero, ``--`` where too few pairs gave an interval."""
    if not math.isfinite(r.cost_low_ns):
        return "--"
    if r.resolved:
        return f"{_ms(r.cost_ns)} [{_ms(r.cost_low_ns)}, {_ms(r.cost_high_ns)}]"
    return f"at most {_ms(r.cost_high_ns)}"


def _share_cell(r: Any) -> str:
    if not math.isfinite(r.cost_low_ns):
        return "--"
    if r.resolved:
        return fmt(100.0 * r.cost_fraction, 1)
    return f"at most {fmt(100.0 * r.high_fraction, 1)}"


def cost_table(data: Processed) -> str:
    """Per configuration that measured it: pairs, plain and hooked median step, the cost."""
    frame = cost_frame(data)
    rows = [
        [
            model_cell(r.model, r.profile),
            str(int(r.world_size)),
            cap_number(r.bucket_cap_mb),
            str(int(r.num_pairs)),
            _ms(r.plain_step_ns),
            _ms(r.hooked_step_ns),
            cost_cell(r),
            _share_cell(r),
            "yes" if r.resolved else "no",
        ]
        for r in records(frame)
    ]
    columns = [
        ("model", "l"),
        ("$p$", "r"),
        ("cap (MiB)", "r"),
        ("pairs", "r"),
        ("plain (ms)", "r"),
        ("hooked (ms)", "r"),
        ("cost (ms) [95\\% CI]", "r"),
        ("of plain (\\%)", "r"),
        ("resolved", "l"),
    ]
    return booktabs(columns, rows, size="footnotesize", colsep_pt=4)


CAPTION = (
    "What commprof's timing hook costs a step, measured in the same gang: after the measured "
    "steps, pairs of one step of the hooked model and one of a plain DDP replica without the "
    "hook (same weights and batch, the order drawn per pair), each step's time its slowest "
    "rank's. Plain and hooked: median step; cost: median of the paired differences (hooked "
    "minus plain) with its distribution-free 95\\% interval from order statistics, and as a "
    "share of the plain median step; resolved: the interval excludes zero. Where it does not, "
    "the interval's upper end is the most the hook can have cost."
)


def _level(q: Quotes) -> str:
    """The intervals' confidence level, quoted (``95``)."""
    return q.pct("ci_level", LEVEL, 0)


def _key(r: Any) -> str:
    prof = ",profiled" if bool(r.profile) else ""
    return f"[{r.model},p={int(r.world_size)},cap={cap_label(r.bucket_cap_mb)}{prof}]"


def not_measured(data: Processed) -> str:
    """The sentence for a dataset where no cell measured the hook's cost ('' where one did)."""
    if not cost_frame(data).empty:
        return ""
    attach_only = (
        bool(len(data.status))
        and (data.status["sweep"].notna()).all()
        and all("attach" in str(c) for c in data.tables["cells"]["config_json"])
    )
    why = (
        "\\texttt{commprof.attach} cannot run the user's training again without its hook"
        if attach_only
        else "no cell of it ran the hook-cost pairs (the matrix key \\texttt{hook\\_cost\\_pairs})"
    )
    return (
        f"What the timing hook itself costs a step is not measured in this dataset: {why}. The "
        "step times here include that cost, unquantified."
    )


def config_clause(data: Processed, q: Quotes, row: Any) -> str:
    """What the hook cost one configuration, for the sentence that quotes its step time ('' where
    it was not measured)."""
    frame = cost_frame(data)
    mine = frame[frame["config_key"] == row.config_key] if len(frame) else frame
    if mine.empty:
        return ""
    r: Any = records(mine)[0]
    k = _key(r)
    if not math.isfinite(r.cost_low_ns):
        return (
            f" The timing hook's cost there is not resolved: its "
            f"{q.count('hook_cost_pairs' + k, r.num_pairs)} pairs against plain DDP are too "
            "few for an interval."
        )
    if r.resolved:
        return (
            f" The timing hook itself cost that configuration "
            f"{q.ms('hook_cost_ms' + k, r.cost_ns)}~ms per step ({_level(q)}\\% interval "
            f"{q.ms('hook_cost_low_ms' + k, r.cost_low_ns)} to "
            f"{q.ms('hook_cost_high_ms' + k, r.cost_high_ns)}~ms, "
            f"{q.pct('hook_cost_pct' + k, r.cost_fraction)}\\% of its plain step; "
            f"Table~\\ref{{tab:{TABLE}}})."
        )
    return (
        f" The timing hook's own cost there is not resolved: against plain DDP its {_level(q)}\\% "
        f"interval crosses zero, so it cost at most "
        f"{q.ms('hook_cost_high_ms' + k, r.cost_high_ns)}~ms per step "
        f"({q.pct('hook_cost_high_pct' + k, r.high_fraction)}\\% of its plain step; "
        f"Table~\\ref{{tab:{TABLE}}})."
    )


def summary_sentences(data: Processed, q: Quotes) -> list[str]:
    """The hook's cost over every configuration that measured it (none: :func:`not_measured`)."""
    frame = cost_frame(data)
    if frame.empty:
        return [not_measured(data)]
    n = len(frame)
    q.claim("configs_count", table=TABLE, count=n)
    resolved = frame[frame["resolved"]]
    intro = (
        f"Table~\\ref{{tab:{TABLE}}} gives what commprof's timing hook costs a step, measured "
        f"against plain DDP in the same gang on pairs of interleaved steps "
        f"({q.count('hook_cost_pairs_min', int(frame['num_pairs'].min()))}"
        + (
            f" to {q.count('hook_cost_pairs_max', int(frame['num_pairs'].max()))}"
            if frame["num_pairs"].nunique() > 1
            else ""
        )
        + f" pairs per configuration, {q.count('hook_cost_configs', n)} "
        f"{prose.plural(n, 'configuration')} in all)."
    )
    out = [intro]
    if len(resolved):
        worst: Any = records(resolved.sort_values("cost_fraction"))[-1]
        out.append(
            f"The cost is resolved in {q.count('hook_cost_resolved', len(resolved))} of "
            f"{q.count('hook_cost_configs', n)}; the largest is "
            f"{q.pct('hook_cost_pct' + _key(worst), worst.cost_fraction)}\\% of the plain step "
            f"({q.ms('hook_cost_ms' + _key(worst), worst.cost_ns)}~ms, {_level(q)}\\% interval "
            f"{q.ms('hook_cost_low_ms' + _key(worst), worst.cost_low_ns)} to "
            f"{q.ms('hook_cost_high_ms' + _key(worst), worst.cost_high_ns)}~ms, "
            f"{prose.named(q, worst, TABLE)})."
        )
    unresolved = frame[~frame["resolved"] & frame["cost_high_ns"].notna()]
    if len(unresolved):
        top: Any = records(unresolved.sort_values("high_fraction"))[-1]
        share = q.pct("hook_cost_high_pct" + _key(top), top.high_fraction)
        where = (
            "In every configuration"
            if len(unresolved) == n
            else f"In the other {q.count('hook_cost_unresolved', len(unresolved))}"
        )
        most = (
            f"it is at most {share}\\% of the plain step ({prose.named(q, top, TABLE)})"
            if len(unresolved) == 1
            else f"the largest upper end is {share}\\% of the plain step "
            f"({prose.named(q, top, TABLE)})"
        )
        out.append(
            f"{where} the interval crosses zero, so the dataset does not resolve the cost "
            f"there; {most}."
        )
    few = frame[frame["cost_high_ns"].isna()]
    if len(few):
        out.append(
            f"{q.count('hook_cost_too_few', len(few))} {prose.plural(len(few), 'configuration')} "
            f"ran fewer than 6 pairs, too few for a {_level(q)}\\% interval."
        )
    return out


def table_float(data: Processed) -> list[str]:
    """The table as a float (none where no configuration measured the cost)."""
    if cost_frame(data).empty:
        return []
    caption = CAPTION + profiled_note(cost_frame(data))
    return [prose.table(TABLE, caption, cost_table(data))]
