"""A new bucket cap on a real trace (``commprof estimate --trace DIR --bucket-cap-mb MB``).

From a step's gradients (:mod:`commprof.traces.gradients`: bytes, device ready times and the
trace's own bucket launches, in the order they were written) this module

1. finds the trace's own buckets: the gradients written between two launches on the backward's
   thread, each matched to the step's all-reduces in start order (checked against the sizes
   where the trace gives them), and checks they follow DDP's rule (a bucket closes once it
   holds at least the cap; :func:`own_cap_range`);
2. lays the same gradients out in DDP's buckets at the new cap
   (:func:`commprof.modeling.buckets.assign_buckets_by_size`, the reducer's greedy, in the order
   the trace wrote them);
3. gives each new bucket its ready time (its last gradient's on the device), the trace's launch
   delay (median over its own buckets that did not queue: all-reduce start minus ready time)
   and an all-reduce time: ``alpha + bytes * beta`` fitted on the trace's own buckets by least
   squares (:func:`fit_bucket_cost`), or the what-if's collective model with ``--cluster`` /
   ``--interconnect``.

The replay (:func:`commprof.modeling.trace_whatif.replay.replay` with a
:class:`~commprof.modeling.trace_whatif.replay.Layout`) then plays the new buckets in place of the
trace's.
docs/design.md, "Trace replay".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from commprof.modeling.buckets import MIB, assign_buckets_by_size, bucket_cap_bytes
from commprof.modeling.collective.cost_model import nonnegative_line

if TYPE_CHECKING:  # types only (the replay needs none of this module)
    from commprof.modeling.trace_whatif.replay import Layout, StepTimeline

QUEUED_GAP_NS = 10_000
"""A bucket whose all-reduce started at most this long after the previous one on its stream
ended was queued behind it: its start says nothing of its launch delay. The replay's own
``step_replay.QUEUED_GAP_NS`` (the trace layer, which this layer does not import; a test holds
the two equal)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OwnBuckets:
    """The trace's own buckets in one step, in launch order."""

    members: tuple[npt.NDArray[np.intp], ...]
    """Indices of each bucket's gradients (the step's ``StepGradients`` order)."""
    collective: npt.NDArray[np.intp]
    """Index of each bucket's all-reduce among the timeline's collectives."""
    num_bytes: npt.NDArray[np.int64]
    """Each bucket's bytes (its gradients' sum)."""
    ready_ns: npt.NDArray[np.int64]
    """Each bucket's ready time (its gradients' latest device ready time)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BucketCost:
    """All-reduce time of a bucket: ``alpha_ns + num_bytes * ns_per_byte``."""

    alpha_ns: float
    ns_per_byte: float
    num_points: int
    """Buckets it was fitted on."""
    mape_pct: float
    """Its mean absolute error on them (%)."""

    def __call__(self, num_bytes: npt.ArrayLike) -> npt.NDArray[np.float64]:
        return self.alpha_ns + np.asarray(num_bytes, np.float64) * self.ns_per_byte

    def describe(self) -> str:
        size = f"bytes / {1.0 / self.ns_per_byte:.3g} GB/s" if self.ns_per_byte > 0 else "0 a byte"
        return (
            f"alpha {self.alpha_ns / 1e3:.1f} us + {size}, fitted on the "
            f"trace's own {self.num_points} bucket all-reduce(s) (in-sample MAPE "
            f"{self.mape_pct:.1f} %)"
        )


def _where(t: StepTimeline) -> str:
    return f"rank {t.rank} step {t.step} ({t.source})"


def own_buckets(t: StepTimeline) -> OwnBuckets:
    """The trace's own buckets in step ``t`` (module docstring, 1).

    Raises:
        ValueError: Naming the rank and step, where the step has no gradients, a gradient was
            written after the last launch, a launch follows no gradient, the step has fewer
            all-reduces than launches, or a bucket's gradients do not sum to its all-reduce's
            size.
    """
    g = t.gradients
    if g is None:
        raise ValueError(f"{_where(t)}: no gradient sizes with a bucket launch in this step")
    if g.unsized:
        raise ValueError(
            f"{_where(t)}: {len(g.unsized)} gradient(s) of the backward's thread give no usable "
            f"size (the first: {g.unsized[0]}); a new cap needs every gradient's bytes: record "
            "with record_shapes=True (a dtype commprof does not know: traces.gradients.DTYPE_BYTES)"
        )
    which = g.trace_bucket
    n = int(g.launch_ns.size)
    late = int((which >= n).sum())
    if late:
        raise ValueError(
            f"{_where(t)}: {late} gradient(s) written after the step's last bucket launch; not "
            "every gradient of this step is in one of DDP's buckets (parameters outside DDP, or "
            "more than one DDP module), so its buckets cannot be laid out again"
        )
    members = tuple(np.flatnonzero(which == k) for k in range(n))
    if any(not m.size for m in members):
        raise ValueError(f"{_where(t)}: a bucket launch with no gradient written before it")
    colls = np.flatnonzero(
        np.array([c == "all_reduce" for c in t.collective_type], bool)
        & (t.comm_start_ns >= g.launch_ns[0])
    )
    if colls.size < n:
        raise ValueError(
            f"{_where(t)}: {n} bucket launches but {colls.size} all-reduce(s) started after "
            "the first one in the step's window (a GPU that runs a step or more behind its CPU "
            "puts a step's buckets in a later window, which a new cap is not laid out over)"
        )
    sizes = np.array([int(g.num_bytes[m].sum()) for m in members], np.int64)
    colls = _match(colls, t.num_bytes[colls], sizes)
    known = t.num_bytes[colls]
    off = np.flatnonzero((known >= 0) & (known != sizes))
    if off.size:
        k = int(off[0])
        raise ValueError(
            f"{_where(t)}: bucket {k}'s all-reduce carries {int(known[k])} bytes, the gradients "
            f"written before its launch {int(sizes[k])}; the trace's launches and gradients do "
            "not line up as DDP's buckets"
        )
    # DDP launches buckets in order: none is ready before the one launched before it
    ready = np.maximum.accumulate(np.array([int(g.ready_ns[m].max()) for m in members], np.int64))
    return OwnBuckets(members=members, collective=colls, num_bytes=sizes, ready_ns=ready)


def _match(
    colls: npt.NDArray[np.intp], sizes: npt.NDArray[np.int64], wanted: npt.NDArray[np.int64]
) -> npt.NDArray[np.intp]:
    """Each bucket's all-reduce: where every candidate gives its size, the first unused one of
    the bucket's size (gloo's worker threads can start a later bucket first); else the
    candidates in start order."""
    if (sizes < 0).any():
        return colls[: wanted.size]
    used = np.zeros(colls.size, bool)
    out = []
    for size in wanted.tolist():
        free = np.flatnonzero(~used & (sizes == size))
        pick = int(free[0]) if free.size else int(np.flatnonzero(~used)[0])
        used[pick] = True
        out.append(colls[pick])
    return np.array(out, np.intp)


def own_cap_range(t: StepTimeline, own: OwnBuckets) -> tuple[float, float]:
    """The caps (MiB, ``(low, high]``) for which DDP's rule gives the trace's own buckets: a
    bucket after the first closes once it holds at least the cap, so ``size - last gradient <
    cap <= size`` for every bucket but the first (whose cap is DDP's first-bucket cap) and the
    last (which only needs ``size - last < cap``). ``(low, inf)`` where that leaves the cap
    open above.

    Raises:
        ValueError: Where no cap gives them (naming the buckets that disagree).
    """
    assert t.gradients is not None
    b = t.gradients.num_bytes
    n = len(own.members)
    low = max((int(own.num_bytes[k] - b[own.members[k][-1]]) for k in range(1, n)), default=0)
    high = min((int(own.num_bytes[k]) for k in range(1, n - 1)), default=None)
    if high is not None and not low < high:
        mib = ", ".join(f"{x / MIB:.3f}" for x in own.num_bytes)
        raise ValueError(
            f"{_where(t)}: its buckets ({mib} MiB, in launch order) follow DDP's rule for no "
            "cap (a bucket after the first holds at least the cap and closes at the gradient "
            "that reaches it); they are not one DDP module's buckets"
        )
    return low / MIB, (float("inf") if high is None else high / MIB)


def launch_delays(t: StepTimeline, own: OwnBuckets) -> list[int]:
    """All-reduce start minus ready time of each own bucket that did not queue behind the
    collective before it on its stream (one that started at most ``QUEUED_GAP_NS`` after that
    one ended), ns."""
    out = []
    for k, c in enumerate(own.collective.tolist()):
        stream, start = t.stream[c], int(t.comm_start_ns[c])
        before = np.flatnonzero((t.stream == stream) & (t.comm_start_ns < start))
        if before.size:
            gap = start - int(t.comm_end_ns[before].max())
            if 0 <= gap <= QUEUED_GAP_NS:
                continue
        out.append(start - int(own.ready_ns[k]))
    return out


def fit_bucket_cost(num_bytes: Sequence[int], duration_ns: Sequence[int]) -> BucketCost:
    """``alpha + bytes * beta`` by least squares over the trace's own buckets, kept >= 0 as
    ``step_model.hook_fit`` keeps its line (``cost_model.nonnegative_line``): a slope <= 0
    (time does not grow with size here) gives the median time as a constant, a negative
    intercept a line through the origin.

    Raises:
        ValueError: With fewer than two sizes 5 % apart, where the trace cannot tell latency
            from bandwidth.
    """
    x = np.asarray(num_bytes, np.float64)
    y = np.asarray(duration_ns, np.float64)
    if x.size < 2 or x.max() < 1.05 * x.min():
        raise ValueError(
            f"--bucket-cap-mb on this trace: its {x.size} bucket all-reduce(s) have no two "
            "sizes 5 % apart, so their time cannot be split into latency and bandwidth; give "
            "--cluster NAME|FILE or --interconnect NAME for the new buckets' time"
        )
    alpha, beta = nonnegative_line(x, y)
    fitted = alpha + beta * x
    mape = float(np.mean(np.abs(fitted - y) / y) * 100.0)
    return BucketCost(
        alpha_ns=float(alpha), ns_per_byte=float(beta), num_points=int(x.size), mape_pct=mape
    )


def new_layout(
    t: StepTimeline,
    own: OwnBuckets,
    bucket_cap_mb: float | None,
    cost: Callable[[npt.NDArray[np.int64]], npt.ArrayLike],
    launch_delay_ns: int,
    layout: Callable[..., Layout],
) -> tuple[Layout, int]:
    """DDP's buckets at ``bucket_cap_mb`` over the step's gradients (module docstring, 2 and 3).

    Args:
        t: The step (with its gradients).
        own: Its own buckets (:func:`own_buckets`).
        bucket_cap_mb: The new cap (MiB); None is DDP's default (25 MiB, the first 1 MiB).
        cost: All-reduce time (ns) of buckets of the given bytes.
        launch_delay_ns: From ready to start on an idle stream.
        layout: The trace layer's ``Layout`` (handed in: docs/design.md, Layers).

    Returns:
        The layout and its number of buckets.
    """
    g = t.gradients
    assert g is not None
    first, cap = bucket_cap_bytes(bucket_cap_mb)
    keep = np.concatenate(own.members)
    groups = assign_buckets_by_size(
        g.num_bytes[keep].tolist(), [first, cap], group_keys=[g.dtype[i] for i in keep]
    )
    sizes = np.array([int(g.num_bytes[keep[idx]].sum()) for idx, _ in groups], np.int64)
    ready = np.maximum.accumulate(
        np.array([int(g.ready_ns[keep[idx]].max()) for idx, _ in groups], np.int64)
    )  # launched in order
    durations = np.rint(np.asarray(cost(sizes), np.float64)).astype(np.int64)
    return _in_place_of(t, own, ready, durations, launch_delay_ns, layout), len(groups)


def _in_place_of(
    t: StepTimeline,
    own: OwnBuckets,
    ready_ns: npt.NDArray[np.int64],
    duration_ns: npt.NDArray[np.int64],
    launch_delay_ns: int,
    layout: Callable[..., Layout],
) -> Layout:
    """Buckets in place of the trace's own, on the streams those ran on."""
    replaced = np.zeros(t.comm_start_ns.size, bool)
    replaced[own.collective] = True
    return layout(
        replaced=replaced,
        ready_ns=ready_ns,
        duration_ns=duration_ns,
        launch_delay_ns=int(launch_delay_ns),
        streams=tuple(sorted(set(t.stream[own.collective].tolist()))),
    )


def own_layout(
    t: StepTimeline, own: OwnBuckets, launch_delay_ns: int, layout: Callable[..., Layout]
) -> Layout:
    """The trace's own buckets as a layout, with their measured times: its replay checks the
    layout rules against the trace (the in-sample line of the report)."""
    durations = t.comm_ns[own.collective]
    return _in_place_of(t, own, own.ready_ns, durations, launch_delay_ns, layout)
