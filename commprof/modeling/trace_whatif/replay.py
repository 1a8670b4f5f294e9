"""A step of a real trace as a replayable timeline, and its replay (``commprof estimate --trace``).

Each step window of a rank's trace (the windows of ``commprof analyze``) becomes a
:class:`StepTimeline`: the compute class as a sequence of busy intervals with the gaps between
them as measured, and the collectives in the order their stream ran them, each with its stream,
measured duration, size, type and group size (from its args or launching op, as the
``collectives`` table of ``analyze`` holds them). Both are clipped to the window, as the step
table counts them (``metrics.SPAN_RULE``).

:func:`replay` runs the timeline again with the same or new collective durations. Every item
keeps its measured position relative to what it waited for (docs/design.md, "Trace replay"):

    compute i:   s'_i = e'_{i-1} + g_i                       g_i the measured gap before it
                 or max(e'_{i-1}, e'_c + r_i)                where collective c ended in that gap
                                                             and compute resumed r_i <=
                                                             RESUME_GAP_NS after it (a wait on c)
    collective:  ready' = s'_k + (s_c - s_k)                 launched inside compute interval k
                        = e'_k + (s_c - e_k)                 or in the gap after it
                 s'_c = max(ready', e'_p)                    p the previous one on its stream
                 s'_c = max(ready'_p, e'_p + q_c)            where it started q_c <=
                                                             QUEUED_GAP_NS after p ended
                                                             (queued behind p: ready when p was)
    step' = max over items of e' + (the window's measured tail after its last item) - window start
    exposed' = |C' minus K'|, C' and K' the replayed collective and compute intervals.

With the measured durations every ``max`` has a term equal to the measured start, so the identity
replay gives back the trace's own step and exposed time where the timeline holds what the step
table counts (the compute and communication classes); the comparison is reported per step.
Pure functions over int64 nanoseconds; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.gradients import StepGradients, read_step_gradients
from commprof.traces.intervals import Int64Array, IntervalSet, clip, difference, total_length
from commprof.traces.metrics import step_metrics
from commprof.traces.trace_parser import ParsedTrace, parse_trace

QUEUED_GAP_NS = 10_000
"""A collective that starts at most this long (10 us) after the previous one on its stream ended
was queued behind it: NCCL kernels launched back to back start a few us apart."""
RESUME_GAP_NS = 50_000
"""Compute that resumes at most this long (50 us) after a collective ended, with no compute in
between, waited on it (a stream wait on the collective's event, then a kernel launch)."""
UNKNOWN = -1
"""Size or group size that the trace does not give."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimeline:
    """One step window of one rank's trace, as :func:`replay` reads it."""

    rank: int
    """Rank of the trace."""
    step: int
    """Step number (``ProfilerStep#N``)."""
    source: str
    """Trace file."""
    window_start_ns: int
    """Window start (ns, the trace's clock)."""
    window_end_ns: int
    """Window end (ns)."""
    compute_start_ns: Int64Array
    """Busy intervals of the compute class in the window, sorted and merged: starts."""
    compute_end_ns: Int64Array
    """Their ends."""
    comm_start_ns: Int64Array
    """Collectives running in the window (clipped to it), by measured start: starts."""
    comm_end_ns: Int64Array
    """Their ends."""
    stream: Int64Array
    """Each collective's stream (the kernel's thread id in the trace)."""
    num_bytes: Int64Array
    """Each collective's message size in bytes (UNKNOWN where the trace does not say)."""
    group_size: Int64Array
    """Each collective's process-group size (UNKNOWN where the trace does not say)."""
    collective_type: tuple[str, ...]
    """Each collective's type (all_reduce, all_to_all, ...; ``trace_rules.collective_type``)."""
    world_size: int | None
    """World size from the trace's ``distributedInfo`` (None where absent)."""
    measured_step_ns: int
    """The window's length as ``commprof analyze`` reports it (``window_ns``)."""
    measured_exposed_ns: int
    """Exposed communication as ``commprof analyze`` reports it (``exposed_ns``)."""
    measured_comm_ns: int
    """Communication time as ``commprof analyze`` reports it (``comm_ns``)."""
    gradients: StepGradients | None = None
    """The step's per-parameter gradients (read where a new bucket cap is asked for and the
    trace gives them; :mod:`commprof.traces.gradients`)."""

    @property
    def comm_ns(self) -> Int64Array:
        """Measured duration of each collective in the window (ns)."""
        return self.comm_end_ns - self.comm_start_ns


@dataclass(frozen=True, kw_only=True, slots=True)
class Replayed:
    """What one replay of a step gives."""

    step_ns: int
    """Replayed step time: from the window start to the replayed end."""
    exposed_ns: int
    """Replayed communication not covered by replayed compute."""
    comm_ns: int
    """Length of the union of the replayed collectives."""


def _window_collectives(collectives: pd.DataFrame, lo: int, hi: int) -> pd.DataFrame:
    """The collectives running in [lo, hi), clipped to it, by (clipped) start."""
    run = collectives[(collectives["start_ns"] < hi) & (collectives["end_ns"] > lo)]
    out = pd.DataFrame({
        "start_ns": np.maximum(run["start_ns"].to_numpy(np.int64), lo),
        "end_ns": np.minimum(run["end_ns"].to_numpy(np.int64), hi),
        "stream": run["thread"].to_numpy(np.int64),
        "num_bytes": run["num_bytes"].fillna(UNKNOWN).to_numpy(np.int64),
        "group_size": run["group_size"].fillna(UNKNOWN).to_numpy(np.int64),
        "collective_type": run["collective_type"].astype(str).to_numpy(),
    })  # fmt: skip
    out = out[out["end_ns"] > out["start_ns"]]
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)


