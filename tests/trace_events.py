"""Hand-built Kineto events and traces for trace tests (parser, metrics, cross-rank, analyze)."""

from __future__ import annotations

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
