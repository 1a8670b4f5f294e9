"""The timing hook's cost against plain DDP: the interleaved pairs (a real 2-rank gloo cell), the
order-statistics interval in closed form, the summary per configuration, and the memory guard's
term for the plain replica."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from commprof.analysis.hook_cost import hook_cost_summary, median_interval, paired_steps
from commprof.matrix import Cell, MatrixError, config_hash
from commprof.modeling.memory import OPTIMIZER_STATE_COPIES, CellShape, evaluate, model_footprint
from commprof.outcomes import merge_rank_records
from commprof.sweeps.guard import HOOK_COST_WARMUP_PAIRS, estimate_cell_s
from commprof.training.hook_cost import ARMS, WARMUP_PAIRS, interleaved_pairs
from commprof.training.launcher import run_local
from tests.hang import GUARD_S

PAIRS = 6
CELL = Cell(
    model="srn-100k",
    world_size=2,
    bucket_cap_mb=0.1,  # three buckets after DDP's rebuild
    steps=5,
    warmup_steps=2,
    batch_size=4,
    microbench_sizes_bytes=(4096,),
    microbench_iters=2,
    interference_iters=0,
    hook_cost_pairs=PAIRS,
)


@pytest.fixture(scope="module")
def per_rank() -> list[dict[str, Any]]:
    return run_local(
        CELL, timeout_s=180, limit_s=GUARD_S
    )  # generous: the test machine is heavily shared


@pytest.mark.slow
def test_pairs_run_after_the_measured_steps_and_leave_them_alone(
    per_rank: list[dict[str, Any]],
) -> None:
    merged = merge_rank_records(per_rank)
    # the measured steps' rows are the cell's own steps only: no pair leaked into them
    assert sorted({r["step"] for r in merged["steps"]}) == list(range(CELL.steps))
    assert {r["step"] for r in merged["buckets"]} == set(range(CELL.steps))
    assert len(merged["steps"]) == CELL.world_size * CELL.steps
    rows = pd.DataFrame(merged["hook_cost"])
    assert len(rows) == CELL.world_size * PAIRS * len(ARMS)
    for (_rank, _pair), part in rows.groupby(["rank", "pair"]):
        assert sorted(part["arm"]) == sorted(ARMS) and sorted(part["position"]) == [0, 1]
    assert sorted(rows["pair"].unique()) == list(range(PAIRS))  # the warm-up pairs are not kept
    # every rank stepped the same model at the same place of a pair (one seeded order)
    order = rows.pivot_table(
        index=["pair", "position"], columns="rank", values="arm", aggfunc="first"
    )
    assert (order[0] == order[1]).all()
    assert (rows["step_ns"] > 0).all() and (rows["backward_ns"] > 0).all()
    assert (rows["backward_ns"] < rows["step_ns"]).all()
    # the cost per configuration comes out of the rows (an interval: 6 pairs are enough)
    rows = rows.assign(cell_id=CELL.cell_id, attempt=1)
    summary = hook_cost_summary(
        rows, pd.DataFrame({"cell_id": [CELL.cell_id], "attempt": [1], "config_key": ["k"]})
    )
    assert summary["num_pairs"].tolist() == [PAIRS]
    r = summary.iloc[0]
    assert r["cost_low_ns"] <= r["cost_ns"] <= r["cost_high_ns"]


@pytest.mark.slow
def test_bucket_params_name_each_module_and_its_class(per_rank: list[dict[str, Any]]) -> None:
    params = pd.DataFrame(per_rank[0]["records"]["bucket_params"])
    types = dict(zip(params["module"], params["module_type"], strict=True))
    assert types["head"] == "Linear" and types["norm"] == "LayerNorm"
    assert types["blocks.0.fc1"] == "Linear"


def test_interleaved_pairs_keep_a_seeded_order_and_drop_the_warm_up() -> None:
    calls: list[tuple[str, int]] = []

    def step(arm: str, index: int) -> tuple[int, int, int, int]:
        calls.append((arm, index))
        base = 1000 * len(calls)
        return base, base + 10, base + 30, base + 40 + (5 if arm == "hooked" else 0)

    barriers: list[int] = []
    rows = interleaved_pairs(step, pairs=4, seed=3, rank=1, barrier=lambda: barriers.append(1))
    assert len(calls) == len(barriers) == 2 * (WARMUP_PAIRS + 4)  # a barrier before every step
    assert [index for _, index in calls[::2]] == list(range(WARMUP_PAIRS + 4))
    assert len(rows) == 8 and {r["pair"] for r in rows} == {0, 1, 2, 3}
    assert all(r["rank"] == 1 and r["backward_ns"] == 20 for r in rows)
    assert {r["step_ns"] for r in rows if r["arm"] == "hooked"} == {45}
    assert {r["step_ns"] for r in rows if r["arm"] == "plain"} == {40}
    # the same seed gives the same order (every rank); another seed another
    again: list[tuple[str, int]] = []
    interleaved_pairs(
        lambda a, i: (again.append((a, i)), (0, 0, 0, 1))[1], pairs=4, seed=3, rank=0,
        barrier=lambda: None,
    )  # fmt: skip
    assert again == calls
    firsts = {r["pair"]: r["arm"] for r in rows if r["position"] == 0}
    assert set(firsts.values()) == set(ARMS)  # not a fixed alternation: both arms go first
    with pytest.raises(ValueError, match="pairs must be >= 1"):
        interleaved_pairs(step, pairs=0, seed=0, rank=0, barrier=lambda: None)


def test_median_interval_in_closed_form() -> None:
    # P(B <= k - 1) for B ~ Binomial(n, 1/2) must stay <= 2.5 %: the largest such k
    assert median_interval(5) is None  # even [x_(1), x_(5)] covers 1 - 2/32 = 93.75 %
    k, coverage = median_interval(6)  # type: ignore[misc]
    assert k == 1 and coverage == pytest.approx(1 - 2 / 64)
    k, coverage = median_interval(12)  # type: ignore[misc]
    tail = sum(math.comb(12, i) for i in range(3)) / 2**12  # P(B <= 2) = 0.0193
    assert k == 3 and coverage == pytest.approx(1 - 2 * tail)
    k, coverage = median_interval(30)  # type: ignore[misc]
    tail = sum(math.comb(30, i) for i in range(10)) / 2**30  # P(B <= 9) = 0.0214
    assert k == 10 and coverage == pytest.approx(1 - 2 * tail) and coverage >= 0.95
    assert sum(math.comb(30, i) for i in range(11)) / 2**30 > 0.025  # k = 11 would be too wide


def _rows(cell: str, diffs: list[int], slow_rank_extra: int = 0) -> pd.DataFrame:
    """Two ranks, plain steps of 1000 ns; rank 1 slower by ``slow_rank_extra`` in both arms."""
    out = []
    for pair, d in enumerate(diffs):
        for rank in (0, 1):
            extra = slow_rank_extra * rank
            out.append((cell, 1, rank, pair, "plain", 1000 + extra))
            out.append((cell, 1, rank, pair, "hooked", 1000 + d + extra))
    columns = ["cell_id", "attempt", "rank", "pair", "arm", "step_ns"]
    return pd.DataFrame(out, columns=columns)


def test_summary_takes_the_slowest_rank_and_pools_repeats() -> None:
    # 12 pairs of differences 1..12 ns: median 6.5, interval [d_(3), d_(10)] = [3, 10]
    rows = _rows("a", list(range(1, 13)), slow_rank_extra=7)
    pairs = paired_steps(rows)
    assert (pairs["plain_ns"] == 1007).all() and pairs["diff_ns"].tolist() == list(range(1, 13))
    config = pd.DataFrame({"cell_id": ["a"], "attempt": [1], "config_key": ["k"]})
    (r,) = hook_cost_summary(rows, config).itertuples(index=False)
    assert (r.num_pairs, r.cost_ns, r.cost_low_ns, r.cost_high_ns) == (12, 6.5, 3.0, 10.0)
    assert r.resolved and r.cost_fraction == pytest.approx(6.5 / 1007)
    # a repeat's pairs pool with the first's: 12 + 12 pairs, some below zero
    rows = pd.concat([rows, _rows("b", [-30] * 12)])
    config = pd.DataFrame({"cell_id": ["a", "b"], "attempt": [1, 1], "config_key": ["k", "k"]})
    (r,) = hook_cost_summary(rows, config).itertuples(index=False)
    k, _ = median_interval(24)  # type: ignore[misc]
    diffs = sorted([*range(1, 13), *[-30] * 12])
    assert (r.num_cells, r.num_pairs, r.cost_ns) == (2, 24, (diffs[11] + diffs[12]) / 2)
    assert (r.cost_low_ns, r.cost_high_ns) == (diffs[k - 1], diffs[24 - k])
    assert not r.resolved  # the interval crosses zero: the cost is not resolved
    # too few pairs: no interval, not resolved
    few = hook_cost_summary(_rows("a", [5, 6, 7]), config.iloc[:1])
    assert math.isnan(few["cost_low_ns"].iloc[0]) and not few["resolved"].iloc[0]
    # cells not in the frame given (failed ones) are left out; no rows, no summary
    assert hook_cost_summary(rows, config.iloc[0:0]).empty
    assert hook_cost_summary(rows.iloc[0:0], config).empty


def test_the_guard_costs_the_plain_replica_and_the_estimate_its_steps() -> None:
    fp = model_footprint("srn-1m")
    plain = dict(
        model="srn-1m", world_size=2, ranks_per_node=2, backend="gloo", device="cpu",
        batch_size=16, bucket_cap_mb=25.0,
    )  # fmt: skip
    base = evaluate(CellShape(**plain), _budgets(), fp)  # type: ignore[arg-type]
    with_ab = evaluate(CellShape(**plain, hook_cost_pairs=30), _budgets(), fp)  # type: ignore[arg-type]
    host = {p.pool: p for p in with_ab.pools}["host"]
    k = OPTIMIZER_STATE_COPIES["sgd"]
    replica = 2 * (3 + k) * fp.num_parameters * 4  # params, grads, state, buckets; 2 ranks
    added = host.need_bytes - {p.pool: p for p in base.pools}["host"].need_bytes
    assert added == replica
    assert any("plain replica" in label for label, _ in host.terms)
    assert HOOK_COST_WARMUP_PAIRS == WARMUP_PAIRS  # the duration estimate counts them too
    cell = Cell(model="srn-1m", world_size=2, bucket_cap_mb=25.0)
    longer = Cell(model="srn-1m", world_size=2, bucket_cap_mb=25.0, hook_cost_pairs=30)
    step_s = (estimate_cell_s(longer, 10**6) - estimate_cell_s(cell, 10**6)) / (2 * (30 + 2))
    assert step_s > 0
    # the field joins the id only where it is set: cells from before it keep their ids
    without = {k: v for k, v in cell.config().items() if k != "hook_cost_pairs"}
    assert config_hash(without) == cell.cell_id
    assert longer.cell_id != cell.cell_id
    with pytest.raises(MatrixError, match="hook_cost_pairs must be >= 0"):
        Cell(model="srn-1m", world_size=2, bucket_cap_mb=25.0, hook_cost_pairs=-1)


def _budgets() -> Any:
    from commprof.modeling.memory import Budgets

    gib = 2**30
    return Budgets(
        device_bytes=0,
        host_ram_bytes=64 * gib,
        pinned_bytes=8 * gib,
        shm_bytes=8 * gib,
        object_store_bytes=8 * gib,
    )
