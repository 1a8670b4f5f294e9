"""`commprof analyze` on the golden 2-rank gloo traces: invariants, regression, outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from commprof.traces.analyze import analyze_dir, run
from commprof.traces.metrics import bucket_exposure
from commprof.traces.report_text import step_json_rows
from commprof.traces.trace_parser import parse_trace

GOLDEN = Path(__file__).parent / "data" / "golden_gloo2"
NUM_BUCKETS = 3  # make_golden.py: 0.25 MiB cap over the MLP's four linear layers


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    return analyze_dir(GOLDEN)


def test_structural_invariants(tables: dict[str, pd.DataFrame]) -> None:
    steps = tables["steps"]
    assert sorted(set(zip(steps["rank"], steps["step"], strict=True))) == [
        (r, s) for r in (0, 1) for s in (2, 3, 4)
    ]
    ident = steps["compute_ns"] + steps["exposed_ns"] + steps["idle_ns"] + steps["other_ns"]
    assert (ident == steps["window_ns"]).all()
    assert (steps["comm_ns"] > 0).all()
    assert ((steps["overlap_ns"] >= 0) & (steps["overlap_ns"] <= steps["comm_ns"])).all()
    assert (steps["overlap_ns"] + steps["exposed_ns"] == steps["comm_ns"]).all()
    counts = tables["collectives"].groupby(["rank", "step"]).size()
    assert (counts == NUM_BUCKETS).all()
    ranks = tables["ranks"].set_index("rank")
    assert ranks.loc[0, "window_ns"] == steps[steps["rank"] == 0]["window_ns"].sum()


def test_metrics_equal_committed_expected(tables: dict[str, pd.DataFrame]) -> None:
    expected = json.loads((GOLDEN / "expected_metrics.json").read_text())
    assert step_json_rows(tables["steps"]) == expected


def test_transfer_wait_on_golden(tables: dict[str, pd.DataFrame]) -> None:
    tw = tables["transfer_wait"]
    assert len(tw) == 2 * 3 * NUM_BUCKETS
    assert (tw["wait_ns"] >= 0).all()
    # For every collective one rank waited nothing: its duration is the transfer.
    assert (tw.groupby(["step_key", "index"])["wait_ns"].min() == 0).all()
    assert set(tables["clock_offsets"]["rank"]) == {0, 1}


def test_hook_records_match_trace_collectives() -> None:
    for rank in (0, 1):
        parsed = parse_trace(GOLDEN / f"rank{rank}_steps2-4.json.gz")
        records = pd.DataFrame(json.loads((GOLDEN / f"hook_buckets_rank{rank}.json").read_text()))
        matched = bucket_exposure(parsed, records)
        assert len(matched) == 3 * NUM_BUCKETS
        assert matched["matched_by"].eq("size").all()
        assert (matched["comm_exposed_ns"] <= matched["comm_ns"]).all()
        assert matched[["latency_ns", "comm_ns"]].notna().all().all()
        # The hook's span (launch to callback) contains the gloo annotation.
        assert matched["latency_ns"].sum() >= matched["comm_ns"].sum()


def test_run_json_prints_only_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(GOLDEN, tmp_path / "out", True, None) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    records = doc["steps"]
    assert len(records) == 6
    assert set(records[0]) == {
        "rank", "step", "window_ns", "comm_ns", "compute_ns", "overlap_ns", "exposed_ns",
        "idle_ns", "other_ns", "overlap_efficiency", "comm_overhead_fraction",
    }  # fmt: skip
    for r in records:  # docs/design.md: compute + exposed + idle + other = |W|
        assert r["compute_ns"] + r["exposed_ns"] + r["idle_ns"] + r["other_ns"] == r["window_ns"]
    assert [r["window_source"] for r in doc["ranks"]] == ["ProfilerStep"] * 2
    assert [r["regime"] for r in doc["ranks"]] == ["cpu-gloo"] * 2
    assert [(t["rank"], t["world_size"]) for t in doc["traces"]] == [(0, 2), (1, 2)]
    cross = doc["cross_rank"]
    assert cross["num_collectives"] == 3 * NUM_BUCKETS and len(cross["clock_offsets"]) == 2
    assert {s["rank"] for s in cross["stragglers"]} == {0, 1}
    steps = pd.read_parquet(tmp_path / "out" / "steps.parquet")
    assert steps["window_ns"].tolist() == [r["window_ns"] for r in records]
    for name in ("ranks", "clock_offsets", "stragglers", "matched_collectives"):
        assert (tmp_path / "out" / f"{name}.parquet").exists()


def test_run_prints_tables_and_reports_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert run(GOLDEN, None, False, None) == 0
    assert "Per rank" in capsys.readouterr().out
    assert run(tmp_path, None, False, None) == 2
    assert "no trace files" in capsys.readouterr().err
    for name in ("rank0_steps2-4.json.gz", "rank0_steps2-4.json.gz"):
        shutil.copy(GOLDEN / name, tmp_path / name)
    shutil.copy(GOLDEN / "rank0_steps2-4.json.gz", tmp_path / "copy_rank0.json.gz")
    assert run(tmp_path, None, False, None) == 2
    assert "appears in two traces" in capsys.readouterr().err


def test_json_null_for_undefined_efficiency() -> None:
    steps = pd.DataFrame([{
        "rank": 0, "step": 1, "window_ns": 10, "comm_ns": 0, "compute_ns": 10, "overlap_ns": 0,
        "exposed_ns": 0, "idle_ns": 0, "other_ns": 0, "overlap_efficiency": float("nan"),
        "comm_overhead_fraction": 0.0,
    }])  # fmt: skip
    assert json.loads(json.dumps(step_json_rows(steps)))[0]["overlap_efficiency"] is None
