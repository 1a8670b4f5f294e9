"""The timing hook's cost per configuration, from the ``hook_cost`` table: hooked against plain
DDP in interleaved pairs of steps (``commprof.training.hook_cost``), with an interval.

Per (cell, attempt, pair, arm) the step is the slowest rank's (each step starts after a barrier,
so the gang's step ends with its slowest rank). Per pair the difference is
``d = hooked - plain``; the repeats of a configuration pool their pairs. The cost is the median
of ``d`` over the pairs, and its interval the distribution-free confidence interval of a median
from order statistics (Conover, *Practical Nonparametric Statistics*, 3rd ed., 1999, section
3.2): with the ``n`` differences sorted, ``[d_(k), d_(n+1-k)]`` for the largest ``k`` with
``P(B <= k - 1) <= (1 - level) / 2``, ``B ~ Binomial(n, 1/2)``; its coverage is
``1 - 2 P(B <= k - 1)``, at least ``level``. It needs no assumption on the shape of the
differences (one step in a pair descheduled by another process is an outlier a mean would
follow). Below 6 pairs no interval reaches 95 %.

The cost is *resolved* where the interval excludes 0: its sign is known. Where the interval
holds 0 (it is wider than the effect), the dataset does not resolve the hook's cost; the
reports say so rather than print the median alone. This module imports no torch and no ray.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

LEVEL = 0.95
"""Confidence level of the interval."""

COLUMNS = [
    "config_key",
    "num_cells",
    "num_pairs",
    "plain_step_ns",
    "hooked_step_ns",
    "cost_ns",
    "cost_low_ns",
    "cost_high_ns",
    "coverage",
    "cost_fraction",
    "low_fraction",
    "high_fraction",
    "resolved",
]
"""Columns of :func:`hook_cost_summary`."""


def median_interval(n: int, level: float = LEVEL) -> tuple[int, float] | None:
    """The order statistic ``k`` (1-based) of the median's interval and its coverage.

    Args:
        n: sample size.
        level: the coverage asked for.

    Returns:
        ``(k, coverage)``: ``[x_(k), x_(n+1-k)]`` covers the median with probability ``coverage
        >= level``; None where even ``[x_(1), x_(n)]`` covers less than ``level``.
    """
    tail = (1.0 - level) / 2.0
    k, cdf = 0, 0.0
    while k < n:
        nxt = cdf + math.comb(n, k) / 2.0**n  # P(B <= k)
        if nxt > tail:
            break
        k, cdf = k + 1, nxt
    if k == 0:
        return None
    return k, 1.0 - 2.0 * cdf


def paired_steps(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (cell, attempt, pair): the slowest rank's step of each arm.

    Args:
        rows: the dataset's ``hook_cost`` table (possibly a subset).

    Returns:
        Columns ``cell_id, attempt, pair, hooked_ns, plain_ns, diff_ns`` (``hooked - plain``);
        pairs missing an arm are left out.
    """
    if rows.empty:
        return pd.DataFrame(
            columns=["cell_id", "attempt", "pair", "hooked_ns", "plain_ns", "diff_ns"]
        )
    slowest = rows.groupby(["cell_id", "attempt", "pair", "arm"])["step_ns"].max().unstack("arm")
    slowest = slowest.dropna(subset=[c for c in ("hooked", "plain") if c in slowest]).reset_index()
    if not {"hooked", "plain"} <= set(slowest.columns):
        return paired_steps(rows.iloc[0:0])
    out = slowest.rename(columns={"hooked": "hooked_ns", "plain": "plain_ns"})
    out = out[["cell_id", "attempt", "pair", "hooked_ns", "plain_ns"]].copy()
    out["diff_ns"] = out["hooked_ns"] - out["plain_ns"]
    return out.reset_index(drop=True)


def hook_cost_summary(rows: pd.DataFrame, config_of: pd.DataFrame) -> pd.DataFrame:
    """The hook's cost per configuration (repeats pooled).

    Args:
        rows: the dataset's ``hook_cost`` table.
        config_of: ``cell_id, attempt, config_key`` of the cells to count (the ok ones).

    Returns:
        :data:`COLUMNS`: cells and pairs, the median plain and hooked step, the cost (median
        difference), its interval and coverage (NaN where fewer than 6 pairs give none), the
        three as fractions of the median plain step, and ``resolved`` (the interval excludes 0).
    """
    pairs = paired_steps(rows).merge(config_of, on=["cell_id", "attempt"])
    out = []
    for key, part in pairs.groupby("config_key", sort=True):
        diffs = np.sort(part["diff_ns"].to_numpy(dtype=np.float64))
        n = len(diffs)
        plain = float(np.median(part["plain_ns"]))
        found = median_interval(n)
        low, high, coverage = math.nan, math.nan, math.nan
        if found is not None:
            k, coverage = found
            low, high = float(diffs[k - 1]), float(diffs[n - k])
        cost = float(np.median(diffs))
        out.append(
            {
                "config_key": key,
                "num_cells": int(part["cell_id"].nunique()),
                "num_pairs": n,
                "plain_step_ns": plain,
                "hooked_step_ns": float(np.median(part["hooked_ns"])),
                "cost_ns": cost,
                "cost_low_ns": low,
                "cost_high_ns": high,
                "coverage": coverage,
                "cost_fraction": cost / plain,
                "low_fraction": low / plain,
                "high_fraction": high / plain,
                "resolved": bool(found is not None and (low > 0 or high < 0)),
            }
        )
    return pd.DataFrame(out, columns=COLUMNS)
