"""The step-model benchmark's ablation verdict (``benchmarks/step_model_ablation.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from step_model_ablation import (  # noqa: E402
    ABLATIONS,
    RAISE_TOLERANCE_PTS,
    ablation_summary,
    pooled_table,
    pooled_verdict,
)


def _row(step: float, exposed: float, world: float) -> dict[str, Any]:
    return {
        "step_mape_pct": step,
        "exposed_err_max_pct_of_step": exposed,
        "cells": {"0.25": {"step_ape_pct": step}, "p3@25": {"step_ape_pct": world}},
    }


def test_a_row_equal_but_for_float_rounding_does_not_raise_the_error() -> None:
    # Run 15's case: switching a correction off changed no world-size prediction, yet the means
    # differed in the last bits and the correction was kept.
    full = _row(10.0, 5.0, 10.119)
    rows = {name: _row(9.0, 4.0, 10.119 + 1e-12) for name in ABLATIONS}
    rows["full"] = full
    rows["no_stall"] = _row(9.0, 4.0, 10.119 + 2 * RAISE_TOLERANCE_PTS)  # raised on p = 3
    rows["no_hook_split"] = _row(10.0 + 2 * RAISE_TOLERANCE_PTS, 4.0, 10.119)  # on the caps
    per_model = {"srn-1m": {"ablation": rows, "world_sizes": {"p3@25": {}}}}
    summary = ablation_summary(per_model)
    assert summary["median_factors"]["lowers_held_out_error"] is False
    assert summary["no_interference"]["lowers"] == {
        "step_mape_pct": False,
        "exposed_err_max_pct_of_step": False,
        "world_size_step_ape_pct": False,
    }
    assert summary["no_stall"]["lowers"]["world_size_step_ape_pct"] is True
    assert summary["no_hook_split"]["lowers"]["step_mape_pct"] is True
    assert summary["full"]["srn-1m"]["p3@25_step_ape_pct"] == 10.1


def test_a_raise_counts_above_the_tolerance_only() -> None:
    below, above = RAISE_TOLERANCE_PTS * 0.8, RAISE_TOLERANCE_PTS * 1.2
    rows = {name: _row(10.0, 5.0, 8.0) for name in ABLATIONS}
    rows["no_stall"] = _row(10.0 + below, 5.0 + below, 8.0 + below)
    rows["no_interference"] = _row(10.0, 5.0 + above, 8.0)
    summary = ablation_summary({"srn-1m": {"ablation": rows, "world_sizes": {"p3@25": {}}}})
    assert summary["no_stall"]["lowers_held_out_error"] is False
    assert summary["no_interference"]["lowers"]["exposed_err_max_pct_of_step"] is True
    assert summary["no_interference"]["lowers"]["step_mape_pct"] is False


def test_the_pooled_verdict_takes_the_mean_over_runs_and_models() -> None:
    # Two runs of two models, one of them with a world-size cell and one without a held-out cap.
    # no_stall raises srn-1m's step error by 2 points in one run and lowers it by 1 in the
    # other: kept on the pool (mean +0.25 over four (run, model)); no_interference the reverse,
    # but raises the world-size cell by 0.2 in each run: kept by that measure alone;
    # median_factors moves nothing: goes.
    def run(stall: float, interference: float) -> dict[str, Any]:
        one = {name: _row(10.0, 5.0, 8.0) for name in ABLATIONS}
        one["no_stall"] = _row(10.0 + stall, 5.0, 8.0)
        one["no_interference"] = _row(10.0 + interference, 5.0, 8.2)
        other = {name: _row(20.0, 1.0, 0.0) for name in ABLATIONS}
        for row in other.values():
            row["cells"] = {"0.25": {"step_ape_pct": 20.0}}
        none = {name: {**_row(0.0, 0.0, 0.0), "step_mape_pct": None} for name in ABLATIONS}
        for row in none.values():
            row["exposed_err_max_pct_of_step"], row["cells"] = None, {}
        return {
            "srn-1m": {"ablation": one, "world_sizes": {"p3@25": {}}},
            "srn-10m": {"ablation": other, "world_sizes": {}},
            "resnet18": {"ablation": none, "world_sizes": {}},
            "srn-100k": {"collected": False},
        }

    pooled = pooled_verdict({"run 14": run(2.0, -2.0), "run 15": run(-1.0, 1.0)})
    assert pooled["runs"] == ["run 14", "run 15"]
    stall = pooled["no_stall"]
    assert stall["lowers"] == {
        "step_mape_pct": True,
        "exposed_err_max_pct_of_step": False,
        "world_size_step_ape_pct": False,
    }
    assert (stall["mean_off"]["step_mape_pct"], stall["mean_full"]["step_mape_pct"]) == (
        15.25,
        15.0,
    )
    interference = pooled["no_interference"]
    assert interference["lowers"]["step_mape_pct"] is False
    assert interference["lowers"]["world_size_step_ape_pct"] is True
    assert interference["mean_off"]["world_size_step_ape_pct"] == 8.2
    assert pooled["median_factors"]["lowers_held_out_error"] is False
    table = pooled_table(pooled)
    assert "| no_stall | 15.25 (15.00) | 3.00 (3.00) | 8.00 (8.00) | stays |" in table
    assert "| median_factors | 15.00 (15.00) | 3.00 (3.00) | 8.00 (8.00) | goes |" in table