def step_timelines(
    parsed: ParsedTrace, gradients: dict[int, StepGradients] | None = None
) -> list[StepTimeline]:
    """Every step window of a parsed trace as a replayable timeline.

    Args:
        parsed: One rank's trace (:func:`commprof.traces.trace_parser.parse_trace`).
        gradients: Its steps' gradients by step number (:func:`read_step_gradients`), if read.

    Returns:
        One timeline per step window, in step order; the measured figures are those of
        :func:`commprof.traces.metrics.step_metrics` (``commprof analyze``'s step table).
    """
    metrics = step_metrics(parsed).set_index("step")
    compute = parsed.classes["compute"]
    out = []
    for step, lo, hi in zip(
        parsed.step_ids.tolist(),
        parsed.step_start_ns.tolist(),
        parsed.step_end_ns.tolist(),
        strict=True,
    ):
        busy = clip(compute, lo, hi)
        colls = _window_collectives(parsed.collectives, lo, hi)
        row = metrics.loc[step]
        out.append(
            StepTimeline(
                rank=parsed.rank,
                step=int(step),
                source=parsed.source,
                window_start_ns=int(lo),
                window_end_ns=int(hi),
                compute_start_ns=busy.starts,
                compute_end_ns=busy.ends,
                comm_start_ns=colls["start_ns"].to_numpy(np.int64),
                comm_end_ns=colls["end_ns"].to_numpy(np.int64),
                stream=colls["stream"].to_numpy(np.int64),
                num_bytes=colls["num_bytes"].to_numpy(np.int64),
                group_size=colls["group_size"].to_numpy(np.int64),
                collective_type=tuple(colls["collective_type"].tolist()),
                world_size=parsed.world_size,
                measured_step_ns=int(row["window_ns"]),
                measured_exposed_ns=int(row["exposed_ns"]),
                measured_comm_ns=int(row["comm_ns"]),
                gradients=(gradients or {}).get(int(step)),
            )
        )
    return out


def read_timelines(path: Path | str, *, gradients: bool = False) -> list[StepTimeline]:
    """The step timelines of every rank trace at ``path`` (a trace file, or a folder of them as
    ``commprof analyze`` reads it), rank by rank.

    Args:
        path: A trace file or folder.
        gradients: Also read each step's per-parameter gradients (a second pass over each file).

    Raises:
        ValueError: Where ``path`` holds no trace, or its traces have no communication.
    """
    path = Path(path)
    out = []
    for f in _trace_files(path):
        parsed = parse_trace(f)
        grads = read_step_gradients(f, parsed.rank) if gradients else None
        out.extend(step_timelines(parsed, grads))
    seen: dict[tuple[int, int], int] = {}
    for t in out:  # as commprof analyze: one trace per rank and step range
        if seen.setdefault((t.rank, t.step), id(t)) != id(t):
            raise ValueError(
                f"--trace {path}: rank {t.rank} step {t.step} appears in two traces; keep one "
                "trace per rank and step range"
            )
    if not any(t.comm_start_ns.size for t in out):
        raise ValueError(
            f"--trace {path}: no collective runs in any step window of its trace(s); a replay of "
            "communication needs a trace of distributed training (NCCL kernels, gloo ops)"
        )
    return sorted(out, key=lambda t: (t.rank, t.step))


