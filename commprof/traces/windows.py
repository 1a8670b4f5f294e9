"""Step windows of a trace: which ``ProfilerStep#N`` annotations bound the steps.

Kineto writes ``ProfilerStep#N`` on the CPU (a ``user_annotation`` around the step's
host work) and, on newer versions, projects it onto the device (a
``gpu_user_annotation`` from the first to the last kernel the step launched). The
device one is the better window where it is right: kernels run behind their launches.
On some ROCm traces it is only microseconds long and out of phase with the steps, and
windows taken from it hold no kernels (every collective outside, comm 0). So the
windows come from the CPU annotations unless the device ones are shown to hold the
kernels: at least ``DEVICE_WINDOW_MIN_SHARE`` of the kernel time (communication and
compute) that the CPU windows hold (docs/design.md, Definitions).
"""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.intervals import Int64Array, IntervalSet, clip, total_length, union_all
from commprof.traces.trace_columns import TraceColumns, code_mask
from commprof.traces.trace_rules import STEP_PATTERN

DEVICE_WINDOW_MIN_SHARE = 0.9
"""Device step windows are used where they hold at least this share of the kernel time
that the CPU windows hold."""
CPU_SOURCE, DEVICE_SOURCE, WHOLE_SOURCE = "ProfilerStep", "device ProfilerStep", "whole trace"
LAUNCH_SOURCE = "ProfilerStep launches"
"""The ``step_source`` labels: CPU-side annotations, device-side ones, one window, and the CPU
steps followed onto the GPU through what each launched (:func:`launch_windows`)."""

Windows = tuple[Int64Array, Int64Array, Int64Array]


def _cat_mask(cols: TraceColumns, cat: str) -> npt.NDArray[np.bool_]:
    return code_mask(cols.cat_code, [c == cat for c in cols.cats])


def _windows(
    cols: TraceColumns, sel: npt.NDArray[np.intp], step_of_code: dict[int, int]
) -> Windows:
    """Steps and [start, end) of the selected annotations; one window per step number."""
    frame = pd.DataFrame({
        "step": [step_of_code[int(c)] for c in cols.name_code[sel]],
        "start": cols.start_ns[sel], "end": cols.end_ns[sel],
    }).groupby("step").agg(start=("start", "min"), end=("end", "max"))  # fmt: skip
    ids = frame.index.to_numpy(np.int64)
    return ids, frame["start"].to_numpy(np.int64), frame["end"].to_numpy(np.int64)


def _kernel_time_inside(kernels: list[IntervalSet], windows: Windows) -> int:
    # Window by window with binary search (clip), the union of the sets taken per window:
    # no temporaries the size of the trace.
    _, start, end = windows
    return sum(
        total_length(union_all([clip(k, int(lo), int(hi)) for k in kernels]))
        for lo, hi in zip(start, end, strict=True)
    )


def _choose(cpu: Windows | None, device: Windows, kernels: list[IntervalSet], source: str) -> bool:
    """Whether the device windows hold the kernels (else the CPU ones are used)."""
    on_device = _kernel_time_inside(kernels, device)
    on_cpu = _kernel_time_inside(kernels, cpu) if cpu is not None else 0
    if cpu is None:
        return True
    if on_device > 0 and on_device >= DEVICE_WINDOW_MIN_SHARE * on_cpu:
        return True
    warnings.warn(
        f"{source}: device ProfilerStep annotations hold {on_device / 1e6:.3f} ms of kernel "
        f"time against {on_cpu / 1e6:.3f} ms in the CPU ones; step windows from the CPU "
        "annotations",
        stacklevel=4,
    )
    return False


MAX_STEP_DIGITS = 9
"""Most digits of a ``ProfilerStep#N`` number: a billion steps; more is no profiled run."""


def step_codes(cols: TraceColumns) -> list[tuple[int, int]]:
    """(name code, step number) of every ``ProfilerStep#N`` name of the trace.

    Raises:
        ValueError: a step number of more than ``MAX_STEP_DIGITS`` digits, naming it.
    """
    out = []
    for i, name in enumerate(cols.names):
        match = STEP_PATTERN.match(str(name))
        if match is None:
            continue
        if len(match.group(1)) > MAX_STEP_DIGITS:
            raise ValueError(
                f"{cols.source}: event 'ProfilerStep#{match.group(1)[:12]}...' has a step number "
                f"of {len(match.group(1))} digits, more than {MAX_STEP_DIGITS}; not a trace "
                "torch.profiler wrote"
            )
        out.append((i, int(match.group(1))))
    return out


