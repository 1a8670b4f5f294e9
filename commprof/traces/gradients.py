"""Per-parameter gradients of a DDP trace: their sizes, when each was written, and the buckets
the trace's own all-reduces held (``commprof estimate --trace DIR --bucket-cap-mb MB``).

A trace recorded with ``record_shapes=True`` gives each ``AccumulateGrad`` (the autograd op that
writes a parameter's gradient) its gradient's shape and dtype, and each bucket's launch through
``c10d::allreduce_`` on the thread that ran the backward (DDP's reducer launches a bucket from
the autograd hook of its last gradient). For each step window of a rank (``ProfilerStep#N`` on
the host) this module keeps, in the order they were written:

- each gradient's bytes (``Input Dims`` times the size of ``Input type``) and dtype;
- when it was written on the host (the op's end) and when it was ready on the device: the end of
  the last non-communication kernel that thread launched before the op ended (the kernel that
  computed or accumulated the gradient; CUPTI correlation ids). A trace without kernels (gloo on
  CPU) is ready when written;
- the host start of each ``c10d::allreduce_`` the thread launched in the window: a gradient
  written before launch k and after launch k-1 was in the trace's bucket k.

Pure reading; what a new cap does with these is :mod:`commprof.modeling.trace_whatif.what_if`'s.
docs/design.md, "Trace replay".
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from commprof.traces.intervals import Int64Array
from commprof.traces.trace_reader import stream_trace
from commprof.traces.trace_rules import COMM_KERNEL_PATTERN, LAUNCH_CALL_PATTERN, LAUNCH_CATS

GRADIENT_OP = "torch::autograd::AccumulateGrad"
"""The autograd op that writes a parameter's gradient; with ``record_shapes=True`` its ``Input
Dims`` give the gradient's shape (empty in some traces)."""
BUCKET_LAUNCH_OP = "c10d::allreduce_"
"""The op through which DDP's reducer launches a bucket's all-reduce (the default comm hook and
commprof's timing hook alike)."""
STEP_PREFIX = "ProfilerStep#"
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "Half": 2, "BFloat16": 2,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4, "int": 4, "long int": 8, "short int": 2, "signed char": 1,
    "unsigned char": 1, "bool": 1,
}  # fmt: skip
"""Bytes of an element of each ``Input type`` Kineto writes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepGradients:
    """The gradients of one step window of one rank, in the order they were written."""

    rank: int
    """Rank of the trace."""
    step: int
    """Step number (``ProfilerStep#N``)."""
    thread: int
    """The thread that wrote them and launched the buckets (the backward's)."""
    num_bytes: Int64Array
    """Bytes of each gradient."""
    dtype: tuple[str, ...]
    """Each gradient's ``Input type``."""
    written_ns: Int64Array
    """When each was written on the host (its ``AccumulateGrad``'s end, ns)."""
    ready_ns: Int64Array
    """When each was ready on the device (ns; the host time where the trace has no kernels)."""
    launch_ns: Int64Array
    """Host starts of the thread's bucket launches (``c10d::allreduce_``) in the window, sorted."""
    unsized: tuple[str, ...] = ()
    """What the thread's ``AccumulateGrad`` events in the window that gave no usable size had
    (their ``Input Dims`` and ``Input type``), one each."""

    @property
    def trace_bucket(self) -> Int64Array:
        """The trace's bucket of each gradient (its launch's index; ``launch_ns.size`` for a
        gradient written after the last launch)."""
        return np.searchsorted(self.launch_ns, self.written_ns, side="left").astype(np.int64)


def _ns(us: Any) -> int:
    return int(np.rint(float(us) * 1000.0))


def _numel(dims: Any) -> int | None:
    """Elements of a shape from ``Input Dims``' first entry; None where it gives none."""
    if not (isinstance(dims, list) and dims and isinstance(dims[0], list)):
        return None
    if not all(isinstance(d, int) and d >= 0 for d in dims[0]):
        return None
    return math.prod(dims[0])


class _Collect:
    """One pass over a trace's events: what :func:`read_step_gradients` needs."""

    def __init__(self) -> None:
        self.grads: list[tuple[int, int, int, int, str]] = []  # start, end, thread, bytes, dtype
        self.unsized: list[tuple[int, int, str]] = []  # start, thread, what it had
        self.launch_ops: list[tuple[int, int]] = []  # start, thread
        self.steps: list[tuple[int, int, int]] = []  # step, start, end
        self.runtime: list[tuple[int, int, int]] = []  # start, thread, correlation
        self.kernel_end: dict[int, int] = {}  # correlation -> end, non-communication kernels
        self.seen: set[tuple[str, Any, Any, Any]] = set()  # host ops read (duplicates dropped)

    def __call__(self, e: Any) -> None:
        if not isinstance(e, dict) or e.get("ph") != "X":
            return
        name, cat = str(e.get("name", "")), e.get("cat")
        args = e.get("args") or {}
        if name in (GRADIENT_OP, BUCKET_LAUNCH_OP):  # as parse_trace, an exact duplicate once
            key = (name, e.get("ts"), e.get("dur"), e.get("tid"))
            if key in self.seen:
                return
            self.seen.add(key)
        if name == GRADIENT_OP:
            numel = _numel(args.get("Input Dims"))
            types = args.get("Input type") or [""]
            dtype = str(types[0]) if isinstance(types, list) and types else ""
            if numel is None or dtype not in DTYPE_BYTES:
                had = f"Input Dims {args.get('Input Dims')!r}, Input type {dtype!r}"
                self.unsized.append((_ns(e["ts"]), int(e.get("tid", 0)), had))
                return
            start = _ns(e["ts"])
            self.grads.append((
                start, start + _ns(e.get("dur", 0)), int(e.get("tid", 0)),
                numel * DTYPE_BYTES[dtype], dtype,
            ))  # fmt: skip
        elif name == BUCKET_LAUNCH_OP:
            self.launch_ops.append((_ns(e["ts"]), int(e.get("tid", 0))))
        elif name.startswith(STEP_PREFIX) and cat != "gpu_user_annotation":
            step = name[len(STEP_PREFIX) :]
            if step.isdigit() and len(step) <= 9:  # windows.step_codes refuses a longer one
                start = _ns(e["ts"])
                self.steps.append((int(step), start, start + _ns(e.get("dur", 0))))
        elif cat in LAUNCH_CATS and LAUNCH_CALL_PATTERN.match(name) and "correlation" in args:
            self.runtime.append((_ns(e["ts"]), int(e.get("tid", 0)), int(args["correlation"])))
        elif cat == "kernel" and "correlation" in args and not _is_comm_kernel(name):
            self.kernel_end[int(args["correlation"])] = _ns(e["ts"]) + _ns(e.get("dur", 0))


@functools.lru_cache(maxsize=4096)
def _is_comm_kernel(name: str) -> bool:
    """Whether a shipped rule claims ``name`` (``COMM_KERNEL_PATTERN`` is written for ``match``:
    its leading ``.*?`` made ``search`` quadratic in the name). Cached: a trace repeats a few
    hundred kernel names over millions of events."""
    return COMM_KERNEL_PATTERN.match(name) is not None


def _kernels_by_thread(c: _Collect) -> dict[int, tuple[Int64Array, Int64Array]]:
    """Per launching thread: its non-communication kernels' launch starts, sorted, and the
    latest end of those launched up to each (launches matched to kernels by correlation id)."""
    if not c.runtime or not c.kernel_end:
        return {}
    runtime = np.array(c.runtime, np.int64)  # start, thread, correlation
    corr = np.fromiter(c.kernel_end, np.int64, len(c.kernel_end))
    end = np.fromiter(c.kernel_end.values(), np.int64, len(c.kernel_end))
    order = np.argsort(corr)
    corr, end = corr[order], end[order]
    pos = np.minimum(np.searchsorted(corr, runtime[:, 2]), corr.size - 1)
    hit = corr[pos] == runtime[:, 2]
    runtime, ends = runtime[hit], end[pos[hit]]
    out = {}
    for tid in np.unique(runtime[:, 1]).tolist():
        mine = runtime[:, 1] == tid
        by_start = np.argsort(runtime[mine, 0], kind="stable")
        out[tid] = runtime[mine, 0][by_start], np.maximum.accumulate(ends[mine][by_start])
    return out


def _device_ready(
    kernels: dict[int, tuple[Int64Array, Int64Array]], thread: int, written: Int64Array
) -> Int64Array:
    """When each gradient was ready on the device: the latest end of the non-communication
    kernels ``thread`` launched before its write ended (the kernel that computed or accumulated
    it, and any still running before it on the device); the write itself where the thread
    launched no kernel before it (gloo on CPU)."""
    if thread not in kernels:
        return written.copy()
    starts, ends = kernels[thread]
    pos = np.searchsorted(starts, written, side="right") - 1
    return np.where(pos >= 0, ends[np.maximum(pos, 0)], written).astype(np.int64)


def read_step_gradients(path: Path | str, rank: int) -> dict[int, StepGradients]:
    """The gradients of every step window of one rank's trace file.

    Args:
        path: A trace file.
        rank: Its rank (as :func:`commprof.traces.trace_parser.parse_trace` names it).

    Returns:
        The step's gradients by step number (steps with a bucket launch and a sized gradient on
        one thread; the thread's gradients without a usable size are named in ``unsized``).
    """
    c = _Collect()
    stream_trace(path, c)
    kernels = _kernels_by_thread(c)
    out = {}
    for step, lo, hi in sorted(c.steps):
        grads = [g for g in c.grads if lo <= g[0] < hi]
        launches = [op for op in c.launch_ops if lo <= op[0] < hi]
        if not grads or not launches:
            continue
        # the backward's thread: the one that launched buckets and wrote the most gradients
        launching = {tid for _, tid in launches}
        counts = Counter(g[2] for g in grads if g[2] in launching)
        if not counts:
            continue
        thread = counts.most_common(1)[0][0]
        mine = sorted((g for g in grads if g[2] == thread), key=lambda g: g[1])
        written = np.array([g[1] for g in mine], np.int64)
        out[step] = StepGradients(
            rank=rank,
            step=step,
            thread=thread,
            num_bytes=np.array([g[3] for g in mine], np.int64),
            dtype=tuple(g[4] for g in mine),
            written_ns=written,
            ready_ns=_device_ready(kernels, thread, written),
            launch_ns=np.array(sorted(s for s, tid in launches if tid == thread), np.int64),
            unsized=tuple(had for ts, tid, had in c.unsized if tid == thread and lo <= ts < hi),
        )
    return out
