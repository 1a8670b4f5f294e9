"""What-ifs on a real trace's replayed steps: another link, world size or bucket cap.

The step timelines and their replay are :mod:`commprof.modeling.trace_whatif.replay`; this module
holds the what-if: the collective model that gives the new durations, a new cap's buckets, and
the report. ``commprof estimate --trace DIR`` (:mod:`commprof.commands.estimate_trace`) turns
its flags into a :class:`WhatIf` and prints the report.

What-if durations (docs/design.md, "Trace replay"): each all-reduce whose size the trace gives
takes the collective model's predicted time on the what-if's link and world size
(``--cluster``: :class:`~commprof.modeling.collective.cluster_link.ClusterLink`, NCCL's own tuning
model;
``--interconnect``: the Hockney model of ``cost_model`` on one published link), used directly,
not as a ratio to the trace's own: a Kineto trace names the GPU, not the fabric between the
ranks, so a ratio would divide by a prediction for a guessed link. The measured time of an
NCCL kernel also holds the wait for the slowest peer, which a prediction leaves out; the report
shows the measured and the predicted time of the same collectives side by side. Collectives of
other types (all_to_all, send/recv, ...) and those without a size keep their measured time, and
the report counts them.

``--bucket-cap-mb`` lays DDP's buckets out again over the trace's own gradients
(:mod:`commprof.modeling.trace_whatif.buckets`) where it was recorded with ``record_shapes=True``; a
trace without per-parameter gradient sizes, or whose all-reduces are not one DDP module's
buckets, is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from commprof.modeling.collective.link import Link
from commprof.modeling.prediction import Assumption
from commprof.modeling.trace_whatif.buckets import (
    OwnBuckets,
    fit_bucket_cost,
    launch_delays,
    new_layout,
    own_buckets,
    own_cap_range,
    own_layout,
)
from commprof.units import finite_or_none

if TYPE_CHECKING:  # types only (the replay needs none of this module)
    from commprof.modeling.trace_whatif.replay import Layout, Replayed, StepTimeline

PREDICTED_TYPES = ("all_reduce",)
"""Collective types the what-if predicts; the others keep their measured time."""
NS_PER_MS = 1e6
SOURCE = "commprof.modeling.trace_whatif.replay.replay (docs/design.md, Trace replay)"
"""Where the replay's rules are written down (printed with the assumptions)."""