def cpu_step_windows(cols: TraceColumns) -> Windows | None:
    """Steps and [start, end) of the CPU-side ``ProfilerStep#N`` annotations (None: none)."""
    step_names = step_codes(cols)
    if not step_names:
        return None
    step_of_code = dict(step_names)
    is_step = [i in step_of_code for i in range(len(cols.names))]
    sel = np.flatnonzero(code_mask(cols.name_code, is_step))
    sel = sel[~_cat_mask(cols, "gpu_user_annotation")[sel]]
    return _windows(cols, sel, step_of_code) if sel.size else None


def launch_windows(
    cpu: Windows, step_index: npt.NDArray[np.intp], start_ns: Int64Array, end_ns: Int64Array
) -> Windows:
    """The CPU steps followed onto the GPU: step k's window runs from the first to the last
    device activity that step k launched (``step_index``: the CPU window each activity's
    launch lies in, -1 for none), as Kineto projects ProfilerStep onto the device.

    Where the GPU lags its CPU the windows lie later than the CPU's; where one step's
    activities still run when the next step's first one starts, the window ends there (time
    is counted in the window it runs in). A step that launched nothing keeps its CPU window,
    moved past the previous window's end. Windows come out sorted and disjoint.

    Args:
        cpu: The CPU windows (step ids, starts, ends), sorted by step.
        step_index: Per device activity, the index of its step in ``cpu`` (-1: none).
        start_ns: The activities' starts.
        end_ns: The activities' ends.
    """
    ids, lo, hi = cpu[0], cpu[1].copy(), cpu[2].copy()
    inside = step_index >= 0
    k = step_index[inside]
    first = np.full(ids.size, np.iinfo(np.int64).max)
    last = np.full(ids.size, np.iinfo(np.int64).min)
    np.minimum.at(first, k, start_ns[inside])
    np.maximum.at(last, k, end_ns[inside])
    has = last >= first
    lo[has], hi[has] = first[has], last[has]
    for i in range(ids.size):  # steps are few: order them in time, each after the last
        if i + 1 < ids.size and has[i + 1]:
            hi[i] = min(hi[i], max(lo[i + 1], lo[i]))
        if i:
            lo[i] = max(lo[i], hi[i - 1])
            hi[i] = max(hi[i], lo[i])
    return ids, lo, hi


def step_windows(
    cols: TraceColumns, targets: npt.NDArray[np.int8], work: list[IntervalSet], source: str
) -> tuple[Int64Array, Int64Array, Int64Array, str]:
    """Step numbers, window starts and ends (ns), and where the windows came from.

    Args:
        cols: The trace's columns.
        targets: Class index of each event (-1 unclassified), for the whole-trace fallback.
        work: The steps' work that device windows must hold: the sets whose union it is,
            the communication and compute classes (the kernels, in the cuda regimes);
            united window by window, never over the whole trace (peak memory).
        source: Trace name for messages.

    Returns:
        (step ids, starts, ends, label); label is one of CPU_SOURCE, DEVICE_SOURCE,
        WHOLE_SOURCE.

    Raises:
        ValueError: If the chosen windows overlap, or there are neither annotations nor
            classified events.
    """
    step_names = step_codes(cols)
    if step_names:
        step_of_code = dict(step_names)
        is_step = [i in step_of_code for i in range(len(cols.names))]
        sel = np.flatnonzero(code_mask(cols.name_code, is_step))
        on_device = _cat_mask(cols, "gpu_user_annotation")[sel]
        cpu = _windows(cols, sel[~on_device], step_of_code) if (~on_device).any() else None
        label, chosen = CPU_SOURCE, cpu
        if on_device.any():
            device = _windows(cols, sel[on_device], step_of_code)
            if _choose(cpu, device, work, source):
                label, chosen = DEVICE_SOURCE, device
        assert chosen is not None
        ids, start, end = chosen
        if np.any(start[1:] < end[:-1]):
            raise ValueError(f"{source}: {label} windows overlap; cannot assign events to steps")
        return ids, start, end, label
    classified = targets >= 0
    if not classified.any():
        raise ValueError(f"{source}: no ProfilerStep annotations and no classified events")
    warnings.warn(
        f"{source}: no ProfilerStep#N annotations; using one window (step 0) over the whole trace",
        stacklevel=3,
    )
    lo, hi = cols.start_ns[classified].min(), cols.end_ns[classified].max()
    return np.array([0]), np.array([lo]), np.array([hi]), WHOLE_SOURCE


def step_index(
    cpu: Windows | None, at_ns: Int64Array, valid: npt.NDArray[np.bool_]
) -> npt.NDArray[np.intp]:
    """Index of the CPU window each time lies in (-1: none, or not ``valid``)."""
    if cpu is None or not at_ns.size:
        return np.full(at_ns.size, -1, np.intp)
    _, lo, hi = cpu
    win = np.searchsorted(lo, at_ns, side="right") - 1
    inside = valid & (win >= 0) & (at_ns < hi[np.maximum(win, 0)])
    return np.where(inside, win, -1)
