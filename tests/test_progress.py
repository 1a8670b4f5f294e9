"""The driver's progress line and the table a run ends with, as a log file and a reader see
them."""

from __future__ import annotations

import io

import pandas as pd

from commprof.analysis.summary import NOT_MEASURED, summary_table
from commprof.sweeps.driver import Summary
from commprof.sweeps.progress import Progress


def test_the_final_line_is_not_printed_twice_in_a_log() -> None:
    stream = io.StringIO()  # not a terminal: one line per change
    progress, summary = Progress(stream), Summary(planned=2)
    progress.show(summary, 2, 0)
    summary.ok = 2
    progress.show(summary, 0, 0)
    progress.show(summary, 0, 0, final=True)  # nothing changed since the line above
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[-1].startswith(f"[{'#' * 24}] 2/2 ok 2"), lines


def test_a_failed_cell_shows_no_nan() -> None:
    base = {"model": "srn-100k", "world_size": 2, "backend": "gloo", "profile": False}
    cells = pd.DataFrame(
        [
            {**base, "cell_id": "a", "bucket_cap_mb": 1.0, "status": "ok", "attempt": 1},
            {**base, "cell_id": "b", "bucket_cap_mb": 25.0, "status": "failed", "attempt": 2},
        ]
    ).assign(wall_s=[3.25, float("nan")])
    steps = pd.DataFrame({"cell_id": ["a", "a"], "measured": [True, True], "step_ns": [2e6, 4e6]})
    buckets = pd.DataFrame({"cell_id": ["a"], "step": [1], "latency_ns": [1.5e6]})
    table = summary_table({"cells": cells, "steps": steps, "buckets": buckets}, ["a", "b"])
    assert "nan" not in table.lower(), table
    row_a, row_b = table.splitlines()[-2:]
    assert row_a.split()[-3:] == ["3.25", "3.00", "1.500"]  # median of 2 and 4 ms
    assert row_b.split()[-5:] == ["failed", "2", NOT_MEASURED, NOT_MEASURED, NOT_MEASURED]
