"""Interference arms of the microbenchmark on 2 real gloo ranks."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from commprof.training.interference import ARMS, interference_record, run_interference_bench
from commprof.training.launcher import process_group, spawn_ranks

SIZES = (4096, 65536)
ITERS = 2


def _worker(rank: int, world_size: int, store_path: str) -> list[dict[str, object]]:
    store = dist.FileStore(store_path, world_size)
    with process_group(backend="gloo", rank=rank, world_size=world_size, store=store):
        return run_interference_bench(SIZES, iters=ITERS, device="cpu")


@pytest.mark.slow
def test_two_rank_arms() -> None:
    r0, r1 = spawn_ranks(_worker, 2)
    assert [(r["arm"], r["num_bytes"]) for r in r0] == [(a, n) for n in SIZES for a in ARMS]
    for rank_rows in (r0, r1):
        comm = [r for r in rank_rows if r["arm"] != ARMS[1]]
        # the comm arms' times are the max over ranks per iteration: the same on both ranks
        assert comm == [r for r in (r1 if rank_rows is r0 else r0) if r["arm"] != ARMS[1]]
    for r in r0:
        assert r["num_iters_alone"] == ITERS and r["num_iters_loaded"] >= 1
        if r["arm"] != ARMS[1]:  # one loaded iteration per alone one, the ratios' median
            assert r["num_iters_loaded"] == ITERS
        else:
            ratio = r["time_loaded_p50_ns"] / r["time_alone_p50_ns"]
            assert r["slowdown"] == pytest.approx(ratio, rel=1e-3)
        assert r["slowdown_q25"] <= r["slowdown"] <= r["slowdown_q75"]
        assert r["time_alone_p50_ns"] > 0 and r["time_loaded_p50_ns"] > 0


def test_record_in_closed_form() -> None:
    row = interference_record([10, 20, 30], [40, 60, 80, 100, 120], arm=ARMS[1], num_bytes=8)
    assert row["time_alone_p50_ns"] == 20 and row["time_loaded_p50_ns"] == 80
    assert row["slowdown"] == 80 / 20
    assert (row["slowdown_q25"], row["slowdown_q75"]) == (60 / 20, 100 / 20)
    assert row["slowdown_mean"] == 80 / 20
    # the comm arm in pairs: ratios 2, 3, 4 (a drift doubled the second pair's both times)
    row = interference_record([10, 20, 10], [20, 60, 40], arm=ARMS[0], num_bytes=8)
    assert row["slowdown"] == 3.0 and (row["slowdown_q25"], row["slowdown_q75"]) == (2.5, 3.5)
    assert row["slowdown_mean"] == 120 / 40
    # one stalled pair of five: the median ratio stays 1, the mean counts the stall
    row = interference_record([10] * 5, [10, 10, 10, 10, 210], arm=ARMS[0], num_bytes=8)
    assert row["slowdown"] == 1.0 and row["slowdown_mean"] == 250 / 50
    with pytest.raises(ValueError, match="pairs"):
        interference_record([10, 20], [20], arm=ARMS[0], num_bytes=8)
    with pytest.raises(ValueError, match="arm"):
        interference_record([1], [1], arm="x", num_bytes=8)
