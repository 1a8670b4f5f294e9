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

import contextlib
import dataclasses
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commprof.matrix import Cell
from commprof.profiling.comm_hooks import TimingState, register_timing_hook
from commprof.profiling.harness import profiled
from commprof.training.data import loss_fn, make_batch
from commprof.training.models import build_model

# Step 0 runs with one bucket holding the whole model, before DDP rebuilds its buckets, and pays
# one-time costs (allocator, lazy init); it is never measured, whatever warmup_steps says.
ALWAYS_EXCLUDED_STEPS = 1
SGD_LR = 0.01
SGD_MOMENTUM = 0.9
ADAM_LR = 1e-4
CALIBRATION_SIZES_BYTES = tuple(4**k * 16 * 2**10 for k in range(6))
"""Microbenchmark sizes (16 KiB to 16 MiB, factor 4) when the matrix names none: enough distinct
sizes for a ring fit (``calibration.MIN_POINTS``) from one cell, however few buckets it has."""
INTERFERENCE_SIZES_BYTES = (64 * 2**10, 2**20, 16 * 2**20)
"""Message sizes of the interference arms (``commprof.training.interference``): one per decade
and a half of the bucket sizes DDP makes; the simulator interpolates between them."""
MAX_TRACE_BYTES = 16 * 2**20
"""Compressed traces up to this size travel back to the driver; larger ones stay on the node."""


def _optimizer(cell: Cell, params: Any) -> torch.optim.Optimizer:
    if cell.optimizer == "adam":
        return torch.optim.Adam(params, lr=ADAM_LR)
    return torch.optim.SGD(params, lr=SGD_LR, momentum=SGD_MOMENTUM)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: phase boundary, outside every hook


def train_rank(cell: Cell, *, rank: int, device: torch.device) -> dict[str, Any]:
    """Train one rank of ``cell`` in the current process group and return its records.

    Args:
        cell: the configuration.
        rank: this process's rank (equal to ``dist.get_rank()``).
        device: where the model and batches live.

    Returns:
        ``{"records": {table: rows}, "traces": {file name: gzip bytes}}``. Tables: ``steps``
        and ``buckets`` from every rank, ``trace_metrics`` from every rank of a profiled cell,
        ``bucket_params`` and ``microbench`` from rank 0 only (the same on every rank).
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
    trace_dir = Path(tempfile.mkdtemp(prefix=f"commprof-trace-r{rank}-")) if cell.profile else None
    with _harness(trace_dir, rank, first=first_measured, last=cell.steps - 1) as harness:
        for step in range(cell.steps):
            inputs, targets = make_batch(
                cell.model, cell.batch_size, rank=rank, seed=cell.seed, step=step, device=device
            )
            state.step = step
            t0, t1, t2, t3 = _timed_step(ddp, optimizer, criterion, inputs, targets, device)
            if harness is not None:
                harness.step()
            steps.append(
                {
                    "rank": rank,
                    "step": step,
                    "measured": step >= first_measured,
                    "start_ns": t0,
                    "step_ns": t3 - t0,
                    "forward_ns": t1 - t0,
                    "backward_ns": t2 - t1,
                    "optimizer_ns": t3 - t2,
                }
            )
            buckets.extend({"rank": rank, **row} for row in state.resolve())

    records: dict[str, list[dict[str, Any]]] = {"steps": steps, "buckets": buckets}
    traces: dict[str, bytes] = {}
    if trace_dir is not None:
        records["trace_metrics"], traces = trace_records(trace_dir, buckets)
    if cell.hook_cost_pairs > 0:  # after the measured steps and the profiler: they are untouched
        records["hook_cost"] = _hook_cost(cell, ddp, state, optimizer, criterion, rank, device)
    if rank == 0:
        records["bucket_params"] = [dataclasses.asdict(p) for p in state.composition]
    bucket_sizes = sorted({int(row["num_bytes"]) for row in buckets if row["step"] >= 1})
    microbench = _microbench(cell, rank=rank, device=device, bucket_sizes=bucket_sizes)
    records["microbench"] = microbench if rank == 0 else []
    if cell.interference_iters > 0:
        from commprof.training.interference import run_interference_bench

        rows = run_interference_bench(
            INTERFERENCE_SIZES_BYTES, iters=cell.interference_iters, device=device
        )
        records["interference"] = rows if rank == 0 else []
    return {"records": records, "traces": traces}


def _hook_cost(
    cell: Cell,
    ddp: DistributedDataParallel,
    state: TimingState,
    optimizer: torch.optim.Optimizer,
    criterion: Any,
    rank: int,
    device: torch.device,
) -> list[dict[str, Any]]:
    """The hooked model against a plain replica, in interleaved pairs of steps
    (``commprof.training.hook_cost``); the hooked arm's bucket rows are resolved after each of
    its steps, outside the timed window, as in the measured steps, and dropped."""
    from commprof.training.hook_cost import interleaved_pairs, plain_replica

    torch.manual_seed(cell.seed)
    plain = plain_replica(
        ddp, build_model(cell.model).to(device), hook=cell.hook, bucket_cap_mb=cell.bucket_cap_mb
    )
    arms = {"hooked": (ddp, optimizer), "plain": (plain, _optimizer(cell, plain.parameters()))}

    def step(arm: str, index: int) -> tuple[int, int, int, int]:
        model, opt = arms[arm]
        inputs, targets = make_batch(
            cell.model, cell.batch_size, rank=rank, seed=cell.seed, step=cell.steps + index,
            device=device,
        )  # fmt: skip
        if arm == "hooked":
            state.step = cell.steps + index
        times = _timed_step(model, opt, criterion, inputs, targets, device)
        if arm == "hooked":
            state.resolve()  # as after a measured step; these rows are not kept
        return times

    try:
        return interleaved_pairs(
            step, pairs=cell.hook_cost_pairs, seed=cell.seed, rank=rank, barrier=dist.barrier
        )
    finally:
        arms.clear()  # the replica and its optimizer go with the last reference
        del plain


def _timed_step(
    ddp: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    criterion: Any,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    device: torch.device,
) -> tuple[int, int, int, int]:
    """One training step; host clock at its start and after forward, backward and optimizer.

    The device is synchronised at each phase boundary (a step's phases are what this times; the
    timing hook inside backward never synchronises).
    """
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
    return t0, t1, t2, t3


@contextlib.contextmanager
def _harness(trace_dir: Path | None, rank: int, *, first: int, last: int) -> Iterator[Any]:
    """The profiler over steps ``first..last`` (None and no profiler without a trace_dir)."""
    if trace_dir is None:
        yield None
        return
    # Off until one step before the measured ones, which is the profiler's own warm-up step
    # (traced and discarded), then active to the end: the trace holds exactly the measured steps.
    with profiled(
        trace_dir, rank=rank, wait=first - 1, warmup=1, active=last - first + 1, repeat=1
    ) as harness:
        yield harness


class UnreadableTrace(RuntimeError):
    """The profiler wrote a trace the reader refuses: a transient fault (``commprof.outcomes``
    retries a cell whose rank raised it), not the configuration's."""


