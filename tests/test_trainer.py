"""train_rank through run_local: one real 2-rank gloo cell on srn-100k, records checked by shape.

One module-scoped run (process start and ``import torch`` dominate its cost) feeds every test.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from commprof.matrix import Cell
from commprof.outcomes import merge_rank_records
from commprof.training.launcher import run_local
from commprof.training.models import build_model, count_parameters

pytestmark = pytest.mark.slow  # a real 2-rank run (process start and torch import: seconds)

MODEL_BYTES = count_parameters("srn-100k") * 4  # float32
NUM_PARAMS = len(list(build_model("srn-100k").parameters()))  # 18 tensors
CELL = Cell(
    model="srn-100k",
    world_size=2,
    bucket_cap_mb=0.1,  # three buckets after DDP's rebuild (0.38 MiB model)
    steps=5,
    warmup_steps=2,
    batch_size=4,
    microbench_sizes_bytes=(4096, 65536),
    microbench_iters=2,
    microbench_passes=2,
)


@pytest.fixture(scope="module")
def per_rank() -> list[dict[str, Any]]:
    return run_local(CELL, timeout_s=120)  # generous: the test machine is heavily shared


def test_steps_rows_and_measured_flags(per_rank: list[dict[str, Any]]) -> None:
    assert len(per_rank) == CELL.world_size
    merged = merge_rank_records(per_rank)
    assert len(merged["steps"]) == CELL.world_size * CELL.steps
    for rank, result in enumerate(per_rank):
        steps = result["records"]["steps"]
        assert [s["rank"] for s in steps] == [rank] * CELL.steps
        assert [s["step"] for s in steps] == list(range(CELL.steps))
        # Step 0 and the warm-up steps are excluded: measured from step max(1, warmup_steps).
        assert [s["measured"] for s in steps] == [False, False, True, True, True]
        for s in steps:
            assert s["step_ns"] == s["forward_ns"] + s["backward_ns"] + s["optimizer_ns"]
            assert min(s["forward_ns"], s["backward_ns"], s["optimizer_ns"]) > 0


def test_bucket_rows(per_rank: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(per_rank):
        rows = result["records"]["buckets"]
        assert {r["rank"] for r in rows} == {rank}
        step0 = [r for r in rows if r["step"] == 0]
        assert [r["num_bytes"] for r in step0] == [MODEL_BYTES]  # one bucket before the rebuild
        for step in range(1, CELL.steps):
            in_step = [r for r in rows if r["step"] == step]
            assert [r["bucket_index"] for r in in_step] == [0, 1, 2]
            assert sum(r["num_bytes"] for r in in_step) == MODEL_BYTES
            assert sum(r["num_params"] for r in in_step) == NUM_PARAMS
        assert len(rows) == 1 + 3 * (CELL.steps - 1)
        assert all(0 <= r["exposed_ns"] <= r["latency_ns"] for r in rows)


def test_bucket_params_only_from_rank0(per_rank: list[dict[str, Any]]) -> None:
    assert "bucket_params" not in per_rank[1]["records"]
    params = per_rank[0]["records"]["bucket_params"]
    names = [n for n, _ in build_model("srn-100k").named_parameters()]
    assert sorted(p["param_name"] for p in params) == sorted(names)
    assert sum(p["num_bytes"] for p in params) == MODEL_BYTES
    # Each bucket's parameters add up to that bucket's size on the measured steps.
    bucket_bytes = {
        r["bucket_index"]: r["num_bytes"]
        for r in per_rank[0]["records"]["buckets"]
        if r["step"] == CELL.steps - 1
    }
    for index, num_bytes in bucket_bytes.items():
        assert sum(p["num_bytes"] for p in params if p["bucket_index"] == index) == num_bytes


def test_microbench_rows(per_rank: list[dict[str, Any]]) -> None:
    assert per_rank[1]["records"]["microbench"] == []
    rows = per_rank[0]["records"]["microbench"]
    bucket_sizes = sorted(
        {r["num_bytes"] for r in per_rank[0]["records"]["buckets"] if r["step"] >= 1}
    )
    assert [r["num_bytes"] for r in rows if r["source"] == "sizes"] == [4096, 65536]
    assert [r["num_bytes"] for r in rows if r["source"] == "bucket"] == bucket_sizes
    for r in rows:
        assert r["num_wrong"] == 0
        assert r["num_iters"] == CELL.microbench_iters * CELL.microbench_passes  # pooled
        assert 0 < r["time_min_ns"] <= r["time_p50_ns"] <= r["time_max_ns"]
        # nccl-tests: busbw = algbw * 2(p-1)/p, which is algbw itself for p = 2.
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])


def test_environment_fingerprint(per_rank: list[dict[str, Any]]) -> None:
    for result in per_rank:
        env = result["env"]
        assert env["torch"] == torch.__version__
        assert env["gloo"] is True
        assert env["num_threads"] == 1
