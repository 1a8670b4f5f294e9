"""DDP trainer: one rank's part of a cell, with the timing hook, inside a process group.

The caller owns the process group (``launcher.process_group``); :func:`train_rank` builds the
model, wraps it in DDP with the cell's bucket cap and the timing hook, runs warm-up and measured
steps on synthetic data, then the all-reduce microbenchmark, and returns plain records (lists of
dicts) that the dataset tables take as they are.

Step timing: host ``perf_counter_ns`` around forward, backward and the optimizer step. On CUDA
each phase ends at a marked sync point so that host time covers the device work; the sync sits
between phases, never inside a hook, and backward's collectives have completed by then anyway
(DDP waits for them before ``backward()`` returns).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commprof.matrix import Cell
from commprof.profiling.comm_hooks import register_timing_hook
from commprof.training.data import loss_fn, make_batch
from commprof.training.models import build_model

# Step 0 runs with one bucket holding the whole model, before DDP rebuilds its buckets, and pays
# one-time costs (allocator, lazy init); it is never measured, whatever warmup_steps says.
ALWAYS_EXCLUDED_STEPS = 1
SGD_LR = 0.01
SGD_MOMENTUM = 0.9
ADAM_LR = 1e-4


def _optimizer(cell: Cell, params: Any) -> torch.optim.Optimizer:
    if cell.optimizer == "adam":
        return torch.optim.Adam(params, lr=ADAM_LR)
    return torch.optim.SGD(params, lr=SGD_LR, momentum=SGD_MOMENTUM)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: phase boundary, outside every hook


def train_rank(cell: Cell, *, rank: int, device: torch.device) -> dict[str, list[dict[str, Any]]]:
    """Train one rank of ``cell`` in the current process group and return its records.

    Args:
        cell: the configuration.
        rank: this process's rank (equal to ``dist.get_rank()``).
        device: where the model and batches live.

    Returns:
        Rows by table: ``steps`` and ``buckets`` from every rank; ``bucket_params`` and
        ``microbench`` from rank 0 only (they are the same on every rank).
    """
    if not dist.is_initialized():
        raise RuntimeError("train_rank needs an initialised process group")
    torch.manual_seed(cell.seed)  # same initial weights everywhere (DDP also broadcasts them)
    model = build_model(cell.model).to(device)
    ddp = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=cell.bucket_cap_mb,
    )
    state = register_timing_hook(ddp, inner=cell.hook)
    optimizer = _optimizer(cell, ddp.parameters())
    criterion = loss_fn(cell.model)
    first_measured = max(ALWAYS_EXCLUDED_STEPS, cell.warmup_steps)

    steps: list[dict[str, Any]] = []
    buckets: list[dict[str, Any]] = []
    for step in range(cell.steps):
        inputs, targets = make_batch(
            cell.model, cell.batch_size, rank=rank, seed=cell.seed, step=step, device=device
        )
        state.step = step
        t0 = time.perf_counter_ns()
        loss = criterion(ddp(inputs), targets)
        _sync(device)
        t1 = time.perf_counter_ns()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        _sync(device)
        t2 = time.perf_counter_ns()
        optimizer.step()
        _sync(device)
        t3 = time.perf_counter_ns()
        measured = step >= first_measured
        steps.append(
            {
                "rank": rank,
                "step": step,
                "measured": measured,
                "step_ns": t3 - t0,
                "forward_ns": t1 - t0,
                "backward_ns": t2 - t1,
                "optimizer_ns": t3 - t2,
            }
        )
        buckets.extend({"rank": rank, **row} for row in state.resolve())

    records: dict[str, list[dict[str, Any]]] = {"steps": steps, "buckets": buckets}
    if rank == 0:
        records["bucket_params"] = [
            {
                "bucket_index": p.bucket_index,
                "position": p.position,
                "param_name": p.param_name,
                "module": p.module,
                "numel": p.numel,
                "num_bytes": p.num_bytes,
            }
            for p in state.composition
        ]
    bucket_sizes = sorted({int(row["num_bytes"]) for row in buckets if row["step"] >= 1})
    records["microbench"] = _microbench(cell, rank=rank, device=device, bucket_sizes=bucket_sizes)
    if rank != 0:
        records["microbench"] = []
    return records


def _microbench(
    cell: Cell, *, rank: int, device: torch.device, bucket_sizes: list[int]
) -> list[dict[str, Any]]:
    """The all-reduce microbenchmark over the matrix's sizes and the model's bucket sizes."""
    from commprof.training.microbench import MicrobenchConfig, run_allreduce_bench

    rows: list[dict[str, Any]] = []
    for source, sizes in (("sizes", list(cell.microbench_sizes_bytes)), ("bucket", bucket_sizes)):
        if not sizes:
            continue
        config = MicrobenchConfig(sizes_bytes=tuple(sizes), timed_iters=cell.microbench_iters)
        results = run_allreduce_bench(
            config, rank=rank, world_size=dist.get_world_size(), device=device
        )
        rows.extend({**row, "source": source} for row in results)
    return rows