def _trace_files(path: Path) -> list[Path]:
    from commprof.traces.analyze import trace_files

    files = [path] if path.is_file() else trace_files(path)
    if not files:
        raise ValueError(f"--trace {path}: no *.json or *.json.gz trace files there")
    return files


def _waited_collective(
    ends_sorted: Int64Array, order: npt.NDArray[np.intp], prev_end: int, start: int
) -> int:
    """Index of the collective compute starting at ``start`` waited on (the last one to end in
    (prev_end, start], at most RESUME_GAP_NS before it), else -1."""
    j = int(np.searchsorted(ends_sorted, start, side="right")) - 1
    if j < 0:
        return -1
    end = int(ends_sorted[j])
    if end <= prev_end or start - end > RESUME_GAP_NS:
        return -1
    return int(order[j])


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """New buckets in place of a timeline's own (a new bucket cap, docs/design.md "Trace
    replay"); built by :mod:`commprof.modeling.trace_whatif.buckets`."""

    replaced: npt.NDArray[np.bool_]
    """Which of the timeline's collectives the new buckets replace (the trace's own buckets)."""
    ready_ns: Int64Array
    """Each new bucket's ready time on the trace's clock (its last gradient's), launch order."""
    duration_ns: Int64Array
    """Each new bucket's all-reduce time (ns)."""
    launch_delay_ns: int
    """From a bucket's ready time to the start of its all-reduce on an idle stream (ns)."""
    streams: tuple[int, ...]
    """The streams the new buckets run on: each on the one free first (NCCL's one stream; gloo's
    worker threads, which take the next queued all-reduce when free)."""

    def __post_init__(self) -> None:
        if self.ready_ns.shape != self.duration_ns.shape or not self.streams:
            raise ValueError("a layout needs one ready time and one duration a bucket, a stream")


def _durations(t: StepTimeline, comm_ns: npt.ArrayLike | None) -> Int64Array:
    dur = (
        t.comm_ns if comm_ns is None else np.rint(np.asarray(comm_ns, np.float64)).astype(np.int64)
    )
    if dur.shape != t.comm_start_ns.shape or (dur.size and int(dur.min()) < 0):
        raise ValueError(
            f"comm_ns must hold {t.comm_start_ns.size} durations >= 0, got shape {dur.shape}"
        )
    return dur