BUCKET_CAP_REFUSAL = (
    "--bucket-cap-mb with --trace: the trace lacks per-parameter gradient sizes with bucket "
    "launches (a DDP trace records each bucket's all-reduce, not the gradients in it; "
    "AccumulateGrad's 'Input Dims' and 'Input type', which a trace recorded with "
    "record_shapes=True carries, are absent or empty here, or no c10d::allreduce_ launches a "
    "bucket), so a new cap cannot be laid out from it; record with "
    "torch.profiler.profile(record_shapes=True), or give the parameters with --model NAME or "
    "--params-file FILE (commprof estimate without --trace)"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class CapWhatIf:
    """A new bucket cap on the trace's steps (:mod:`commprof.modeling.trace_whatif.buckets`)."""

    bucket_cap_mb: float | None
    """The new cap (MiB); None is DDP's default."""
    own: dict[tuple[int, int], OwnBuckets]
    """The trace's own buckets by (rank, step)."""
    cap_range_mb: tuple[float, float]
    """The caps ``(low, high]`` (MiB) for which DDP's rule gives the trace's own buckets."""
    launch_delay_ns: int
    """Median from ready to start of the trace's buckets that did not queue."""
    cost: Callable[[npt.NDArray[np.int64]], npt.ArrayLike]
    """All-reduce time (ns) of a new bucket of given bytes."""
    cost_label: str
    """Where that time comes from."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WhatIf:
    """The collective model and scale a what-if replays the trace on."""

    link: Link
    """Any link: published (Hockney model, its algorithm), described cluster (NCCL's model)."""
    label: str
    """Where the link came from, for the report."""
    world_size: int
    """Ranks of the what-if (the trace's own where ``--world-size`` is not given)."""

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(
                f"a what-if on {self.world_size} rank(s): an all-reduce needs >= 2; give "
                "--world-size N (>= 2)"
            )


def predicted_ns(
    collective_type: Sequence[str],
    num_bytes: npt.ArrayLike,
    group_size: npt.ArrayLike,
    *,
    trace_world_size: int | None,
    scenario: WhatIf,
) -> np.ndarray:
    """The what-if's time of each collective (ns), NaN where it keeps its measured time.

    An all-reduce of known size in the trace's world group (its group size unknown or the
    trace's world size) runs on ``scenario.world_size`` ranks; one of a smaller group keeps its
    group's size. Other types and unknown sizes (< 0) are NaN.
    """
    sizes = np.asarray(num_bytes, dtype=np.int64)
    groups = np.asarray(group_size, dtype=np.int64)
    out = np.full(sizes.shape, np.nan)
    kind = np.array([t in PREDICTED_TYPES for t in collective_type], dtype=bool)
    world_group = (groups < 0) | (groups == (trace_world_size or -2))
    ranks = np.where(world_group, scenario.world_size, groups)
    for p in np.unique(ranks[kind & (sizes >= 0)]).tolist():
        sel = kind & (sizes >= 0) & (ranks == p)
        out[sel] = scenario.link.predict_ns(sizes[sel], p)
    return out


def _pct(new: float, old: float) -> float | None:
    """The change in percent; None (JSON null) where the old value is 0 and the new is not."""
    return 100.0 * (new - old) / old if old else (0.0 if new == old else None)


def _pct_text(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def _ms(ns: float) -> str:
    return f"{ns / NS_PER_MS:.3f}"


def replay_report(
    timelines: Sequence[StepTimeline],
    replay: Callable[..., Replayed],
    scenario: WhatIf | None,
    trace_world_size: int | None = None,
    cap: CapWhatIf | None = None,
    layout: Callable[..., Layout] | None = None,
) -> dict[str, Any]:
    """Every step measured, replayed as measured and, with a scenario or a cap, replayed as
    predicted.

    ``trace_world_size``: the trace's own world size (:func:`trace_world_size`); the
    collectives of a group that size move to the scenario's. ``cap``: a new bucket cap
    (:func:`cap_what_if`), with the trace layer's ``Layout`` as ``layout``.

    Returns:
        The JSON document of ``--json``: ``steps`` (one row a rank-step), ``totals`` (sums over
        them) and, with a scenario, ``what_if`` (link, world size, what was predicted).
    """
    rows = []
    num_predicted = num_kept = 0
    kept_types: set[str] = set()
    for t in timelines:
        same = replay(t)
        row: dict[str, Any] = {
            "rank": t.rank, "step": t.step,
            "trace_step_ns": t.measured_step_ns, "replay_step_ns": same.step_ns,
            "step_diff_pct": _pct(same.step_ns, t.measured_step_ns),
            "trace_exposed_ns": t.measured_exposed_ns, "replay_exposed_ns": same.exposed_ns,
            "exposed_diff_pct": _pct(same.exposed_ns, t.measured_exposed_ns),
            "trace_comm_ns": t.measured_comm_ns,
        }  # fmt: skip
        durations, lay = t.comm_ns, None
        own = None if cap is None else cap.own[t.rank, t.step]
        if scenario is not None:
            new = predicted_ns(
                t.collective_type, t.num_bytes, t.group_size,
                trace_world_size=trace_world_size, scenario=scenario,
            )  # fmt: skip
            gone = np.zeros(new.size, bool)  # the trace's buckets give way to the new ones
            if own is not None:
                gone[own.collective] = True
            new[gone] = np.nan
            known = ~np.isnan(new)
            kept = ~known & ~gone
            num_predicted += int(known.sum())
            num_kept += int(kept.sum())
            kept_types |= {c for c, k in zip(t.collective_type, kept, strict=True) if k}
            durations = np.where(known, new, t.comm_ns)
            row |= {
                "predicted_collectives_trace_ns": int(t.comm_ns[known].sum()),
                "predicted_collectives_whatif_ns": int(np.rint(new[known].sum())),
            }  # fmt: skip
        if cap is not None:
            assert layout is not None and own is not None
            mine = replay(t, None, own_layout(t, own, cap.launch_delay_ns, layout))
            lay, num_buckets = new_layout(
                t, own, cap.bucket_cap_mb, cap.cost, cap.launch_delay_ns, layout
            )
            row |= {
                "own_buckets": len(own.members), "whatif_buckets": num_buckets,
                "own_layout_step_ns": mine.step_ns, "own_layout_exposed_ns": mine.exposed_ns,
            }  # fmt: skip
        if scenario is not None or cap is not None:
            moved = replay(t, durations, lay)
            row |= {
                "whatif_step_ns": moved.step_ns, "whatif_exposed_ns": moved.exposed_ns,
                "whatif_comm_ns": moved.comm_ns,
            }  # fmt: skip
        rows.append(row)
    sums = [k for k in rows[0] if k.endswith(("_ns", "_buckets"))] if rows else []
    totals: dict[str, Any] = {k: int(sum(r[k] for r in rows)) for k in sums}
    totals |= {
        "num_steps": len(rows),
        "ranks": sorted({r["rank"] for r in rows}),
        "step_diff_pct": _pct(totals.get("replay_step_ns", 0), totals.get("trace_step_ns", 0)),
        "exposed_diff_pct": _pct(
            totals.get("replay_exposed_ns", 0), totals.get("trace_exposed_ns", 0)
        ),
    }
    doc: dict[str, Any] = {"steps": rows, "totals": totals}
    if scenario is not None:
        if num_predicted == 0 and cap is None:
            raise ValueError(
                "--cluster/--interconnect with --trace: no all-reduce in the trace's steps gives "
                "its size (Kineto writes 'In msg nelems' and 'dtype' in a collective's args, "
                "which this trace lacks), so the collective model has nothing to predict"
            )
        doc["what_if"] = {
            "link": scenario.label, "world_size": scenario.world_size,
            "trace_world_size": trace_world_size,
            "num_predicted": num_predicted, "num_kept_measured": num_kept,
            "kept_types": sorted(kept_types),
        }  # fmt: skip
    if cap is not None:
        doc["bucket_cap"] = {
            "bucket_cap_mb": cap.bucket_cap_mb,
            "own_cap_range_mb": [cap.cap_range_mb[0], finite_or_none(cap.cap_range_mb[1])],
            "launch_delay_ns": cap.launch_delay_ns, "cost": cap.cost_label,
            "own_layout_step_diff_pct": _pct(
                totals["own_layout_step_ns"], totals["trace_step_ns"]
            ),
            "own_layout_exposed_diff_pct": _pct(
                totals["own_layout_exposed_ns"], totals["trace_exposed_ns"]
            ),
        }  # fmt: skip
    return doc


def assumptions(scenario: WhatIf | None, cap: CapWhatIf | None = None) -> tuple[Assumption, ...]:
    """What the replay and the what-ifs assume, each with its source (printed and in the JSON)."""
    out = [
        Assumption(
            name="replay",
            value="compute keeps its measured kernels and gaps, collectives their launch point "
            "relative to compute and their stream order",
            source=f"replay rules: {SOURCE}",
        ),
    ]
    if scenario is not None:
        out += [
            Assumption(
                name="link", value=f"{scenario.label}; {scenario.world_size} ranks",
                source="the what-if (--cluster or --interconnect, --world-size)",
            ),
            Assumption(
                name="collective time",
                value="each all-reduce of known size takes the model's predicted time directly "
                "(the trace names no fabric to scale from); a measured kernel also holds waits "
                "for peers",
                source="the link's model",
            ),
            Assumption(
                name="compute", value="the trace's own: a new world size changes the "
                "collectives only", source="the trace",
            ),
        ]  # fmt: skip
    if cap is not None:
        out += [
            Assumption(
                name="new buckets",
                value="DDP's greedy over the trace's gradients in the order it wrote them (a "
                "bucket closes once it holds the cap; the first holds the first-bucket cap), "
                "each ready when its last gradient was on the device, launched in order, "
                f"{cap.launch_delay_ns / 1e3:.0f} us after ready (the trace's median), on the "
                "trace's bucket streams",
                source="--bucket-cap-mb",
            ),
            Assumption(
                name="new buckets' all-reduce time", value=cap.cost_label,
                source="the what-if's link, else a fit on the trace's own all-reduces",
            ),
            Assumption(
                name="hooks", value="the trace's own: a new cap changes the buckets only (no "
                "change to the time the backward spends in DDP's hooks)", source="the trace",
            ),
        ]  # fmt: skip
    return tuple(out)


def report_text(doc: dict[str, Any], trace: str) -> str:
    """The text report of :func:`replay_report`."""
    tot = doc["totals"]
    lines = [
        f"trace {trace}: {tot['num_steps']} step(s) of rank(s) {tot['ranks']}",
        f"{'rank':>4} {'step':>6} {'step ms':>10} {'replay':>10} {'diff %':>7} "
        f"{'exposed ms':>10} {'replay':>10} {'diff %':>7}",
    ]
    for r in doc["steps"]:
        lines.append(
            f"{r['rank']:>4} {r['step']:>6} {_ms(r['trace_step_ns']):>10} "
            f"{_ms(r['replay_step_ns']):>10} {_pct_text(r['step_diff_pct']):>7} "
            f"{_ms(r['trace_exposed_ns']):>10} {_ms(r['replay_exposed_ns']):>10} "
            f"{_pct_text(r['exposed_diff_pct']):>7}"
        )
    lines.append(
        f"{'all':>11} {_ms(tot['trace_step_ns']):>10} {_ms(tot['replay_step_ns']):>10} "
        f"{_pct_text(tot['step_diff_pct']):>7} {_ms(tot['trace_exposed_ns']):>10} "
        f"{_ms(tot['replay_exposed_ns']):>10} {_pct_text(tot['exposed_diff_pct']):>7}"
    )
    n = tot["num_steps"]
    if "bucket_cap" in doc:
        b = doc["bucket_cap"]
        low, high = b["own_cap_range_mb"]
        cap_text = "DDP's default" if b["bucket_cap_mb"] is None else f"{b['bucket_cap_mb']:g} MiB"
        lines += [
            "",
            f"the trace's own buckets: {tot['own_buckets'] / n:.1f} a step, DDP's rule gives "
            f"them for a cap in ({low:.3g}, {'inf' if high is None else format(high, '.3g')}] MiB",
            f"  laid out again as measured (in-sample): step {_ms(tot['own_layout_step_ns'] / n)} "
            f"ms ({_pct_text(b['own_layout_step_diff_pct'], '+.1f')} % against the trace), "
            f"exposed {_ms(tot['own_layout_exposed_ns'] / n)} ms "
            f"({_pct_text(b['own_layout_exposed_diff_pct'], '+.1f')} %)",
            f"at --bucket-cap-mb {cap_text}: {tot['whatif_buckets'] / n:.1f} bucket(s) a step",
        ]
    if "whatif_step_ns" in tot:
        title = (
            f"what-if on {doc['what_if']['world_size']} ranks (trace: "
            f"{doc['what_if']['trace_world_size']})"
            if "what_if" in doc
            else "what-if"
        )
        lines += [
            "",
            f"{title}: mean a step",
            f"  step     {_ms(tot['trace_step_ns'] / n)} ms -> {_ms(tot['whatif_step_ns'] / n)} ms "
            f"({_pct_text(_pct(tot['whatif_step_ns'], tot['trace_step_ns']), '+.1f')} %)",
            f"  exposed  {_ms(tot['trace_exposed_ns'] / n)} ms -> "
            f"{_ms(tot['whatif_exposed_ns'] / n)} ms",
            f"  comm     {_ms(tot['trace_comm_ns'] / n)} ms -> {_ms(tot['whatif_comm_ns'] / n)} ms",
        ]
    if "what_if" in doc:
        w = doc["what_if"]
        lines.append(
            f"  {w['num_predicted']} all-reduce(s) predicted: "
            f"{_ms(tot['predicted_collectives_trace_ns'] / n)} ms measured -> "
            f"{_ms(tot['predicted_collectives_whatif_ns'] / n)} ms a step",
        )
        if w["num_kept_measured"]:
            lines.append(
                f"  {w['num_kept_measured']} collective(s) keep their measured time (no size, "
                f"or a type the model does not predict: {', '.join(w['kept_types'])})"
            )
    return "\n".join(lines)


def cap_what_if(
    timelines: Sequence[StepTimeline],
    bucket_cap_mb: float | None,
    scenario: WhatIf | None,
    trace_world_size: int | None,
) -> CapWhatIf:
    """The trace's own buckets, their launch delay and the new buckets' cost.

    The cost is the scenario's collective model where there is one; else ``alpha + bytes *
    beta`` fitted on the trace's own buckets, each bucket of a step taken at its shortest time
    over the ranks given (the last rank to arrive waits for no peer; docs/design.md, "Trace
    replay").

    Raises:
        ValueError: ``BUCKET_CAP_REFUSAL`` where no step has gradient sizes; where a step lacks
            them, its buckets do not line up, or no cap gives them under DDP's rule (naming the
            rank and step).
    """
    if not any(t.gradients is not None for t in timelines):
        raise ValueError(BUCKET_CAP_REFUSAL)
    lacking = [f"rank {t.rank} step {t.step}" for t in timelines if t.gradients is None]
    if lacking:
        raise ValueError(
            f"--bucket-cap-mb with --trace: {', '.join(lacking[:4])} hold(s) no gradient sizes "
            "with a bucket launch, where the trace's other steps do; give a trace whose every "
            "step window holds a backward (or the rank files that do)"
        )
    own = {(t.rank, t.step): own_buckets(t) for t in timelines}
    ranges = [own_cap_range(t, own[t.rank, t.step]) for t in timelines]
    low, high = max(r[0] for r in ranges), min(r[1] for r in ranges)
    if not low < high:
        raise ValueError(
            f"--bucket-cap-mb with --trace: the steps' buckets follow DDP's rule for no one cap "
            f"(one needs more than {low:.3f} MiB, another at most {high:.3f} MiB)"
        )
    delays = [d for t in timelines for d in launch_delays(t, own[t.rank, t.step])]
    delay = int(np.median(delays)) if delays else 0
    if scenario is not None:

        def cost(num_bytes: npt.NDArray[np.int64]) -> npt.ArrayLike:
            return predicted_ns(
                ("all_reduce",) * num_bytes.size, num_bytes, np.full(num_bytes.size, -1),
                trace_world_size=trace_world_size, scenario=scenario,
            )  # fmt: skip

        label = f"the what-if link's model ({scenario.label})"
        return CapWhatIf(
            bucket_cap_mb=bucket_cap_mb, own=own, cap_range_mb=(low, high),
            launch_delay_ns=delay, cost=cost, cost_label=label,
        )  # fmt: skip
    shortest: dict[tuple[int, int], tuple[int, int]] = {}
    for t in timelines:
        o = own[t.rank, t.step]
        for k, (size, c) in enumerate(
            zip(o.num_bytes.tolist(), o.collective.tolist(), strict=True)
        ):
            took = int(t.comm_ns[c])
            key = (t.step, k)
            shortest[key] = (size, min(took, shortest.get(key, (size, took))[1]))
    fit = fit_bucket_cost([v[0] for v in shortest.values()], [v[1] for v in shortest.values()])
    return CapWhatIf(
        bucket_cap_mb=bucket_cap_mb, own=own, cap_range_mb=(low, high),
        launch_delay_ns=delay, cost=fit, cost_label=fit.describe(),
    )  # fmt: skip


def trace_world_size(timelines: Sequence[StepTimeline]) -> int | None:
    """The trace's world size: its ``distributedInfo``'s, else the largest process group its
    collectives name (None below 2)."""
    own = next((t.world_size for t in timelines if t.world_size), None)
    if own is None:
        own = max((int(t.group_size.max()) for t in timelines if t.group_size.size), default=-1)
        own = own if own >= 2 else None
    return own
