"""Measured backward timelines: bucket ready offsets and per-parameter interpolation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from commprof.modeling.step.timeline import bucket_ready_offsets, parameter_ready_ns

CELL = "abcdef012345"


def _tables() -> dict[str, pd.DataFrame]:
    key = {"cell_id": CELL, "attempt": 1}
    cells = pd.DataFrame([{**key, "status": "ok"}])
    # two measured steps on one rank; backward starts at start + forward = 1000 + 100
    steps = pd.DataFrame(
        [
            {**key, "rank": 0, "step": s, "measured": s > 0, "start_ns": 1000, "forward_ns": 100}
            for s in range(3)
        ]
    )
    # bucket 0 ready 300 ns into backward, bucket 1 at 700 (step 1) and 900 (step 2): median 800
    ready = {(1, 0): 1400, (1, 1): 1800, (2, 0): 1400, (2, 1): 2000, (0, 0): 5000}
    buckets = pd.DataFrame(
        [
            {**key, "rank": 0, "step": s, "bucket_index": b, "ready_ns": r}
            for (s, b), r in ready.items()
        ]
    )
    # registration order: a (100 B), b (300 B), c (200 B); DDP puts c first (ready first)
    params = pd.DataFrame(
        [
            {**key, "bucket_index": 0, "position": 0, "param_name": "c", "num_bytes": 200},
            {**key, "bucket_index": 1, "position": 0, "param_name": "b", "num_bytes": 300},
            {**key, "bucket_index": 1, "position": 1, "param_name": "a", "num_bytes": 100},
        ]
    )
    return {"cells": cells, "steps": steps, "buckets": buckets, "bucket_params": params}


def test_offsets_are_medians_over_measured_steps() -> None:
    offsets = bucket_ready_offsets(_tables(), CELL)
    assert offsets.to_dict() == {0: 300, 1: (700 + 900) / 2}  # step 0 is not measured


def test_parameters_are_placed_by_cumulative_bytes() -> None:
    ready = parameter_ready_ns(_tables(), CELL[:6], [("a", 25), ("b", 75), ("c", 50)])
    # c alone in bucket 0: at its end (300); b then a in bucket 1, from 300 to 800 by bytes
    expected = [300 + 500 * 400 / 400, 300 + 500 * 300 / 400, 300.0]
    np.testing.assert_allclose(ready, expected)


def test_errors_name_what_to_change() -> None:
    with pytest.raises(ValueError, match="'ffff': no cell id starts with it"):
        bucket_ready_offsets(_tables(), "ffff")
    with pytest.raises(ValueError, match="differ from the model"):
        parameter_ready_ns(_tables(), CELL, [("x", 1)])
    old = _tables()
    old["steps"]["start_ns"] = None
    with pytest.raises(ValueError, match="no step start times"):
        bucket_ready_offsets(old, CELL)
