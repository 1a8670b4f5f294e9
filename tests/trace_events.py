"""Hand-built Kineto events and traces for trace tests (parser, metrics, cross-rank, analyze)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np


def x(name: str, cat: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    """A complete event; ts and dur in microseconds as Kineto writes them."""
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


# A synthetic 4-rank NCCL job with known clock offsets and arrival delays: every collective
# ends at the same true time on every rank, so offsets, skew, transfer and wait have closed forms.
OFFSET_US = (0.0, 7000.0, -3250.5, 12345.678)
"""Injected clock offset of each rank (us): rank r writes true time + OFFSET_US[r]."""
DELAY_US = np.array(
    [  # arrival delay of rank r (row) at collective c (column), us
        [0.0, 40.0, 5.0, 0.0, 90.0],
        [10.0, 0.0, 5.0, 0.0, 0.0],
        [250.0, 15.0, 30.0, 0.0, 45.5],
        [3.0, 80.0, 0.0, 0.0, 12.0],
    ]
)
TRANSFER_US = np.array([100.0, 220.0, 35.0, 60.0, 410.0])
BASE_US = 1000.0 + 1500.0 * np.arange(DELAY_US.shape[1])
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def rank_trace(
    rank: int, *, seq: bool = True, jitter_us: float = 0.0, stream: int = 20
) -> dict[str, Any]:
    """Rank ``rank``'s trace: every collective ends at the same true time on every rank."""
    events = [x("ProfilerStep#3", "user_annotation", OFFSET_US[rank], 9000.0)]
    for c, base in enumerate(BASE_US):
        arrive = base + DELAY_US[rank, c]
        end = base + DELAY_US[:, c].max() + TRANSFER_US[c] + jitter_us * ((rank + c) % 3 - 1)
        args: dict[str, Any] = {"Collective name": "allreduce", "Process Group Name": "0"}
        if seq:
            args["Seq"] = 100 + c
        events.append(x(NCCL, "kernel", arrive + OFFSET_US[rank], end - arrive, stream, **args))
        events.append(x("sgemm", "kernel", base + OFFSET_US[rank] - 500.0, 300.0, 7))
    return {
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": len(OFFSET_US)},
        "traceEvents": events,
    }


def write_job(folder: Path) -> Path:
    """The 4-rank job of :func:`rank_trace` as gzipped rank files in ``folder``, with a JSON file
    that is no trace beside them (skipped, and said so); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(len(OFFSET_US)):
        with gzip.open(folder / f"rank{rank}.json.gz", "wt") as fh:
            json.dump(rank_trace(rank), fh)
    (folder / "notes.json").write_text('{"not": "a trace"}')
    return folder


# A ROCm-like training rank whose GPU runs LAG_US behind its CPU (more than a step): each step
# launches a GEMM and two RCCL collectives (ncclDevKernel_Generic, no metadata on the kernel);
# the metadata is only on the launching record_param_comms op. Per step k (CPU window
# [k P, (k+1) P)), on the GPU: gemm [kP+16000, kP+20000), all_reduce [kP+17000, kP+22000),
# all_gather [kP+24000, kP+25000) (us).
STEP_US = 10_000.0
LAG_US = 15_000.0
NUM_LAG_STEPS = 4
LAG_KERNELS = (  # name, launch offset in the step (us), duration (us), collective metadata
    ("Cijk_Ailk_Bljk_SB_MT128x128x16_gemm", 1000.0, 4000.0, None),
    ("ncclDevKernel_Generic", 2000.0, 5000.0, ("allreduce", 0)),
    ("ncclDevKernel_Generic", 9000.0, 1000.0, ("_allgather_base", 100)),
)


def lagging_rank_trace(rank: int = 0, *, offset_us: float = 0.0) -> dict[str, Any]:
    """The lagging-GPU rank (see LAG_KERNELS); ``offset_us`` shifts its whole clock."""
    events: list[dict[str, Any]] = []
    corr = 1
    for k in range(NUM_LAG_STEPS):
        base = k * STEP_US + offset_us
        events.append(x(f"ProfilerStep#{k}", "user_annotation", base, STEP_US - 1.0))
        events.append(x("forward", "python_function", base + 10.0, 500.0))
        for name, at, dur, coll in LAG_KERNELS:
            host = base + at
            if coll is None:
                events.append(x("aten::mm", "cpu_op", host - 5.0, 20.0))
            else:
                meta = {
                    "Collective name": coll[0],
                    "Process Group Name": "0",
                    "In msg nelems": 1024,
                    "dtype": "Float",
                    "Group size": 2,
                    "Seq": coll[1] + k,
                }
                events.append(x("record_param_comms", "cpu_op", host - 8.0, 30.0, **meta))
                events.append(x(f"nccl:{coll[0].strip('_')}", "user_annotation", host - 4.0, 20.0))
            events.append(x("hipLaunchKernel", "cuda_runtime", host, 6.0, correlation=corr))
            stream = 0 if coll is None else 1  # RCCL runs on a stream of its own
            kernel = x(name, "kernel", host + LAG_US, dur, stream, correlation=corr, stream=stream)
            kernel["pid"] = 0  # the device's pid, as Kineto writes it
            events.append(kernel)
            events.append({"ph": "s", "cat": "ac2g", "id": corr, "pid": 1, "tid": 1, "ts": host})
            corr += 1
    events.append({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}})
    return {
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
        "traceEvents": events,
    }
