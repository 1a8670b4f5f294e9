"""The column reader's caches (a category per struct type, a name and thread per (name, pid, tid)
triple) give the columns the event-at-a-time path gives, chunk after chunk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from commprof.traces.column_builder import read_columns
from commprof.traces.trace_columns import TraceColumns
from commprof.traces.trace_rules import RULES

NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _event(name: str, cat: str, ts: float, pid: Any, tid: Any, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": 2.0,
            "args": args}  # fmt: skip


def _trace() -> dict[str, Any]:
    """Ten steps of one launch and kernel each, an all-reduce every other step, on a pid written
    as 7 and as 7.0 (equal to Python's dict, so one thread), string tids, a category no table
    knows (``my_cat``: learned by the tagged decoder) and one instant event of a kept category."""
    events: list[dict[str, Any]] = []
    for k in range(10):
        t = 100.0 * k
        pid = 7 if k % 2 else 7.0
        events.append(_event(f"ProfilerStep#{k}", "user_annotation", t, pid, "main"))
        events.append(_event("cudaLaunchKernel", "cuda_runtime", t + 1, pid, "main",
                             correlation=2 * k))  # fmt: skip
        events.append(_event("sgemm", "kernel", t + 10, 0, "stream 7", correlation=2 * k))
        events.append(_event("aten::mm", "cpu_op", t + 3, pid, "main"))
        events.append(_event("nccl:all_reduce", "my_cat", t + 4, pid, "comm"))
        if k % 2:
            events.append(_event("record_param_comms", "cpu_op", t + 5, pid, "main",
                                 **{"Collective name": "allreduce", "Seq": k}))  # fmt: skip
            events.append(_event("cudaLaunchKernel", "cuda_runtime", t + 6, pid, "main",
                                 correlation=2 * k + 1))  # fmt: skip
            events.append(_event(NCCL_KERNEL, "kernel", t + 20, 0, "stream 13",
                                 correlation=2 * k + 1))  # fmt: skip
    events.append({"ph": "i", "cat": "user_annotation", "name": "mark", "pid": 7, "tid": "main",
                   "ts": 5.0, "s": "t"})  # fmt: skip
    return {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
            "traceEvents": events}  # fmt: skip


def _rows(cols: TraceColumns) -> list[tuple[Any, ...]]:
    """Each kept event as its values (names and categories, not their codes), in file order."""
    return [
        (str(cols.cats[c]), str(cols.names[n]), int(s), int(e), int(t), int(r), cols.args.get(i))
        for i, (c, n, s, e, t, r) in enumerate(zip(
            cols.cat_code.tolist(), cols.name_code.tolist(), cols.start_ns.tolist(),
            cols.end_ns.tolist(), cols.thread.tolist(), cols.correlation.tolist(), strict=True,
        ))
    ]  # fmt: skip


def _launches(cols: TraceColumns) -> list[tuple[Any, ...]]:
    return list(zip(
        cols.launch_correlation.tolist(), cols.launch_start_ns.tolist(),
        cols.launch_thread.tolist(), [str(cols.names[n]) for n in cols.launch_name_code],
        strict=True,
    ))  # fmt: skip


@pytest.mark.parametrize("chunk_bytes", [200, 1500, 1 << 18])
def test_cached_codes_give_the_event_at_a_time_columns(tmp_path: Path, chunk_bytes: int) -> None:
    doc = _trace()
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    streamed = read_columns(path, RULES.values(), chunk_bytes=chunk_bytes)
    one_by_one = read_columns(doc, RULES.values())
    assert _rows(streamed) == _rows(one_by_one)
    assert _launches(streamed) == _launches(one_by_one)
    rows = _rows(streamed)
    # Kept: 10 step annotations, 10 + 5 kernels, 5 record_param_comms, 10 nccl:all_reduce (its
    # name is needed in any category); not aten::mm (no rule reads it) nor the instant event.
    assert len(rows) == 10 + 15 + 5 + 10
    assert not {"aten::mm", "mark"} & {r[1] for r in rows}
    # pid 7 and 7.0 are one process: every "main" event is on one thread.
    main = {r[4] for r in rows if r[1].startswith(("ProfilerStep#", "record_param_comms"))}
    assert len(main) == 1
    assert {r[0] for r in rows if r[1] == "nccl:all_reduce"} == {"my_cat"}
    kept_args = [r[6] for r in rows if r[1] == "record_param_comms"]
    assert kept_args == [{"Collective name": "allreduce", "Seq": k} for k in (1, 3, 5, 7, 9)]
    # The launches are kept apart (correlation ids only), 15 of them, sorted by correlation id.
    assert [lc[0] for lc in _launches(streamed)] == sorted(
        [2 * k for k in range(10)] + [2 * k + 1 for k in range(1, 10, 2)]
    )
    assert np.all(streamed.correlation[[r[1] == "sgemm" for r in rows]] >= 0)
