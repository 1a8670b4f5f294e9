"""Calibrating the step simulator from a dataset, and `commprof estimate --fit` end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from commprof import results
from commprof.catalog import parameter_sizes
from commprof.modeling.buckets import assign_buckets
from commprof.modeling.collective.cost_model import LinkParams, ring_allreduce_ns
from commprof.modeling.step.calibration import (
    Applied,
    StepCalibration,
    WhatIf,
    calibrate_step,
    cpu_share_scale,
    host_hook_fixed_ns,
    interference_from_rows,
    predict_step,
    split_hook,
)
from commprof.modeling.step.cap_advice import (
    TIE_TOLERANCE,
    advise_cap,
    baseline_label,
    best_of,
    recommend_cap,
)
from commprof.modeling.step.idle import DEFAULT_ALPHA_NS
from commprof.modeling.step.model import (
    IDLE,
    REPEAT_KEYS,
    CapPrediction,
    Corrections,
    host_cells,
    host_interference,
    in_sample_layout,
    link_fit,
    link_stall_ns,
    load_step_model,
    predict_cap,
    recalibrated_without,
    repeats_of,
    without_in_sample,
)
from commprof.modeling.step.simulator import NO_INTERFERENCE, Interference, simulate_step
from commprof.query import ok_attempts
from tests.test_in_sample import assert_in_sample, assert_reproduces, estimate

CELL = "0123456789ab"


def _tables(hook_ns: int = 0) -> dict[str, pd.DataFrame]:
    """One cell, two ranks, one measured step; parameters a (100 B) and b (300 B), b first."""
    key = {"cell_id": CELL, "attempt": 1}
    cells = pd.DataFrame([{**key, "status": "ok", "world_size": 2, "backend": "gloo"}])
    # backward starts at 1000 + 100; step = 100 + 900 + 50
    steps = pd.DataFrame(
        [
            {**key, "rank": r, "step": 1, "measured": True, "start_ns": 1000, "forward_ns": 100,
             "backward_ns": 900, "optimizer_ns": 50, "step_ns": 1050}
            for r in (0, 1)
        ]
    )  # fmt: skip
    # rank 0: bucket 0 ready at 200 into backward, in flight 200..600; bucket 1 ready at 800,
    # in flight 800..850. Rank 1 hands bucket 0 over later (300): the slowest rank counts.
    rows = []
    for rank, r0 in ((0, 200), (1, 300)):
        for b, (ready, done, nbytes) in enumerate(((r0, 600, 300), (800, 850, 100))):
            rows.append(
                {**key, "rank": rank, "step": 1, "bucket_index": b, "num_bytes": nbytes,
                 "ready_ns": 1100 + ready, "launch_ns": 1100 + ready + hook_ns,
                 "done_ns": 1100 + done}
            )  # fmt: skip
    params = pd.DataFrame(
        [
            {**key, "bucket_index": 0, "position": 0, "param_name": "b", "num_bytes": 300},
            {**key, "bucket_index": 1, "position": 0, "param_name": "a", "num_bytes": 100},
        ]
    )
    return {"cells": cells, "steps": steps, "buckets": pd.DataFrame(rows), "bucket_params": params}


def test_calibration_takes_interference_out_of_the_timeline() -> None:
    slow = Interference(sizes_bytes=(1.0,), comm_slowdown=(1.0,), compute_slowdown=(2.0,))
    cal = calibrate_step(_tables(), CELL, [("a", 25), ("b", 75)], slow)
    # rank 1: bucket 0 ready at 300 (nothing in flight before) -> work 300; bucket 1 at 800,
    # of which 300..600 ran under its all-reduce at half speed: 800 - 300 * (1 - 1/2) = 650.
    # rank 0 is at most that; the max over ranks is rank 1's.
    assert cal.param_ready_work_ns == (650.0, 300.0)  # registration order: a, b
    assert cal.compute_work_ns == 650.0  # the last hand-over (hooks take no time here)
    assert cal.other_ns == 900 - 850  # backward after the last all-reduce
    assert (cal.forward_ns, cal.optimizer_ns, cal.measured_step_ns) == (100, 50, 1050)
    idle = calibrate_step(_tables(), CELL, [("a", 25), ("b", 75)], NO_INTERFERENCE)
    assert idle.param_ready_work_ns == (800.0, 300.0)


def test_the_timeline_is_the_slowest_ranks_and_exposed_every_ranks() -> None:
    # rank 0 ends its compute (last hand-over) at 650, rank 1 at 800; both all-reduces end at
    # 850: rank 0 measures 200 ns exposed, rank 1 (the slowest) 50; the measured exposed time is
    # the median over rank-steps (125), what the exposed residual is fitted to
    tables = _tables()
    early = (tables["buckets"]["rank"] == 0) & (tables["buckets"]["bucket_index"] == 1)
    tables["buckets"].loc[early, ["ready_ns", "launch_ns"]] -= 150
    cal = calibrate_step(tables, CELL, [("a", 25), ("b", 75)], NO_INTERFERENCE)
    assert cal.measured_exposed_ns == 125
    assert cal.param_ready_work_ns == (800.0, 300.0)  # the timeline is the slowest rank's


def test_repeats_are_pooled() -> None:
    # a repeat of the cell whose second bucket was ready 200 ns later: per (cell, step) the
    # slowest rank, then the median over the pooled steps (of two: their mean)
    one = _tables()
    two = {name: frame.copy() for name, frame in _tables().items()}
    for frame in two.values():
        frame["cell_id"] = "fedcba987654"
    late = two["buckets"]["bucket_index"] == 1
    two["buckets"].loc[late, ["ready_ns", "launch_ns", "done_ns"]] += 200
    two["steps"]["backward_ns"] += 200
    both = {name: pd.concat([one[name], two[name]], ignore_index=True) for name in one}
    sizes = [("a", 25), ("b", 75)]
    cal = calibrate_step(both, [CELL, "fedcba987654"], sizes, NO_INTERFERENCE)
    assert cal.param_ready_work_ns == (900.0, 300.0) and cal.cell_ids == (CELL, "fedcba987654")
    assert cal.other_ns == 50  # both backwards end 50 ns after their last all-reduce
    alone = calibrate_step(both, CELL, sizes, NO_INTERFERENCE)
    assert alone.param_ready_work_ns == (800.0, 300.0) and alone.cell_ids == (CELL,)
    both["cells"].loc[1, "world_size"] = 4
    with pytest.raises(ValueError, match="differ in world_size"):
        calibrate_step(both, [CELL, "fedcba987654"], sizes, NO_INTERFERENCE)


def test_repeats_of_a_configuration() -> None:
    base = dict.fromkeys(REPEAT_KEYS, "x") | {"bucket_cap_mb": float("nan"), "status": "ok"}
    base |= {"attempt": 1}
    cells = pd.DataFrame([
        base | {"cell_id": "c", "repeat": 0}, base | {"cell_id": "a", "repeat": 1},
        base | {"cell_id": "b", "repeat": 2, "batch_size": 16},  # another configuration
        base | {"cell_id": "d", "repeat": 3, "status": "failed"},
        base | {"cell_id": "e", "repeat": 4},  # recorded no buckets
        base | {"cell_id": "f", "repeat": 5, "profile": True},  # measured another way
    ])  # fmt: skip
    buckets = pd.DataFrame({"cell_id": ["a", "b", "c", "d", "f"]})
    assert repeats_of({"cells": cells, "buckets": buckets}, "c") == ["c", "a"]


def test_interference_rows_of_the_host() -> None:
    # the arms measure host and backend: every ok cell of one (backend, device, world size)
    # counts, its latest attempt only
    base = {"backend": "gloo", "device": "cpu", "world_size": 2, "status": "ok", "attempt": 1}
    cells = pd.DataFrame([
        base | {"cell_id": "a"}, base | {"cell_id": "b"},  # another model or cap: same host
        base | {"cell_id": "c", "world_size": 4}, base | {"cell_id": "d", "backend": "nccl"},
        base | {"cell_id": "e", "status": "failed"},
        base | {"cell_id": "f"}, base | {"cell_id": "f", "attempt": 2},  # retried
    ])  # fmt: skip
    rows = pd.DataFrame(
        {"cell_id": ["a", "b", "c", "d", "e", "f", "f"], "attempt": [1, 1, 1, 1, 1, 1, 2]}
    )
    got = host_interference({"cells": cells, "interference": rows}, "a")
    assert sorted(zip(got["cell_id"], got["attempt"], strict=True)) == [
        ("a", 1), ("b", 1), ("f", 2)
    ]  # fmt: skip
    host = host_cells({"cells": cells}, "a")
    assert sorted(zip(host["cell_id"], host["attempt"], strict=True)) == [
        ("a", 1), ("b", 1), ("f", 2)
    ]  # fmt: skip


def test_the_link_is_the_hosts_unless_cells_are_named() -> None:
    tables = results.load(Path(__file__).parent / "data" / "results_smoke")
    sizes = parameter_sizes("srn-1m")
    model = load_step_model(tables, "srn-1m", world_size=2, param_sizes=sizes)
    pooled = list(model.calibration.cell_ids)
    host = [c for c in host_cells(tables, pooled[0])["cell_id"] if c not in pooled]
    assert host  # other models and caps of the host: their microbenchmarks count
    assert model.link == link_fit(tables, [*pooled, *host])[0]
    # named cells (the step-model benchmark names the calibration cells, none held out): the
    # calibration repeats and those
    own = load_step_model(tables, "srn-1m", world_size=2, param_sizes=sizes, link_cells=[])
    assert own.link == link_fit(tables, pooled)[0]
    assert own.link.num_points < model.link.num_points  # type: ignore[union-attr]


def test_the_residuals_apply_in_sample_only() -> None:
    tables = results.load(Path(__file__).parent / "data" / "results_smoke")
    sizes = parameter_sizes("srn-1m")
    model = load_step_model(tables, "srn-1m", world_size=2, param_sizes=sizes)
    without = recalibrated_without(model, ["exposed_residual", "host_residual"], sizes)
    cal = model.calibration
    assert cal.bucket_cap_mb == 25 and model.exposed_residual_ns != 0
    assert model.host_residual_ns != 0
    # 4 MiB makes the calibration's one bucket: in sample, both residuals added
    assert in_sample_layout(model, sizes, bucket_cap_mb=4, world_size=2)
    same = predict_cap(model, sizes, bucket_cap_mb=4).prediction
    assert same.exposed_residual_ns == pytest.approx(model.exposed_residual_ns)
    assert same.host_residual_ns == pytest.approx(model.host_residual_ns)
    assert same.exposed_ns == pytest.approx(cal.measured_exposed_ns)
    assert same.step_ns == pytest.approx(cal.measured_step_ns)
    # other buckets (1 MiB, DDP's default) or another world size: the model without them
    for cap, ws in ((1, 2), (None, 2), (25, 3)):
        assert not in_sample_layout(model, sizes, bucket_cap_mb=cap, world_size=ws)
        got = predict_cap(model, sizes, bucket_cap_mb=cap, world_size=ws).prediction
        off = predict_cap(without, sizes, bucket_cap_mb=cap, world_size=ws).prediction
        assert got.exposed_residual_ns == got.host_residual_ns == 0
        assert (got.exposed_ns, got.step_ns) == (off.exposed_ns, off.step_ns)
    # the calibration's own buckets on another link: not its configuration
    published = LinkParams.from_bandwidth(bandwidth_bytes_per_s=450e9, alpha_ns=DEFAULT_ALPHA_NS)
    elsewhere = predict_cap(model, sizes, bucket_cap_mb=4, link=published).prediction
    assert elsewhere.exposed_residual_ns == elsewhere.host_residual_ns == 0


def test_the_advice_compares_every_cap_out_of_sample() -> None:
    # the calibration's cap with its measurement, the others with the model, would move the
    # advice by the residuals alone: every point of the search is the model's
    tables = results.load(Path(__file__).parent / "data" / "results_smoke")
    sizes = parameter_sizes("srn-1m")
    model = load_step_model(tables, "srn-1m", world_size=2, param_sizes=sizes)
    base = recalibrated_without(model, ["exposed_residual", "host_residual"], sizes)
    for residual in (-0.2, 0.0, 0.2):  # the calibration cap's own gap, either sign
        shifted = replace(model, host_residual_ns=residual * model.calibration.measured_step_ns)
        advice = recommend_cap(shifted, sizes, caps_mb=(1.0, 4.0, 25.0), in_use_mb=25.0)
        for point in advice.curve:
            alone = predict_cap(base, sizes, bucket_cap_mb=point.bucket_cap_mb)
            assert point.step_ns == alone.step_ns and point.exposed_ns == alone.exposed_ns
        assert advice.best_cap_mb == 25.0  # 4 and 25 MiB make one bucket: the cap in use kept
    # a caller's other corrections are kept: the stall switched off stays off
    no_stall = Corrections.without(["stall"])
    full = recommend_cap(model, sizes, caps_mb=(1.0,)).curve[0]
    off = recommend_cap(model, sizes, caps_mb=(1.0,), corrections=no_stall).curve[0]
    alone = predict_cap(model, sizes, bucket_cap_mb=1.0, corrections=without_in_sample(no_stall))
    assert off.step_ns == alone.step_ns != full.step_ns
    with pytest.raises(TypeError, match=r"corrections must be a step\.model\.Corrections"):
        recommend_cap(model, sizes, caps_mb=(1.0,), corrections="stall")


def test_hook_time_is_fitted_on_bytes_and_taken_out() -> None:
    cal = calibrate_step(_tables(hook_ns=10), CELL, [("a", 25), ("b", 75)], NO_INTERFERENCE)
    # both buckets' hooks took 10 ns: the line through (100 B, 10) and (300 B, 10) is flat
    assert cal.hook_fixed_ns == pytest.approx(10) and cal.hook_ns_per_byte == pytest.approx(0)
    # bucket 1's ready time holds bucket 0's hook: 800 - 10
    assert cal.param_ready_work_ns == pytest.approx((790.0, 300.0))


def test_one_bucket_size_puts_the_hook_time_on_bytes() -> None:
    tables = _tables(hook_ns=40)
    tables["buckets"]["num_bytes"] = 200  # both buckets one size: fixed and per byte are one
    cal = calibrate_step(tables, CELL, [("a", 25), ("b", 75)], NO_INTERFERENCE)
    assert (cal.hook_fixed_ns, cal.hook_ns_per_byte) == (0.0, 40 / 200)


def test_a_one_size_hook_cost_is_split_by_the_hosts_fixed_part() -> None:
    tables = _tables(hook_ns=40)
    tables["buckets"]["num_bytes"] = 200
    cal = calibrate_step(tables, CELL, [("a", 25), ("b", 75)], NO_INTERFERENCE)
    assert cal.hook_sizes_bytes == (200,)
    split = split_hook(cal, 10.0)
    # 10 a bucket, the other 30 of the 40 at 200 B per byte: the same cost at its own size
    assert (split.hook_fixed_ns, split.hook_ns_per_byte) == (10.0, 30 / 200)
    cost = split.hook_fixed_ns + split.hook_ns_per_byte * 50  # a bucket of 50 B: 10 + 7.5
    assert cost == pytest.approx(17.5)  # 10 without the split (40 / 200 * 50)
    # the fixed part is at most the whole cost; nothing to split without it or with two sizes
    assert (split_hook(cal, 100.0).hook_fixed_ns, split_hook(cal, 100.0).hook_ns_per_byte) == (
        40.0, 0.0,
    )  # fmt: skip
    assert split_hook(cal, 0.0) is cal
    two = calibrate_step(_tables(hook_ns=40), CELL, [("a", 25), ("b", 75)], NO_INTERFERENCE)
    assert two.hook_sizes_bytes == (100, 300) and split_hook(two, 10.0) is two


def test_the_hosts_fixed_hook_part_is_the_intercept_over_its_sizes() -> None:
    tables = _tables()
    b = tables["buckets"]
    b["launch_ns"] = b["ready_ns"] + 25 + b["num_bytes"] // 10  # 25 ns + 0.1 ns/B: 35 and 55
    keys = pd.DataFrame([{"cell_id": CELL, "attempt": 1}])
    assert host_hook_fixed_ns(tables, keys) == pytest.approx(25)
    # a second cell at 500 B (75 ns) pools with it; a warm-up step and another attempt do not
    other = b.assign(cell_id="fedcba987654", num_bytes=500, launch_ns=b["ready_ns"] + 75)
    warm = b.assign(step=0, launch_ns=b["ready_ns"] + 9000)
    stale = b.assign(attempt=2, launch_ns=b["ready_ns"] + 9000)
    tables["buckets"] = pd.concat([b, other, warm, stale])
    steps = tables["steps"]
    tables["steps"] = pd.concat([
        steps, steps.assign(cell_id="fedcba987654"), steps.assign(step=0, measured=False),
        steps.assign(attempt=2),
    ])  # fmt: skip
    both = pd.DataFrame(
        [{"cell_id": CELL, "attempt": 1}, {"cell_id": "fedcba987654", "attempt": 1}]
    )
    assert host_hook_fixed_ns(tables, both) == pytest.approx(25)
    tables["buckets"]["num_bytes"] = 200  # one size: no intercept to take
    assert host_hook_fixed_ns(tables, both) == 0.0


def test_the_hook_split_takes_the_hosts_unprofiled_cells_and_moves_a_small_cap() -> None:
    tables = results.load(Path(__file__).parent / "data" / "results_smoke")
    sizes = parameter_sizes("srn-1m")
    model = load_step_model(tables, "srn-1m", world_size=2, param_sizes=sizes)
    pooled = list(model.calibration.cell_ids)
    cells = tables["cells"]
    host = ok_attempts(cells, [*pooled, *host_cells(tables, pooled[0])["cell_id"]])
    assert host["profile"].any()  # a profiled cell of the host, left out: the profiler's cost
    unprofiled = host[~host["profile"].astype(bool) & (host["hook"] == "allreduce")]
    assert model.hook_fixed_ns == host_hook_fixed_ns(tables, unprofiled) > 0
    assert model.hook_fixed_ns != host_hook_fixed_ns(tables, host)
    # srn-1m's calibration saw one size: at 0.25 MiB each of its many buckets pays the fixed
    # part, so the step is longer than with the cost all per byte
    without = recalibrated_without(model, ["hook_split"], sizes)
    split = predict_cap(model, sizes, bucket_cap_mb=0.25)
    assert split.num_buckets == 9
    assert split.step_ns > predict_cap(without, sizes, bucket_cap_mb=0.25).step_ns
    assert predict_cap(model, sizes, bucket_cap_mb=25).step_ns == pytest.approx(
        predict_cap(without, sizes, bucket_cap_mb=25).step_ns
    )  # its own size: the same cost


def test_interference_rows_to_factors() -> None:
    rows = pd.DataFrame(
        [
            {"arm": "comm_under_compute", "num_bytes": 1024, "slowdown": 3.0,
             "slowdown_q25": 2.0, "slowdown_q75": 4.0},
            {"arm": "compute_under_comm", "num_bytes": 1024, "slowdown": 1.2,
             "slowdown_q25": 1.1, "slowdown_q75": 1.3},
            {"arm": "compute_under_comm", "num_bytes": 4096, "slowdown": 0.9,
             "slowdown_q25": 0.8, "slowdown_q75": 1.0},
            {"arm": "comm_under_compute", "num_bytes": 4096, "slowdown": 5.0,
             "slowdown_q25": 5.0, "slowdown_q75": 5.0},
        ]
    )  # fmt: skip
    i = interference_from_rows(rows)
    assert i.sizes_bytes == (1024.0, 4096.0)
    # 0.9 is noise (overlap speeds nothing up): 1
    assert i.comm_slowdown == (3.0, 5.0) and i.compute_slowdown == (1.2, 1.0)
    assert i.comm_spread == (1.0, 0.0)
    assert i.shifted(1.0).comm_slowdown == (4.0, 5.0)
    assert interference_from_rows(rows.iloc[0:0]) is NO_INTERFERENCE
    # rows with the mean: it is the factor (default), the median on request; null falls back
    rows["slowdown_mean"] = [6.0, 1.5, None, 7.0]
    assert interference_from_rows(rows).comm_slowdown == (6.0, 7.0)
    assert interference_from_rows(rows).compute_slowdown == (1.5, 1.0)
    assert interference_from_rows(rows, statistic="median").comm_slowdown == (3.0, 5.0)
    with pytest.raises(ValueError, match="statistic"):
        interference_from_rows(rows, statistic="p90")
    # the burst arm's queue factor was 1 on every run: the model no longer reads it
    burst = {"arm": "comm_burst", "num_bytes": 1024, "slowdown": 2.0, "slowdown_mean": 2.5,
             "slowdown_q25": 1.5, "slowdown_q75": 3.5}  # fmt: skip
    with_burst = pd.concat([rows, pd.DataFrame([burst])], ignore_index=True)
    assert interference_from_rows(with_burst) == interference_from_rows(rows)


def test_cpu_share_scale() -> None:
    assert cpu_share_scale(4, 2, num_cores=2) == 2.0  # 4 ranks on 2 cores vs 2 on 2
    assert cpu_share_scale(4, 2, num_cores=8) == 1.0
    with pytest.raises(ValueError, match="num_cores"):
        cpu_share_scale(2, 2, num_cores=0)


def _commprof(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "commprof", *args],
        capture_output=True, text=True, env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _assert_advised(
    points: dict[float | None, tuple[float, int]], advised: float | None, in_use: float | None
) -> None:
    """Of the caps within TIE_TOLERANCE of the shortest step the advised one has the fewest
    buckets, unless it is the cap in use, predicted within the tolerance of that one."""
    shortest = min(step for step, _ in points.values())
    near = [(n, s) for s, n in points.values() if s <= shortest * (1 + TIE_TOLERANCE)]
    pick_step = min(near)[1]
    if points[in_use][0] <= pick_step * (1 + TIE_TOLERANCE):
        assert advised == in_use
    else:
        assert points[advised][0] <= shortest * (1 + TIE_TOLERANCE)
        assert points[advised][1] == min(near)[0]


def test_estimate_says_where_the_overlap_is_the_models_not_measured() -> None:
    # srn-1m's 25 MiB cells are one bucket, all-reduced after backward: a cap of several buckets
    # overlaps backward by the model alone; its own cap, or a calibration at 0.25 MiB, does not
    data = Path(__file__).parent / "data" / "results_smoke"
    common = ["--model", "srn-1m", "--fit", str(data), "--world-size", "2"]
    own = json.loads(estimate(*common, "--bucket-cap-mb", "25", "--json"))
    assert own["extrapolation"] is None
    small = json.loads(
        estimate(*common, "--bucket-cap-mb", "0.25", "--recommend-bucket-cap", "--json")
    )
    nine = len(assign_buckets(parameter_sizes("srn-1m"), bucket_cap_mb=0.25))
    assert nine > 1
    assert small["extrapolation"]["calibration_buckets"] == 1
    assert small["extrapolation"]["buckets"] == small["prediction"]["num_buckets"] == nine
    rec = small["recommendation"]
    assert rec["extrapolation"]["buckets"] == max(c["num_buckets"] for c in rec["curve"])
    text = estimate(*common, "--bucket-cap-mb", "0.25", "--recommend-bucket-cap")
    assert f"how {nine} buckets overlap backward" in text
    assert "how the caps here with several buckets overlap backward" in text
    assert rec["basis"] == "model"
    cells = results.load(data)["cells"]
    at = cells[
        (cells["model"] == "srn-1m") & (cells["world_size"] == 2) & (cells["bucket_cap_mb"] == 0.25)
        & (cells["status"] == "ok")
    ]  # fmt: skip
    measured = json.loads(
        estimate(*common, "--cell", str(at["cell_id"].iloc[0]), "--bucket-cap-mb", "1",
                  "--recommend-bucket-cap", "--json")
    )  # fmt: skip
    assert measured["extrapolation"] is None
    assert measured["recommendation"]["extrapolation"] is None


@pytest.mark.slow
def test_one_default_cell_calibrates_estimate(tmp_path: Path) -> None:
    # A new user's path: one `commprof run` with default flags, then `estimate --fit` on it.
    data = tmp_path / "data"
    _commprof("run", "--model", "srn-100k", "--world-size", "2", "--out", str(data))
    common = ["estimate", "--model", "srn-100k", "--fit", str(data), "--json"]
    doc = json.loads(_commprof(*common, "--world-size", "2", "--recommend-bucket-cap"))
    pred = doc["prediction"]
    sizes = parameter_sizes("srn-100k")
    assert pred["num_buckets"] == len(assign_buckets(sizes, bucket_cap_mb=None))
    assert len(pred["buckets"]) == pred["num_buckets"]
    assert pred["step_ns_low"] <= pred["step_ns"] <= pred["step_ns_high"]
    assert 0 <= pred["exposed_ns"] <= pred["step_ns"]
    assert pred["overlap_efficiency"] is None or 0 <= pred["overlap_efficiency"] <= 1
    assert_reproduces(data, "srn-100k", 2)  # a one-cell `commprof run`
    for b in pred["buckets"]:
        assert b["ready_ns"] <= b["start_ns"] <= b["end_ns"]
    rec = doc["recommendation"]
    points = {c["bucket_cap_mb"]: (c["step_ns"], c["num_buckets"]) for c in rec["curve"]}
    # no --bucket-cap-mb: the dataset's cap in use, searched with the grid; `commprof run`'s
    # default is an explicit 25 MiB cap (its --help), a layout other than DDP's default
    in_use = pd.read_parquet(data / "cells")["bucket_cap_mb"].iloc[0]
    assert in_use == 25.0 and doc["calibration"]["bucket_cap_mb"] == in_use
    assert rec["in_use_bucket_cap_mb"] == in_use and in_use in points
    assert rec["baseline"] == baseline_label(in_use, dataset=True)
    _assert_advised(points, rec["best_bucket_cap_mb"], in_use)
    # `--bucket-cap-mb default` asks about DDP's default layout instead: it is searched, named
    ddp = json.loads(_commprof(*common, "--world-size", "2", "--recommend-bucket-cap",
                               "--bucket-cap-mb", "default"))["recommendation"]  # fmt: skip
    ddp_points = {c["bucket_cap_mb"]: (c["step_ns"], c["num_buckets"]) for c in ddp["curve"]}
    assert ddp["in_use_bucket_cap_mb"] is None and None in ddp_points
    assert ddp["baseline"] == baseline_label(None)
    _assert_advised(ddp_points, ddp["best_bucket_cap_mb"], None)
    # the calibrated model reproduces its calibration: the step (host residual) and the exposed
    # communication (exposed residual), and says so (in sample)
    tables = results.load(data)
    model = load_step_model(tables, "srn-100k", world_size=2, param_sizes=sizes)
    cal = model.calibration
    replay = predict_cap(model, sizes, bucket_cap_mb=cal.bucket_cap_mb).prediction
    assert replay.step_ns == pytest.approx(cal.measured_step_ns, rel=1e-6)
    assert abs(replay.exposed_ns - cal.measured_exposed_ns) <= 0.05 * cal.measured_step_ns
    assert_in_sample(doc)
    assert doc["calibration"]["exposed_residual_ns"] == round(model.exposed_residual_ns)
    assert pred["exposed_residual_ns"] == round(replay.exposed_residual_ns)
    # the exposed residual is the calibrated link's on its host: the idle model and a published
    # link leave it out
    idle = predict_cap(model, sizes, bucket_cap_mb=None, corrections=IDLE)
    published = LinkParams.from_bandwidth(bandwidth_bytes_per_s=450e9, alpha_ns=DEFAULT_ALPHA_NS)
    elsewhere = predict_cap(model, sizes, bucket_cap_mb=None, link=published)
    assert idle.prediction.exposed_residual_ns == elsewhere.prediction.exposed_residual_ns == 0
    # p = 4 on the same host, without interference: compute scales by the core share exactly
    env = json.loads(pd.read_parquet(data / "cells")["env_json"].iloc[0])
    cores = env["cpu_count"] / env["num_threads"]
    two, four = (
        json.loads(_commprof(*common, "--world-size", p, "--same-host", "--no-interference"))
        for p in ("2", "4")
    )
    scale = cpu_share_scale(4, 2, num_cores=int(cores))
    assert four["prediction"]["compute_end_ns"] == pytest.approx(
        scale * two["prediction"]["compute_end_ns"], rel=1e-6, abs=2
    )
    # ... and so do gloo's transfers over loopback, against p = 4 on ranks of their own
    apart = json.loads(_commprof(*common, "--world-size", "4", "--no-interference"))
    pairs = zip(four["prediction"]["buckets"], apart["prediction"]["buckets"], strict=True)
    for shared, own in pairs:
        assert shared["service_ns"] == pytest.approx(scale * own["service_ns"], rel=1e-6, abs=2)
    # a published link: the measured compute kept, each bucket's all-reduce the ring model's
    swapped = json.loads(
        _commprof(*common, "--world-size", "2", "--interconnect", "nvlink4", "--no-interference")
    )
    link = LinkParams.from_bandwidth(bandwidth_bytes_per_s=450e9, alpha_ns=DEFAULT_ALPHA_NS)
    for b in swapped["prediction"]["buckets"]:
        assert b["service_ns"] == round(float(ring_allreduce_ns(b["num_bytes"], 2, link)))
    assert swapped["prediction"]["compute_end_ns"] == two["prediction"]["compute_end_ns"]
    # the one-call API a report uses agrees with the command line's search
    advice = advise_cap(results.load(data), "srn-100k", 2, caps_mb=(0.25, 32.0), in_use_mb=32.0)
    assert [c.bucket_cap_mb for c in advice.curve] == [0.25, 32.0]
    _assert_advised(
        {c.bucket_cap_mb: (c.step_ns, c.num_buckets) for c in advice.curve},
        advice.best_cap_mb,
        32.0,
    )
    by_cap = {c["bucket_cap_mb"]: c["step_ns"] for c in rec["curve"]}
    assert [round(c.step_ns) for c in advice.curve] == [by_cap[0.25], by_cap[32.0]]


def test_link_fit_pools_the_group_where_a_cell_has_too_few_sizes() -> None:
    # two older cells of one group, two microbenchmark sizes each: together four sizes
    cells = pd.DataFrame(
        [
            {"cell_id": c, "attempt": 1, "status": "ok", "backend": "gloo", "device": "cpu",
             "world_size": 2}
            for c in ("a" * 12, "b" * 12)
        ]
    )  # fmt: skip
    # times of an exact ring model, alpha 1000 ns and beta 1 ns/B at p = 2: 2000 + n
    micro = pd.DataFrame(
        [
            {"cell_id": c, "attempt": 1, "num_bytes": n, "time_p50_ns": 2000 + n, "num_wrong": 0}
            for c, sizes in (("a" * 12, (1000, 4000)), ("b" * 12, (16000, 64000)))
            for n in sizes
        ]
    )
    fit, stall = link_fit({"cells": cells, "microbench": micro}, ["a" * 12])
    assert fit.num_points == 4  # type: ignore[union-attr]
    assert fit.predict_ns([8000], 2)[0] == pytest.approx(2000 + 8000)
    assert stall == 0.0  # no mean times recorded: no stall measured
    with pytest.raises(ValueError, match="rerun it"):
        link_fit({"cells": cells.iloc[:1], "microbench": micro}, ["a" * 12])
    # repeats of one size: the fit goes through the median of their typical times (a repeat
    # 9 times slower moves it not at all) and the stall is the mean's excess per iteration
    again = micro.assign(time_p50_ns=9 * micro["time_p50_ns"])
    both = pd.concat([micro, micro, again], ignore_index=True)
    both["num_iters"] = 10
    both["time_mean_ns"] = both["time_p50_ns"] + 300
    both.loc[both.index[-1], ["time_mean_ns", "num_iters"]] = [None, 1000]  # before the column
    fit, stall = link_fit({"cells": cells, "microbench": both}, ["a" * 12, "b" * 12])
    assert fit.num_points == 4  # type: ignore[union-attr]
    assert fit.predict_ns([8000], 2)[0] == pytest.approx(2000 + 8000)
    assert stall == pytest.approx(300)
    # two more cells that timed each size once (a matrix's microbench_iters: 1) do not move it
    # (counted, they would halve it: the median of 300, 300, 0 and 0)
    ones = ["c" * 12, "d" * 12]
    once = pd.concat(
        [micro.assign(cell_id=c, num_iters=1, time_mean_ns=micro["time_p50_ns"]) for c in ones]
    )
    more_cells = pd.concat([cells, *(cells.iloc[:1].assign(cell_id=c) for c in ones)])
    fit, stall = link_fit(
        {"cells": more_cells, "microbench": pd.concat([both, once], ignore_index=True)},
        ["a" * 12, "b" * 12, *ones],
    )
    assert stall == pytest.approx(300)


def test_stall_is_the_mean_excess_per_iteration() -> None:
    rows = pd.DataFrame({
        "num_bytes": [1000, 1000, 64000], "num_iters": [10, 30, 60],
        "time_p50_ns": [100.0, 200.0, 5000.0], "time_mean_ns": [400.0, 200.0, 5100.0],
    })  # fmt: skip
    # (300 x 10 + 0 x 30 + 100 x 60) / 100 iterations
    assert link_stall_ns(rows) == pytest.approx(90.0)
    # a mean below the median (noise) counts as it is; a negative total is no stall
    assert link_stall_ns(rows.assign(time_mean_ns=rows["time_p50_ns"] - 1)) == 0.0
    assert link_stall_ns(rows.drop(columns="time_mean_ns")) == 0.0  # rows from before it
    assert link_stall_ns(rows.assign(time_mean_ns=None)) == 0.0


def test_stall_is_the_median_over_cells() -> None:
    # three cells of 10 iterations at one size: excess 30, 200 and a minute of host load 5000
    rows = pd.DataFrame({
        "cell_id": ["a", "b", "c"], "num_bytes": [1000] * 3, "num_iters": [10] * 3,
        "time_p50_ns": [1000.0] * 3, "time_mean_ns": [1030.0, 1200.0, 6000.0],
    })  # fmt: skip
    assert link_stall_ns(rows) == pytest.approx(200.0)
    # a cell's iterations are pooled over its sizes, weighted by their number: b's (200 x 10 +
    # 0 x 30) / 40 = 50 (the mean of its two rows would be 100), so the median is 50
    b_large = rows.iloc[[1]].assign(num_bytes=64000, num_iters=30, time_mean_ns=1000.0)
    assert link_stall_ns(pd.concat([rows, b_large])) == pytest.approx(50.0)
    # rows of fewer than 3 iterations are left out (their mean is their median), whatever they
    # hold, and a cell of nothing else with them; a row of 3 counts
    few = rows.assign(cell_id=["d", "e", "f"], num_iters=[1, 2, 2], time_mean_ns=1000.0)
    assert link_stall_ns(pd.concat([rows, few])) == pytest.approx(200.0)
    assert link_stall_ns(few.assign(time_mean_ns=9000.0)) == 0.0
    assert link_stall_ns(few.assign(num_iters=3, time_mean_ns=1010.0)) == pytest.approx(10.0)


def test_prediction_in_closed_form() -> None:
    # two parameters, each 1000 float32 (4000 B): a huge cap makes one bucket of 8000 B, ready
    # once all compute (300 ns of work) is done; the hook costs 10 + 0.01 ns/B = 90 ns; the link
    # has alpha 0 and 1 ns/B, so at p = 2 the all-reduce takes 2 (1/2) 8000 = 8000 ns, all exposed
    # with the hook before it (the hook's exposed time runs from its entry)
    cal = StepCalibration(
        cell_id=CELL, world_size=2, backend="nccl", param_ready_work_ns=(300.0, 100.0),
        compute_work_ns=300.0, hook_fixed_ns=10.0, hook_ns_per_byte=0.01, forward_ns=50.0,
        optimizer_ns=20.0, other_ns=5.0, measured_step_ns=0.0,
        bucket_cap_mb=512.0,
    )  # fmt: skip
    sizes = [("a", 1000), ("b", 1000)]
    link = LinkParams(alpha_ns=0.0, beta_ns_per_byte=1.0)
    p = predict_step(cal, sizes, WhatIf(bucket_cap_mb=512, link=link))
    assert len(p.buckets) == 1 and p.exposed_ns == pytest.approx(90 + 8000)
    assert p.step_ns == pytest.approx(50 + 300 + 90 + 8000 + 20 + 5)
    # p = 4: 2 (3/4) 8000 = 12000 ns; compute scaled by 2: forward, work, hooks and optimizer
    p4 = predict_step(
        cal, sizes, WhatIf(bucket_cap_mb=512, link=link, world_size=4, compute_scale=2)
    )
    assert p4.step_ns == pytest.approx(2 * (50 + 300 + 90 + 20) + 12000 + 5)
    # a cap of 4000 B: b (registration index 1) is ready first at 100, then a at 300
    two = predict_step(cal, sizes, WhatIf(bucket_cap_mb=4000 / 2**20, link=link))
    hook = 10 + 0.01 * 4000
    assert [b.ready_ns for b in two.buckets] == pytest.approx([100, 300 + hook])
    assert two.compute_end_ns == pytest.approx(300 + 2 * hook)
    # 4000 ns all-reduces: the first handed over at 100 + 50, done at 4150; the second handed
    # over at 400 and queued behind it on nccl's one channel until 4150, done at 8150
    assert two.buckets[1].end_ns == pytest.approx(4150 + 4000)
    with pytest.raises(ValueError, match="parameters"):
        predict_step(cal, sizes[:1], WhatIf(bucket_cap_mb=1, link=link))
    # service_scale multiplies the link's times: the exposed all-reduce takes 3 x 8000
    p3 = predict_step(cal, sizes, WhatIf(bucket_cap_mb=512, link=link, service_scale=3))
    assert p3.exposed_ns == pytest.approx(90 + 24000)
    with pytest.raises(ValueError, match="service_scale"):
        predict_step(cal, sizes, WhatIf(bucket_cap_mb=512, link=link, service_scale=0))
    # a stall is added to each all-reduce before the scale: 3 x (8000 + 500); per bucket, so
    # two buckets of 4000 B pay it twice
    p3 = predict_step(
        cal, sizes, WhatIf(bucket_cap_mb=512, link=link, service_scale=3), Applied(stall_ns=500)
    )
    assert p3.exposed_ns == pytest.approx(90 + 3 * 8500)
    two_stalled = predict_step(
        cal, sizes, WhatIf(bucket_cap_mb=4000 / 2**20, link=link), Applied(stall_ns=500)
    )
    assert two_stalled.buckets[1].end_ns == pytest.approx(150 + 2 * 4500)
    with pytest.raises(ValueError, match="stall_ns"):
        predict_step(cal, sizes, WhatIf(bucket_cap_mb=512, link=link), Applied(stall_ns=-1))
    # an exposed residual of 300 ns (scaled with the compute, x 2) adds that much exposed
    # communication and communication time; the step does not move
    waited = predict_step(
        cal,
        sizes,
        WhatIf(bucket_cap_mb=512, link=link, compute_scale=2),
        Applied(exposed_residual_ns=300),
    )
    slowest = predict_step(cal, sizes, WhatIf(bucket_cap_mb=512, link=link, compute_scale=2))
    assert waited.step_ns == slowest.step_ns and waited.exposed_residual_ns == 600
    assert waited.exposed_ns == pytest.approx(slowest.exposed_ns + 600)
    assert waited.comm_busy_ns == pytest.approx(slowest.comm_busy_ns + 600)
    assert waited.overlap_efficiency == 0.0  # all of it exposed, residual included
    assert (
        two.overlap_efficiency
        > predict_step(
            cal,
            sizes,
            WhatIf(bucket_cap_mb=4000 / 2**20, link=link),
            Applied(exposed_residual_ns=300),
        ).overlap_efficiency
    )
    # a negative residual takes exposed time off, never below 0 (what is applied is said)
    less = predict_step(
        cal, sizes, WhatIf(bucket_cap_mb=512, link=link), Applied(exposed_residual_ns=-1000)
    )
    assert less.exposed_ns == pytest.approx(p.exposed_ns - 1000)
    floor = predict_step(
        cal, sizes, WhatIf(bucket_cap_mb=512, link=link), Applied(exposed_residual_ns=-1e9)
    )
    assert floor.exposed_ns == 0 and floor.exposed_residual_ns == -p.exposed_ns
    with pytest.raises(ValueError, match="exposed_residual_ns"):
        predict_step(
            cal, sizes, WhatIf(bucket_cap_mb=512, link=link), Applied(exposed_residual_ns=math.inf)
        )
    # the host residual (scaled with the compute, x 2) adds to the step alone, either sign
    for residual in (250.0, -250.0):
        moved = predict_step(
            cal,
            sizes,
            WhatIf(bucket_cap_mb=512, link=link, compute_scale=2),
            Applied(host_residual_ns=residual),
        )
        assert moved.step_ns == pytest.approx(slowest.step_ns + 2 * residual)
        assert moved.host_residual_ns == 2 * residual
        assert moved.exposed_ns == slowest.exposed_ns and moved.buckets == slowest.buckets
    with pytest.raises(ValueError, match="host_residual_ns"):
        predict_step(
            cal, sizes, WhatIf(bucket_cap_mb=512, link=link), Applied(host_residual_ns=math.nan)
        )


def _point(cap: float, step_ns: float, num_buckets: int) -> CapPrediction:
    sim = simulate_step(ready_work_ns=[], service_ns=[], num_bytes=[])
    return CapPrediction(
        bucket_cap_mb=cap, num_buckets=num_buckets, step_ns=step_ns, exposed_ns=0.0,
        overlap_efficiency=math.nan, step_ns_range=(step_ns, step_ns),
        exposed_ns_range=(0.0, 0.0), prediction=sim,
    )  # fmt: skip


def test_near_ties_go_to_fewer_buckets() -> None:
    # 4 MiB is the shortest, 25 MiB within TIE_TOLERANCE with fewer buckets: 25 MiB
    tied = 100.0 * (1 + TIE_TOLERANCE / 2)
    curve = [_point(1.0, 105.0, 9), _point(4.0, 100.0, 3), _point(25.0, tied, 1)]
    assert best_of(curve).bucket_cap_mb == 25.0
    # just beyond the tolerance the shortest wins
    curve[2] = _point(25.0, 100.0 * (1 + 2 * TIE_TOLERANCE), 1)
    assert best_of(curve).bucket_cap_mb == 4.0
    # equal buckets within the tolerance: the shorter step
    assert best_of([_point(8.0, tied, 3), _point(4.0, 100.0, 3)]).bucket_cap_mb == 4.0
    # the cap in use, where it ties, is kept: the model gives no reason to change it
    curve = [_point(1.0, 105.0, 9), _point(4.0, 100.0, 3), _point(25.0, tied, 1)]
    assert best_of(curve, in_use=curve[1]).bucket_cap_mb == 4.0
    curve[1] = _point(4.0, tied, 3)
    curve[2] = _point(25.0, 100.0, 1)
    assert best_of(curve, in_use=curve[1]).bucket_cap_mb == 4.0
    # ... not where it is past the tolerance
    assert best_of(curve, in_use=curve[0]).bucket_cap_mb == 25.0
    # the cap in use is weighed against the cap the rule would name, not the shortest: 25 MiB
    # is 1.5 % off the shortest (4 MiB) but within 1 % of 32 MiB, the tied cap of fewest buckets
    curve = [_point(4.0, 100.0, 7), _point(32.0, 100.9, 2), _point(25.0, 101.5, 2)]
    assert best_of(curve).bucket_cap_mb == 32.0
    assert best_of(curve, in_use=curve[2]).bucket_cap_mb == 25.0
    with pytest.raises(ValueError, match="at least one"):
        best_of([])


def test_recorded_parameter_sizes_match_the_catalog() -> None:
    """A model outside the catalog (commprof.attach) is re-bucketed from its recorded buckets;
    on a catalog model the recorded sizes equal the catalog's closed form."""
    from commprof import results
    from commprof.catalog import parameter_sizes
    from commprof.modeling.step.model import param_sizes_for

    tables = results.load(Path(__file__).parent / "data" / "results_smoke")
    cells = tables["cells"]
    for model in ("srn-100k", "srn-1m"):
        tables_as_user = {**tables, "cells": cells.assign(model=cells["model"].where(
            cells["model"] != model, "UserNet"))}  # fmt: skip
        recorded, catalog = param_sizes_for(tables_as_user, "UserNet"), parameter_sizes(model)
        assert sorted(recorded) == sorted(catalog)
        # the order is the gradient-ready order DDP rebuilt its buckets in: the modules come in
        # registration order, the parameters inside one module as autograd finished them
        modules = [name.rpartition(".")[0] for name, _ in recorded]
        assert modules == [name.rpartition(".")[0] for name, _ in catalog]
    with pytest.raises(ValueError, match="neither in the catalog"):
        param_sizes_for(tables, "NoSuchNet")