def replay(
    timeline: StepTimeline, comm_ns: npt.ArrayLike | None = None, layout: Layout | None = None
) -> Replayed:
    """Replay a step with the measured or new collective durations (module docstring).

    Args:
        timeline: The step.
        comm_ns: New duration of each collective (ns, the order of ``timeline.comm_start_ns``);
            None replays the measured ones (the identity replay).
        layout: New buckets in place of the collectives it replaces: each is ready its
            ``launch_delay_ns`` after its ready point (mapped like a launch point), never before
            the bucket launched before it, and runs on the first of its streams to be free; the
            first compute interval after the replaced collectives' last measured end (DDP's end
            of backward) waits until every new bucket has ended, plus its measured resume delay
            where that was at most ``RESUME_GAP_NS``; a wait of other compute on a replaced
            collective goes with it.

    Returns:
        The replayed step and exposed communication.
    """
    t = timeline
    cs, ce = t.compute_start_ns, t.compute_end_ns
    ms, me = t.comm_start_ns, t.comm_end_ns
    dur = _durations(t, comm_ns)
    lo, m = t.window_start_ns, ms.size
    order = np.argsort(me, kind="stable")
    ends_sorted = me[order]
    empty = np.zeros(0, np.int64)
    replaced = np.zeros(m, bool) if layout is None else np.asarray(layout.replaced, bool)
    bucket_ready = empty if layout is None else layout.ready_ns
    kept = np.flatnonzero(~replaced)
    # what to play, by the point it is placed at: kept collectives (slot j) by measured start,
    # new buckets (slot m + b) by ready time
    keys = np.concatenate([ms[kept], bucket_ready])
    slots = np.concatenate([kept, m + np.arange(bucket_ready.size)])
    sequence = slots[np.argsort(keys, kind="stable")]
    keys = np.sort(keys, kind="stable")
    new_cs, new_ce = np.empty_like(cs), np.empty_like(ce)
    new_s = np.zeros(m + bucket_ready.size, np.int64)
    new_e, ready = np.zeros_like(new_s), np.zeros_like(new_s)
    last_on: dict[int, int] = {}
    prev_bucket_ready = lo
    # DDP's end of backward: the first compute after the trace's last bucket ended waits on them
    last_own = int(me[replaced].max()) if replaced.any() else -1
    after = np.flatnonzero(cs >= last_own) if replaced.any() else np.zeros(0, np.intp)
    finalize = int(after[0]) if after.size else -1
    i = q = 0
    while i < cs.size or q < sequence.size:
        if i < cs.size and (q >= sequence.size or cs[i] <= keys[q]):
            prev_end, prev_new = (int(ce[i - 1]), int(new_ce[i - 1])) if i else (lo, lo)
            start = int(cs[i])
            c = _waited_collective(ends_sorted, order, prev_end, start)
            if c >= 0 and replaced[c]:  # a wait on one of the trace's buckets goes with it
                c = -1
            if c >= 0:
                new_cs[i] = max(prev_new, int(new_e[c]) + start - int(me[c]))
            else:
                new_cs[i] = prev_new + start - prev_end
            if i == finalize and bucket_ready.size:
                resume, done = start - last_own, int(new_e[m:].max())
                if resume <= RESUME_GAP_NS:  # it waited on the buckets: now on the new ones
                    new_cs[i] = max(prev_new, done + resume)
                else:  # it started later than the wait asked: never before the new buckets end
                    new_cs[i] = max(int(new_cs[i]), done)
            new_ce[i] = new_cs[i] + int(ce[i]) - start
            i += 1
            continue
        slot, point = int(sequence[q]), int(keys[q])
        q += 1
        if i:  # the compute interval it was launched in or after
            k = i - 1
            inside = point < int(ce[k])
            mapped = new_cs[k] + point - cs[k] if inside else new_ce[k] + point - ce[k]
        else:
            mapped = point
        if slot >= m:  # a new bucket
            assert layout is not None
            ready[slot] = max(int(mapped) + layout.launch_delay_ns, prev_bucket_ready)
            prev_bucket_ready = int(ready[slot])
            free = {
                s: (lo if last_on.get(s) is None else int(new_e[last_on[s]]))
                for s in layout.streams
            }
            stream = min(layout.streams, key=lambda s: (free[s], s))
            new_s[slot] = max(int(ready[slot]), free[stream])
            new_e[slot] = new_s[slot] + int(layout.duration_ns[slot - m])
            last_on[stream] = slot
            continue
        ready[slot] = mapped
        stream = int(t.stream[slot])
        p = last_on.get(stream)
        if p is None:
            new_s[slot] = ready[slot]
        elif p < m and point - int(me[p]) <= QUEUED_GAP_NS:
            ready[slot] = ready[p]
            new_s[slot] = max(int(ready[p]), int(new_e[p]) + point - int(me[p]))
        else:
            new_s[slot] = max(int(ready[slot]), int(new_e[p]))
        new_e[slot] = new_s[slot] + dur[slot]
        last_on[stream] = slot
    played = np.concatenate([kept, m + np.arange(bucket_ready.size)])
    ends = [int(x.max()) for x in (ce, me) if x.size]
    new_ends = [int(x.max()) for x in (new_ce, new_e[played]) if x.size]
    tail = t.window_end_ns - max(ends, default=lo)
    end = max(new_ends, default=lo) + tail
    comm = IntervalSet.from_arrays(new_s[played], new_e[played])
    compute = IntervalSet.from_arrays(new_cs, new_ce)
    return Replayed(
        step_ns=end - lo,
        exposed_ns=total_length(difference(comm, compute)),
        comm_ns=total_length(comm),
    )