def trace_records(
    trace_dir: Path, buckets: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """Per-step trace metrics with the hook cross-check, and the compressed traces."""
    from commprof.traces.metrics import bucket_exposure, step_metrics
    from commprof.traces.trace_parser import parse_trace

    rows: list[dict[str, Any]] = []
    traces: dict[str, bytes] = {}
    hook = pd.DataFrame(buckets)
    for path in sorted(trace_dir.glob("*.json.gz")):
        try:
            parsed = parse_trace(path)
        except ValueError as exc:
            raise UnreadableTrace(
                f"torch.profiler wrote a trace the reader refuses, so the cell runs again "
                f"(a transient fault of the profiler's): {exc}"
            ) from exc
        metrics = step_metrics(parsed)
        with warnings.catch_warnings():
            # Step 1 also holds DDP's bucket-rebuild collectives; matching by size skips them.
            warnings.simplefilter("ignore", UserWarning)
            matched = bucket_exposure(parsed, hook).dropna(subset=["comm_ns"])
        check = matched.groupby("step").agg(
            num_collectives=("comm_ns", "size"),
            hook_latency_ns=("latency_ns", "sum"),
            trace_collective_ns=("comm_ns", "sum"),
            bucket_exposed_ns=("comm_exposed_ns", "sum"),
        )
        metrics = metrics.join(check, on="step")
        rows.extend(_plain_row(row) for row in metrics.to_dict("records"))
        if path.stat().st_size <= MAX_TRACE_BYTES:
            traces[path.name] = path.read_bytes()
        path.unlink()
    trace_dir.rmdir()
    return rows, traces


def _plain_row(row: dict[Any, Any]) -> dict[str, Any]:
    """pandas/numpy scalars -> Python ones; a missing count (NA, NaN) -> None.

    The ratio columns keep NaN: an overlap efficiency is undefined, not 0, where comm is 0.
    """
    out: dict[str, Any] = {}
    for key, value in row.items():
        value = value.item() if hasattr(value, "item") else value
        missing = value is None or value is pd.NA or (isinstance(value, float) and value != value)
        ratio = str(key) in ("overlap_efficiency", "comm_overhead_fraction")
        out[str(key)] = None if missing and not ratio else value
    return out


def _microbench(
    cell: Cell, *, rank: int, device: torch.device, bucket_sizes: list[int]
) -> list[dict[str, Any]]:
    """The all-reduce microbenchmark over the matrix's sizes (``CALIBRATION_SIZES_BYTES`` when it
    names none) and the model's bucket sizes."""
    from commprof.training.microbench import MicrobenchConfig, run_allreduce_bench

    rows: list[dict[str, Any]] = []
    matrix_sizes = list(cell.microbench_sizes_bytes or CALIBRATION_SIZES_BYTES)
    for source, sizes in (("sizes", matrix_sizes), ("bucket", bucket_sizes)):
        if not sizes:
            continue
        config = MicrobenchConfig(
            sizes_bytes=tuple(sizes),
            timed_iters=cell.microbench_iters,
            passes=cell.microbench_passes,
        )
        results = run_allreduce_bench(
            config, rank=rank, world_size=dist.get_world_size(), device=device
        )
        rows.extend({**row, "source": source} for row in results)
    return rows
