"""All-reduce microbenchmark on 2 real gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from commprof.training.launcher import process_group, spawn_ranks
from commprof.training.microbench import (
    MicrobenchConfig,
    _count_wrong,
    _fill,
    geometric_sizes,
    run_allreduce_bench,
    size_record,
)

CONFIG = MicrobenchConfig(sizes_bytes=(1024, 4096, 65536, 1002), warmup_iters=1, timed_iters=3)


# Three shuffled passes; sizes above 2048 B run 1 warm-up and 2 timed iterations per pass.
PASSES_CONFIG = MicrobenchConfig(
    sizes_bytes=(32768, 1024, 8192, 2048),
    warmup_iters=1,
    timed_iters=4,
    passes=3,
    seed=7,
    large_above_bytes=2048,
    large_warmup_iters=1,
    large_timed_iters=2,
)


def _worker(
    rank: int, world_size: int, store_path: str, config: MicrobenchConfig = CONFIG
) -> list[dict[str, object]]:
    store = dist.FileStore(store_path, world_size)
    with process_group(backend="gloo", rank=rank, world_size=world_size, store=store):
        return run_allreduce_bench(config, rank=rank, world_size=world_size, device="cpu")


def test_two_rank_records() -> None:
    r0, r1 = spawn_ranks(_worker, 2)
    assert r0 == r1  # identical on every rank
    # 1002 B rounds down to 250 float32 elements = 1000 B
    assert [r["num_bytes"] for r in r0] == [1024, 4096, 65536, 1000]
    for rec in r0:
        assert rec["num_wrong"] == 0 and rec["num_iters"] == 3 and rec["dtype"] == "float32"
        assert 0 < rec["time_min_ns"] <= rec["time_p50_ns"] <= rec["time_max_ns"]
        assert rec["algbw_gbps"] == pytest.approx(rec["num_bytes"] / rec["time_p50_ns"])
        assert rec["busbw_gbps"] == pytest.approx(rec["algbw_gbps"] * 2 * (2 - 1) / 2)


@pytest.mark.slow
def test_passes_pool_iterations_and_large_sizes_run_fewer() -> None:
    r0, r1 = spawn_ranks(_worker, 2, args=(PASSES_CONFIG,))
    assert r0 == r1
    # records in the configured (unsorted) order, whatever order the passes visited them in
    assert [r["num_bytes"] for r in r0] == [32768, 1024, 8192, 2048]
    # iterations pooled over 3 passes: 3 * 4 up to 2048 B, 3 * 2 above
    assert [r["num_iters"] for r in r0] == [6, 12, 6, 12]
    assert all(r["num_wrong"] == 0 for r in r0)


def test_pass_orders_are_seeded_permutations() -> None:
    orders = [PASSES_CONFIG.pass_order(k) for k in range(PASSES_CONFIG.passes)]
    assert all(sorted(order) == [0, 1, 2, 3] for order in orders)
    assert len({tuple(order) for order in orders}) > 1  # shuffled differently per pass
    assert orders == [PASSES_CONFIG.pass_order(k) for k in range(PASSES_CONFIG.passes)]
    assert CONFIG.pass_order(0) == [0, 1, 2, 3]  # one pass keeps the given order
    assert PASSES_CONFIG.iters(2048) == (1, 4) and PASSES_CONFIG.iters(2052) == (1, 2)


@pytest.mark.parametrize("world_size", [3, 4])
def test_size_record_bus_bandwidth(world_size: int) -> None:
    # Rank r's iteration i takes 1000 (i + 1) + r ns: the iteration time is the max over
    # ranks, 1000 (i + 1) + (p - 1); p50 of three iterations is the middle one.
    per_rank_ns = [[1000 * (i + 1) + r for i in range(3)] for r in range(world_size)]
    rec = size_record(per_rank_ns, 0, num_bytes=8000, dtype="float32", world_size=world_size)
    p50_ns = 2000 + (world_size - 1)
    assert rec["time_p50_ns"] == p50_ns
    assert rec["time_min_ns"] == 1000 + (world_size - 1)
    assert rec["time_max_ns"] == 3000 + (world_size - 1)
    # transfer: the shortest rank per iteration (rank 0, 1000 (i + 1)); p50 is the middle one
    assert rec["transfer_p50_ns"] == 2000
    assert rec["num_iters"] == 3 and rec["num_wrong"] == 0
    assert rec["time_mean_ns"] == p50_ns  # 1000, 2000, 3000 (+ p - 1): mean = median
    # the last iteration stalled by 9000 ns: the median does not see it, the mean pays it
    stalled = [[*times[:2], times[2] + 9000] for times in per_rank_ns]
    rec_stalled = size_record(stalled, 0, num_bytes=8000, dtype="float32", world_size=world_size)
    assert rec_stalled["time_p50_ns"] == p50_ns
    assert rec_stalled["time_mean_ns"] == p50_ns + 3000
    algbw = 8000 / p50_ns  # bytes per ns = GB/s (decimal)
    assert rec["algbw_gbps"] == pytest.approx(algbw, rel=1e-12)
    # busbw = algbw * 2(p-1)/p: 4/3 at p = 3, 3/2 at p = 4 (1 at p = 2 hides a missing factor).
    assert rec["busbw_gbps"] == pytest.approx(algbw * 2 * (world_size - 1) / world_size, rel=1e-12)
    with pytest.raises(ValueError, match="ranks"):
        size_record(per_rank_ns[:-1], 0, num_bytes=8000, dtype="float32", world_size=world_size)


def test_wrong_elements_are_counted() -> None:
    buf = torch.empty(10)
    _fill(buf, rank=0)
    assert buf.tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    # A correct 3-rank sum is p(p+1)/2 = 6 times the pattern.
    buf.mul_(6)
    assert _count_wrong(buf, 3) == 0
    buf[3] += 1
    buf[7] = float("nan")
    assert _count_wrong(buf, 3) == 2


def test_guard_counts_the_trainers_warmup_iterations() -> None:
    from commprof.sweeps.guard import MICROBENCH_WARMUP_ITERS

    assert MicrobenchConfig(sizes_bytes=(8,)).warmup_iters == MICROBENCH_WARMUP_ITERS


def test_config_and_sizes() -> None:
    assert geometric_sizes(1024, 8192) == (1024, 2048, 4096, 8192)
    with pytest.raises(ValueError, match="timed_iters"):
        MicrobenchConfig(sizes_bytes=(8,), timed_iters=0)
    for bad in ({"passes": 0}, {"large_timed_iters": 0}, {"large_warmup_iters": -1}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be"):
            MicrobenchConfig(sizes_bytes=(8,), **bad)
    with pytest.raises(ValueError, match="dtype"):
        MicrobenchConfig(sizes_bytes=(8,), dtype="int8")
    with pytest.raises(RuntimeError, match="process group"):
        run_allreduce_bench(CONFIG, rank=0, world_size=1, device="cpu")
