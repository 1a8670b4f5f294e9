"""All-reduce microbenchmark on 2 real gloo ranks."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commprof.training.microbench import (
    MicrobenchConfig,
    _count_wrong,
    _fill,
    geometric_sizes,
    run_allreduce_bench,
    with_bucket_sizes,
)

CONFIG = MicrobenchConfig(sizes_bytes=(1024, 4096, 65536, 1002), warmup_iters=1, timed_iters=3)


def _worker(rank: int, world_size: int, store_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store_path, world_size),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        records = run_allreduce_bench(CONFIG, rank=rank, world_size=world_size, device="cpu")
        torch.save(records, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_rank_records(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    r0 = torch.load(tmp_path / "rank0.pt")
    r1 = torch.load(tmp_path / "rank1.pt")
    assert r0 == r1  # identical on every rank
    # 1002 B rounds down to 250 float32 elements = 1000 B
    assert [r["num_bytes"] for r in r0] == [1024, 4096, 65536, 1000]
    for rec in r0:
        assert rec["num_wrong"] == 0 and rec["num_iters"] == 3 and rec["dtype"] == "float32"
        assert 0 < rec["time_min_ns"] <= rec["time_p50_ns"] <= rec["time_max_ns"]
        assert rec["algbw_gbps"] == pytest.approx(rec["num_bytes"] / rec["time_p50_ns"])
        assert rec["busbw_gbps"] == pytest.approx(rec["algbw_gbps"] * 2 * (2 - 1) / 2)


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


def test_config_and_sizes() -> None:
    assert geometric_sizes(1024, 8192) == (1024, 2048, 4096, 8192)
    assert with_bucket_sizes((1024,), [("a", 10), ("b", 20)], None) == (120, 1024)
    with pytest.raises(ValueError, match="timed_iters"):
        MicrobenchConfig(sizes_bytes=(8,), timed_iters=0)
    with pytest.raises(ValueError, match="dtype"):
        MicrobenchConfig(sizes_bytes=(8,), dtype="int8")
    with pytest.raises(RuntimeError, match="process group"):
        run_allreduce_bench(CONFIG, rank=0, world_size=1, device="cpu")
