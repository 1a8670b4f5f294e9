"""Tests of commprof.analysis: breakdown formulas in closed form, and the committed dataset."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commprof.analysis.breakdown import step_breakdown, union_length
from commprof.analysis.dataset import Processed, load_processed
from commprof.analysis.modelled import bucket_table, calibrate, cell_model
from commprof.analysis.per_cell import cell_status, config_key
from commprof.analysis.repeatability import repeatability
from commprof.modeling.collective.ring_fit import CalibrationWarning, Fit, RingFit, fit_alpha_beta
from commprof.results import load

DATA = Path(__file__).parent / "data" / "results_smoke"


@pytest.fixture(scope="module")
def processed() -> Processed:
    return load_processed(DATA)


def test_union_length_merges_overlaps_and_keeps_gaps() -> None:
    frame = pd.DataFrame(
        {
            "g": [1, 1, 1, 2, 2],
            "s": [0, 5, 2, 0, 10],
            "e": [3, 8, 4, 1, 10],  # group 1: [0,3) u [2,4) u [5,8) = 4 + 3; group 2: 1 + empty
        }
    )
    out = union_length(frame, ["g"], "s", "e")
    assert out.to_dict() == {1: (4 - 0) + (8 - 5), 2: 1 - 0}


def test_union_length_exact_above_2_pow_53() -> None:
    # Clock readings past 2**53 ns: float64 holds only even integers there, so an
    # interval [t0 + 1, t0 + 2) after [t0, t0 + 1) would read 0 or 2 ns instead of 1.
    t0 = 2**53 + 1
    frame = pd.DataFrame({"g": [1, 1, 1], "s": [t0, t0 + 1, t0 + 4], "e": [t0 + 1, t0 + 2, t0 + 5]})
    out = union_length(frame, ["g"], "s", "e")
    assert out.dtype == np.int64
    assert out.to_dict() == {1: 1 + 1 + 1}


def _one_step(buckets: list[tuple[int, int, int]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    key = {"cell_id": "c", "attempt": 1, "rank": 0, "step": 3}
    steps = pd.DataFrame(
        [
            {
                **key,
                "measured": True,
                "step_ns": 1000,
                "forward_ns": 200,
                "backward_ns": 700,
                "optimizer_ns": 90,
            },
            {
                **key,
                "step": 0,
                "measured": False,
                "step_ns": 5,
                "forward_ns": 1,
                "backward_ns": 1,
                "optimizer_ns": 1,
            },
        ]
    )
    rows = [
        {**key, "bucket_index": i, "ready_ns": r, "launch_ns": la, "done_ns": d}
        for i, (r, la, d) in enumerate(buckets)
    ]
    return steps, pd.DataFrame(rows)


def test_breakdown_closed_form() -> None:
    # ready, launch, done: the last bucket becomes ready at 600 (end of compute)
    steps, buckets = _one_step([(100, 110, 400), (300, 310, 650), (600, 605, 800)])
    row = step_breakdown(steps, buckets).iloc[0]
    comm = 800 - 100  # [ready, done): [100,400) u [300,650) u [600,800) = [100,800)
    exposed = 800 - 600  # [max(ready, 600), done): [600,650) u [600,800) = [600,800)
    assert row["comm_ns"] == comm
    assert row["exposed_ns"] == exposed
    assert row["overlap_ns"] == comm - exposed
    assert row["overlap_efficiency"] == pytest.approx((comm - exposed) / comm)
    assert row["compute_ns"] == 200 + 700 - exposed
    assert row["other_ns"] == 1000 - 200 - 700 - 90
    assert row["comm_overhead_fraction"] == pytest.approx(exposed / 1000)
    assert row["compute_ns"] + row["exposed_ns"] + row["optimizer_ns"] + row["other_ns"] == 1000
    assert len(step_breakdown(steps, buckets)) == 1  # the unmeasured step is dropped


def test_breakdown_on_cuda_uses_the_device_timed_columns() -> None:
    # NCCL: host done_ns marks the enqueue (here 1 ns after ready), the device times hold the
    # transfer: service times 100 and 150 ns, of which 0 and 120 ns were exposed.
    steps, buckets = _one_step([(100, 101, 101), (600, 601, 601)])
    buckets["device_latency_ns"] = [100, 150]
    buckets["transfer_ns"] = [100, 150]
    buckets["exposed_ns"] = [0, 120]
    row = step_breakdown(steps, buckets).iloc[0]
    assert row["comm_ns"] == 100 + 150
    assert row["exposed_ns"] == 0 + 120
    assert row["compute_ns"] + row["exposed_ns"] + row["optimizer_ns"] + row["other_ns"] == 1000


def test_breakdown_without_communication_has_undefined_overlap() -> None:
    steps, buckets = _one_step([])
    buckets = pd.DataFrame(
        columns=["cell_id", "attempt", "rank", "step", "ready_ns", "launch_ns", "done_ns"]
    )
    row = step_breakdown(steps, buckets.astype({"attempt": int, "rank": int, "step": int})).iloc[0]
    assert row["comm_ns"] == 0 and row["exposed_ns"] == 0
    assert np.isnan(row["overlap_efficiency"])  # undefined, not 0 (docs/design.md, Definitions)


def test_repeatability_cv_and_ratio_closed_form() -> None:
    summary = pd.DataFrame(
        {
            "config_key": ["k", "k", "k", "solo"],
            "model": ["m"] * 4,
            "world_size": [2] * 4,
            "bucket_cap_mb": [1.0] * 4,
            "step_ns_median": [10.0, 20.0, 30.0, 5.0],
        }
    )
    out = repeatability(summary)
    assert list(out["config_key"]) == ["k"]  # one repeat is no repeatability
    row = out.iloc[0]
    assert row["cv"] == pytest.approx(10.0 / 20.0)  # s = 10 (ddof=1), mean = 20
    assert row["max_min_ratio"] == pytest.approx(30.0 / 10.0)


def test_config_key_ignores_repeat_only() -> None:
    a = json.dumps({"model": "m", "repeat": 0, "world_size": 2})
    b = json.dumps({"model": "m", "repeat": 3, "world_size": 2})
    c = json.dumps({"model": "m", "repeat": 0, "world_size": 4})
    assert config_key(a) == config_key(b) != config_key(c)


def test_every_cell_stays_visible_with_why(processed: Processed) -> None:
    cells = load(DATA)["cells"]
    status = processed.status
    assert set(status["cell_id"]) == set(cells["cell_id"])
    assert len(status) == cells["cell_id"].nunique()
    rejected = status[status["status"] == "rejected"]
    failed = status[status["status"] == "failed"]
    assert len(rejected) >= 1 and len(failed) >= 1
    assert rejected["reason"].str.contains("budget").all()  # the guard's arithmetic
    assert rejected["reason_short"].str.contains("> budget").all()
    assert failed["reason"].str.contains("injected fault").all()
    retried = status[(status["status"] == "ok") & (status["num_attempts"] > 1)]
    assert len(retried) >= 1 and retried["reason"].str.contains("attempt 1 failed").all()


def test_cell_summary_matches_raw_steps(processed: Processed) -> None:
    tables = load(DATA)
    steps = tables["steps"]
    for row in processed.summary.itertuples():
        mine = steps[(steps["cell_id"] == row.cell_id) & (steps["attempt"] == row.attempt)]
        mine = mine[mine["measured"]]
        assert row.num_samples == len(mine)
        assert row.step_ns_median == pytest.approx(float(mine["step_ns"].median()))


def test_merged_pools_repeats(processed: Processed) -> None:
    merged = processed.merged
    repeated = merged[merged["num_repeats"] > 1]
    assert len(repeated) >= 1
    for row in repeated.itertuples():
        members = processed.summary[processed.summary["config_key"] == row.config_key]
        assert row.num_samples == members["num_samples"].sum()
    rep = processed.repeatability
    assert set(rep["config_key"]) == set(repeated["config_key"])
    assert (rep["max_min_ratio"].dropna() >= 1.0).all()


def test_modelled_columns_and_error(processed: Processed) -> None:
    status = processed.status
    assert status["allreduce_sum_modelled_ns"].notna().all()  # rejected cells modelled too
    ok = processed.summary
    expected = 100 * (ok["allreduce_sum_modelled_ns"] - ok["allreduce_sum_measured_ns"])
    expected = expected / ok["allreduce_sum_measured_ns"]
    assert np.allclose(ok["allreduce_error_pct"], expected)
    fit = processed.fits[("gloo", "cpu-gloo", 2)]
    b = processed.buckets.iloc[0]
    assert b["modelled_ns"] == pytest.approx(float(fit.predict_ns(b["num_bytes"], b["world_size"])))


def test_model_compared_with_service_time_not_latency(processed: Processed) -> None:
    b = processed.buckets.dropna(subset=["modelled_ns"])
    expected = 100 * (b["modelled_ns"] - b["transfer_ns"]) / b["transfer_ns"]
    assert np.allclose(b["error_pct"], expected)
    per_cell = b.groupby("cell_id")["transfer_ns"].sum()
    summary = processed.summary.set_index("cell_id")
    assert np.allclose(summary.loc[per_cell.index, "allreduce_sum_measured_ns"], per_cell)


def test_queued_bucket_is_not_counted_twice() -> None:
    # Bucket 0 runs [0, 10); bucket 1 is ready at 2 but waits for it and is done at 20:
    # latency 18, own service time 20 - 10 = 10.
    sizes = np.array([1e3, 1e4, 1e5])
    # alpha 2.5 ns, beta 0.005 ns/B: T(1000, 2) = 2 (2 - 1) 2.5 + 2 (1 / 2) 1000 0.005 = 10.
    fit = fit_alpha_beta(sizes, 2 * (2 - 1) * 2.5 + 2 * (1 / 2) * sizes * 0.005, 2)
    fits: dict[tuple[str, str, int], Fit] = {("gloo", "cpu-gloo", 2): fit}
    key = {"cell_id": "c", "attempt": 0, "rank": 0, "step": 2, "num_bytes": 1000}
    measured = pd.DataFrame(
        [
            {**key, "bucket_index": 0, "ready_ns": 0, "done_ns": 10, "latency_ns": 10},
            {**key, "bucket_index": 1, "ready_ns": 2, "done_ns": 20, "latency_ns": 18},
        ]
    ).assign(transfer_ns=[10, 20 - 10], exposed_ns=0)  # as the hook records them
    summary = pd.DataFrame(
        {"cell_id": ["c"], "attempt": [0], "backend": ["gloo"], "regime": ["cpu-gloo"]}
    ).assign(world_size=2, model="m", bucket_cap_mb=1.0)
    buckets = bucket_table(summary, measured, fits)
    assert buckets["transfer_ns"].tolist() == [10, 20 - 10]
    assert buckets["error_pct"].tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    per_cell = cell_model(summary.assign(status="ok"), buckets, fits)
    # Sum of service times, 10 + 10; a sum of latencies would read 10 + 18.
    assert per_cell["allreduce_sum_measured_ns"].tolist() == [10 + 10]
    assert per_cell["allreduce_error_pct"].tolist() == pytest.approx([0.0], abs=1e-6)


def test_calibrate_drops_wrong_microbench_rows() -> None:
    status = pd.DataFrame(
        {"cell_id": ["c"], "attempt": [0], "status": ["ok"], "backend": ["gloo"]}
    ).assign(regime="cpu-gloo", world_size=2)
    sizes = np.array([1e3, 1e4, 1e5, 1e6])
    alpha_ns, beta = 1e4, 1.0
    micro = pd.DataFrame(
        {
            "cell_id": "c",
            "attempt": 0,
            "num_bytes": sizes,
            "time_p50_ns": 2 * (2 - 1) * alpha_ns + 2 * (2 - 1) / 2 * sizes * beta,
            "num_wrong": 0,
        }
    )
    wrong = micro.iloc[[1]].assign(time_p50_ns=1.0, num_wrong=3)  # a wrong, absurd point
    with pytest.warns(CalibrationWarning, match="num_wrong"):
        fits, notes = calibrate(status, pd.concat([micro, wrong], ignore_index=True))
    assert any("1 microbenchmark rows with num_wrong > 0" in n for n in notes)
    fit = fits[("gloo", "cpu-gloo", 2)]
    assert isinstance(fit, RingFit)
    assert fit.alpha_ns == pytest.approx(alpha_ns, rel=1e-9)
    assert fit.beta_ns_per_byte == pytest.approx(beta, rel=1e-9)


def test_attribution_conserves_bucket_time(processed: Processed) -> None:
    # service time, shared by bytes: a cell's modules add up to its all-reduce time per step
    attr = processed.attribution.groupby("cell_id")["transfer_ns"].sum()
    per_cell = processed.summary.set_index("cell_id")["allreduce_sum_measured_ns"]
    assert np.allclose(attr.sort_index(), per_cell.loc[attr.index].sort_index())


def test_cell_status_of_empty_table() -> None:
    assert cell_status(load(DATA)["cells"].iloc[0:0]).empty


def test_analysis_imports_no_torch_or_ray() -> None:
    import subprocess

    code = (
        "import sys, commprof.analysis.dataset, commprof.reporting.build; "
        "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent.parent,
    )
    assert out.stdout.strip() == "[]"
