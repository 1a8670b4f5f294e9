"""Per-step time breakdown of every measured (cell, attempt, rank, step), from the hook data.

The ``steps`` table times forward, backward and optimizer of each step; the ``buckets`` table
times each gradient bucket's all-reduce (``commprof.profiling.comm_hooks``): ``ready_ns`` (the
hook was called), ``launch_ns`` (the collective was enqueued) and ``done_ns`` (it completed).
From them, per (rank, step), with ``compute_end = max(ready_ns)`` (the last bucket becomes
ready when autograd produces the last gradient, i.e. when backward compute ends):

- ``comm_ns`` = |union of [ready_ns, done_ns)| over the step's buckets (C of docs/design.md,
  Definitions; the hook's latency interval, see ``comm_hooks``);
- ``exposed_ns`` = |union of [max(ready_ns, compute_end), done_ns)|: communication that
  nothing overlapped (the hook's per-bucket ``exposed_ns`` intervals, merged, so buckets that
  run concurrently on several gloo threads are not counted twice);
- ``overlap_ns`` = ``comm_ns - exposed_ns``; ``overlap_efficiency`` = overlap / comm (NaN, not
  0, where comm is 0); ``comm_overhead_fraction`` = exposed / ``step_ns`` (docs/design.md,
  Definitions);
- ``compute_ns`` = forward + backward - exposed (DDP's backward returns only after every bucket
  is reduced, so backward time holds the exposed communication);
- ``optimizer_ns`` as measured; ``other_ns`` = step - forward - backward - optimizer.

On CUDA cells (``device_latency_ns`` present) the host clock marks only the enqueue, so comm
is the sum of the buckets' device-timed ``transfer_ns`` and exposed the sum of their
``exposed_ns`` (one NCCL stream runs them one at a time: the parts do not overlap).

So ``compute_ns + exposed_ns + optimizer_ns + other_ns == step_ns`` exactly (int64); the
function checks it. Where a profiler trace was taken, ``trace_metrics`` holds the same
quantities from the trace; they are reported beside these, never mixed in.

This module imports no torch and no ray.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STEP_KEYS = ["cell_id", "attempt", "rank", "step"]
"""Columns that identify one step of one rank."""

BREAKDOWN_COLUMNS = (
    "step_ns",
    "forward_ns",
    "backward_ns",
    "optimizer_ns",
    "compute_ns",
    "exposed_ns",
    "other_ns",
    "comm_ns",
    "overlap_ns",
    "overlap_efficiency",
    "comm_overhead_fraction",
)
"""Metric columns of :func:`step_breakdown`, in display order."""


def union_length(frame: pd.DataFrame, keys: list[str], start: str, end: str) -> pd.Series:
    """Length of the union of [start, end) intervals per group, vectorised.

    Sorted by start within each group, interval i adds ``max(0, end_i - max(start_i, M))`` where
    M is the largest end among the intervals before it in its group (a running maximum, as the
    sweep over sorted starts in HTA's overlap code). Empty intervals add nothing.

    Args:
        frame: one row per interval.
        keys: the grouping columns.
        start: column of interval starts (int64 ns).
        end: column of interval ends (int64 ns).

    Returns:
        Union lengths (int64 ns) indexed by the group keys.
    """
    if frame.empty:
        index = pd.MultiIndex.from_tuples([], names=keys)
        return pd.Series([], index=index, dtype=np.int64)
    df = frame[[*keys, start, end]].sort_values([*keys, start], kind="stable")
    ends = df[end].astype(np.int64)
    prev_max = ends.groupby([df[k] for k in keys], sort=False).cummax()
    # fill_value keeps the shift in int64: a NaN fill would make it float64, which rounds
    # clock readings above 2**53 ns (about 104 days of uptime) to a multiple of 2 ns or more.
    prev_max = prev_max.groupby([df[k] for k in keys], sort=False).shift(
        1, fill_value=np.iinfo(np.int64).min
    )
    lo = np.maximum(df[start].to_numpy(np.int64), prev_max.to_numpy(np.int64))
    added = np.maximum(0, ends.to_numpy(np.int64) - lo)
    return pd.Series(added, index=df.index).groupby([df[k] for k in keys]).sum().astype(np.int64)


def step_breakdown(steps: pd.DataFrame, buckets: pd.DataFrame) -> pd.DataFrame:
    """The breakdown of every measured step (see the module docstring for the formulas).

    Args:
        steps: the dataset's ``steps`` table.
        buckets: the dataset's ``buckets`` table.

    Returns:
        One row per measured (cell_id, attempt, rank, step) with ``BREAKDOWN_COLUMNS`` and
        ``num_buckets``. Steps without bucket records have comm and exposed 0.

    Raises:
        AssertionError: if compute + exposed + optimizer + other != step for any row (a bug).
    """
    measured = steps[steps["measured"].astype(bool)].copy()
    b = buckets.merge(measured[STEP_KEYS], on=STEP_KEYS, how="inner")
    on_device = (
        b["device_latency_ns"].notna() if "device_latency_ns" in b else pd.Series(False, b.index)
    )
    host, device = b[~on_device].copy(), b[on_device]
    host["compute_end_ns"] = host.groupby(STEP_KEYS)["ready_ns"].transform("max")
    host["exposed_start_ns"] = np.maximum(host["ready_ns"], host["compute_end_ns"])
    # CUDA rows: the host clock marks only the enqueue there (comm_hooks), so the per-bucket
    # device-timed columns are summed: one NCCL stream runs the collectives one at a time, so
    # service times (transfer_ns) and exposed parts do not overlap each other.
    comm = union_length(host, STEP_KEYS, "ready_ns", "done_ns")
    exposed = union_length(host, STEP_KEYS, "exposed_start_ns", "done_ns")
    if not device.empty:
        by_step = device.groupby(STEP_KEYS)
        comm = pd.concat([comm, by_step["transfer_ns"].sum().astype(np.int64)])
        exposed = pd.concat([exposed, by_step["exposed_ns"].sum().astype(np.int64)])
    comm, exposed = comm.rename("comm_ns"), exposed.rename("exposed_ns")
    count = b.groupby(STEP_KEYS).size().rename("num_buckets")
    out = measured.set_index(STEP_KEYS).join([comm, exposed, count])
    for col in ("comm_ns", "exposed_ns", "num_buckets"):
        out[col] = out[col].fillna(0).astype(np.int64)
    out["compute_ns"] = out["forward_ns"] + out["backward_ns"] - out["exposed_ns"]
    out["other_ns"] = out["step_ns"] - out["forward_ns"] - out["backward_ns"] - out["optimizer_ns"]
    out["overlap_ns"] = out["comm_ns"] - out["exposed_ns"]
    comm_f = out["comm_ns"].astype(np.float64)
    out["overlap_efficiency"] = (out["overlap_ns"] / comm_f).where(comm_f > 0)
    out["comm_overhead_fraction"] = out["exposed_ns"] / out["step_ns"].astype(np.float64)
    total = out["compute_ns"] + out["exposed_ns"] + out["optimizer_ns"] + out["other_ns"]
    assert (total == out["step_ns"]).all(), "breakdown does not add up to step_ns"
    cols = [*BREAKDOWN_COLUMNS, "num_buckets"]
    return out.reset_index()[[*STEP_KEYS, *cols]]


def trace_breakdown(trace_metrics: pd.DataFrame) -> pd.DataFrame:
    """Trace-derived metrics of every (cell, attempt, rank, step), as the profiler saw them.

    Args:
        trace_metrics: the dataset's ``trace_metrics`` table (may be empty).

    Returns:
        The same rows with ``trace_`` prefixed to every metric column; empty if none.
    """
    metrics = [c for c in trace_metrics.columns if c not in STEP_KEYS]
    return trace_metrics.rename(columns={c: f"trace_{c}" for c in metrics})
