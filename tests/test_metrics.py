"""Metrics on hand-built traces whose values are known in closed form."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest
from trace_events import x

from commprof.traces.metrics import (
    bucket_exposure,
    collective_type_metrics,
    step_metrics,
    trace_overlap,
)
from commprof.traces.trace_parser import ParsedTrace, parse_trace


def gloo_trace(
    *events: dict[str, Any], steps: tuple[tuple[int, float, float], ...] = ((0, 0, 100),)
) -> ParsedTrace:
    evs = [x(f"ProfilerStep#{n}", "user_annotation", ts, dur) for n, ts, dur in steps]
    return parse_trace({"traceEvents": evs + list(events)}, regime="cpu-gloo")


def comm(ts: float, dur: float, nbytes: int | None = None) -> dict[str, Any]:
    args = {"Input Dims": [[nbytes // 4]], "Input type": ["float"]} if nbytes else {}
    return x("gloo:all_reduce", "user_annotation", ts, dur, tid=9, **args)


def cpu(ts: float, dur: float, name: str = "aten::mm") -> dict[str, Any]:
    return x(name, "cpu_op", ts, dur)


def one_row(p: ParsedTrace) -> dict[str, Any]:
    frame = step_metrics(p)
    assert len(frame) == 1
    return {str(k): v for k, v in frame.iloc[0].to_dict().items()}


def test_partial_overlap_closed_form() -> None:
    # Window [0,100) us: compute [0,60), comm [40,80), enqueue (other) [85,90).
    r = one_row(gloo_trace(cpu(0, 60), comm(40, 40), cpu(85, 5, "c10d::allreduce_")))
    us = 1000
    assert r["window_ns"] == 100 * us
    assert r["compute_ns"] == 60 * us and r["comm_ns"] == 40 * us
    assert r["overlap_ns"] == (60 - 40) * us and r["exposed_ns"] == (80 - 60) * us
    assert r["other_ns"] == 5 * us
    assert r["idle_ns"] == (100 - 80 - 5) * us
    assert r["overlap_efficiency"] == pytest.approx(20 / 40)
    assert r["comm_overhead_fraction"] == pytest.approx(20 / 100)
    assert r["compute_ns"] + r["exposed_ns"] + r["idle_ns"] + r["other_ns"] == r["window_ns"]


def test_comm_fully_hidden_and_fully_exposed() -> None:
    hidden = one_row(gloo_trace(cpu(10, 50), cpu(20, 10), comm(15, 30)))  # nested compute
    assert (hidden["overlap_ns"], hidden["exposed_ns"], hidden["overlap_efficiency"]) == (
        30_000,
        0,
        1.0,
    )
    exposed = one_row(gloo_trace(cpu(0, 40), comm(40, 30)))  # touching, no overlap
    assert (exposed["overlap_ns"], exposed["exposed_ns"], exposed["overlap_efficiency"]) == (
        0,
        30_000,
        0.0,
    )
    assert exposed["idle_ns"] == 30_000


def test_no_communication_gives_nan_efficiency_not_zero() -> None:
    r = one_row(gloo_trace(cpu(0, 10), cpu(5, 0)))  # a zero-length op too
    assert r["comm_ns"] == 0 and math.isnan(r["overlap_efficiency"])
    assert r["comm_overhead_fraction"] == 0.0
    assert r["compute_ns"] + r["idle_ns"] == r["window_ns"] == 100_000


def test_events_are_clipped_to_their_step_windows() -> None:
    # comm [90,130) spans steps 0 [0,100) and 1 [100,200); compute [95,150).
    p = gloo_trace(comm(90, 40), cpu(95, 55), steps=((0, 0, 100), (1, 100, 100)))
    frame = step_metrics(p).set_index("step")
    assert frame.loc[0, "comm_ns"] == 10_000 and frame.loc[0, "overlap_ns"] == 5_000
    assert frame.loc[1, "comm_ns"] == 30_000 and frame.loc[1, "overlap_ns"] == 30_000
    assert frame.loc[1, "compute_ns"] == 50_000
    assert trace_overlap(p) == (40_000, 35_000)


def test_bucket_exposure_matches_by_size_then_order() -> None:
    compute = cpu(0, 50)
    # Collectives start in the order 400 B, 800 B; the hook launched 800 B first.
    p = gloo_trace(compute, comm(40, 20, nbytes=400), comm(45, 10, nbytes=800))
    records = pd.DataFrame({
        "rank": [0, 0], "step": [0, 0], "bucket_index": [0, 1], "num_bytes": [800, 400],
        "launch_ns": [1, 2], "latency_ns": [12_000, 18_000],
    })  # fmt: skip
    out = bucket_exposure(p, records).set_index("bucket_index")
    assert out.loc[0, "comm_ns"] == 10_000 and out.loc[0, "comm_exposed_ns"] == 5_000  # [45,55)
    assert out.loc[1, "comm_ns"] == 20_000 and out.loc[1, "comm_exposed_ns"] == 10_000  # [40,60)
    assert out["matched_by"].tolist() == ["size", "size"]
    assert out["latency_ns"].sum() == out["comm_ns"].sum() == 30_000  # sums agree
    per_bucket = (out["latency_ns"] - out["comm_ns"]).abs() / out["comm_ns"]
    assert per_bucket.median() == pytest.approx((0.2 + 0.1) / 2)  # 2/10 and 2/20
    # Without sizes in the trace, order decides.
    q = gloo_trace(compute, comm(40, 20), comm(45, 10))
    by_order = bucket_exposure(q, records).set_index("bucket_index")
    assert by_order.loc[0, "comm_ns"] == 20_000 and by_order["matched_by"].eq("order").all()


def test_bucket_exposure_warns_on_count_mismatch() -> None:
    p = gloo_trace(comm(10, 5))
    records = pd.DataFrame({"step": [0, 0], "bucket_index": [0, 1], "num_bytes": [4, 8]})
    with pytest.warns(UserWarning, match="2 bucket records but 1 collectives"):
        out = bucket_exposure(p, records)
    assert out["matched_by"].tolist() == ["order", "none"]
    assert out["comm_ns"].isna().tolist() == [False, True]


def test_collective_type_metrics_closed_form() -> None:
    # Window [0,100) us, compute [0,50); all-gather [10,30) and [20,40) (union 30 us, overlap
    # 30); reduce-scatter [45,65) (overlap 5); all-to-all [90,110) spans into step 1.
    meta = {"In msg nelems": 1, "dtype": "Float"}
    colls = [("_allgather_base", 10, 20), ("_allgather_base", 20, 20),
             ("reduce_scatter", 45, 20), ("all_to_all", 90, 20)]  # fmt: skip
    events = [x("gemm", "kernel", 0, 50, tid=7)] + [
        x("k", "kernel", ts, dur, tid=20, **{"Collective name": n}, **meta) for n, ts, dur in colls
    ]
    steps = [x(f"ProfilerStep#{n}", "user_annotation", t, 100) for n, t in ((0, 0), (1, 100))]
    p = parse_trace({"traceEvents": steps + events}, regime="cuda-nccl")
    out = collective_type_metrics(p).set_index(["step", "collective_type"])
    us = 1000
    assert out.loc[(0, "all_gather"), "num_collectives"] == 2
    assert out.loc[(0, "all_gather"), "comm_ns"] == (40 - 10) * us
    assert out.loc[(0, "all_gather"), "overlap_ns"] == (40 - 10) * us
    assert out.loc[(0, "reduce_scatter"), "overlap_ns"] == (50 - 45) * us
    assert out.loc[(0, "reduce_scatter"), "exposed_ns"] == (65 - 50) * us
    assert out.loc[(0, "all_to_all"), "comm_ns"] == (100 - 90) * us  # clipped to its window
    # SPAN_RULE: all_to_all, launched in step 0, runs 10 us into window 1: counted in step 0,
    # its time in the window it runs in, as the step table counts it.
    assert out.loc[(1, "all_to_all"), "num_collectives"] == 0
    assert out.loc[(1, "all_to_all"), "comm_ns"] == (110 - 100) * us
    assert list(out.index.get_level_values("step")) == [0, 0, 0, 1]
    assert step_metrics(p).set_index("step").loc[1, "comm_ns"] == (110 - 100) * us
    assert step_metrics(p).set_index("step").loc[0, "comm_ns"] == (40 - 10 + 65 - 45 + 10) * us
