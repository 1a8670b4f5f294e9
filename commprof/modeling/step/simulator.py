"""A DDP training step played forward: backward compute, bucket all-reduces and their interference.

The simulator is a pure function (:func:`simulate_step`). Its inputs are in *idle* units: the
backward compute work (ns the compute would take with no communication running) after which
each bucket's gradients are ready, and each bucket's all-reduce time on an idle link (a
calibrated ring fit, ``commprof.modeling.collective.ring_fit``). It plays the step forward as DDP
and
the backend run it:

* Bucket k's hook is entered once the compute has done ``ready_work_ns[k]`` of work and every
  earlier bucket has been handed over (DDP launches buckets in index order). The hook itself
  costs ``launch_overhead_ns`` of the training thread (the enqueue; ``launch_ns - ready_ns`` in
  the ``buckets`` table), during which backward compute does not progress; then the bucket
  joins the backend's queue.
* The backend serves the queue in order on ``num_channels`` channels: NCCL runs one stream
  (1); ``ProcessGroupGloo`` has two worker threads by default (``Options.threads = 2``), so two
  buckets may be in flight at once. Buckets in flight share the link equally (processor
  sharing): on loopback or one NIC two gloo threads do not double the bandwidth.
* Interference (:class:`Interference`, measured by the microbenchmark's interference arms):
  while compute runs, a transfer of ``n`` bytes progresses ``comm_factor(n)`` times slower;
  while any transfer runs, compute progresses ``compute_factor(n)`` times slower (``n`` the
  largest bucket in flight).
* Backward ends (``backward()`` returns) when the compute is done and every bucket is reduced.

Outputs (:class:`StepPrediction`): the step time ``forward + backward + optimizer + other``,
and communication by the timing hook's definitions (``analysis.breakdown``, docs/design.md), so
that a prediction reads as the measurement it is compared with: a bucket's communication runs
from its hook entry (``ready``) to its all-reduce's end, compute ends at the last hook entry
``R``; ``comm_busy = |union of [ready_k, end_k)|``, ``exposed = max(0, max_k end_k - R)``,
overlap efficiency ``(comm_busy - exposed) / comm_busy``. One bucket is entered when every
gradient is ready, so its overlap is 0, as the hook measures it. Every bucket's ready, start
and end are given.

This follows the structure of the simulators that predict training well (Echo, arXiv
2412.12487: a slowdown model of overlapped kernels; Lumos, MLSys 2025: replaying a measured
compute timeline), reduced to what a DDP step needs. This module imports no torch and no ray.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

BACKEND_CHANNELS: dict[str, int] = {"gloo": 2, "nccl": 1}
"""Collectives a backend runs at once: gloo's worker threads (``ProcessGroupGloo::Options``
default 2), NCCL's one communication stream."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Interference:
    """Slowdown factors of overlapped communication and compute, per message size.

    Between measured sizes a factor is interpolated linearly in log2(size); outside them the
    nearest measured factor holds.
    """

    sizes_bytes: tuple[float, ...]
    """Measured message sizes, increasing."""
    comm_slowdown: tuple[float, ...]
    """All-reduce time under compute / alone, per size (>= 0; 1 is no slowdown)."""
    compute_slowdown: tuple[float, ...]
    """Compute time under a concurrent all-reduce / alone, per size."""
    comm_spread: tuple[float, ...] = ()
    """Optional half-width (same units as the factor) of each comm factor's uncertainty."""
    compute_spread: tuple[float, ...] = ()
    """Optional half-width of each compute factor's uncertainty."""

    def __post_init__(self) -> None:
        n = len(self.sizes_bytes)
        if n == 0 or len(self.comm_slowdown) != n or len(self.compute_slowdown) != n:
            raise ValueError(
                "Interference needs one comm and one compute slowdown per size, got "
                f"{n} sizes, {len(self.comm_slowdown)} comm, {len(self.compute_slowdown)} compute"
            )
        if any(b <= a for a, b in zip(self.sizes_bytes, self.sizes_bytes[1:], strict=False)):
            raise ValueError(f"Interference sizes_bytes must increase, got {self.sizes_bytes}")
        for name in ("comm_slowdown", "compute_slowdown"):
            bad = [f for f in getattr(self, name) if not (math.isfinite(f) and f > 0)]
            if bad:
                raise ValueError(f"Interference {name} must be finite and > 0, got {bad}")
        for name in ("comm_spread", "compute_spread"):
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise ValueError(f"Interference {name} needs {n} entries or none")

    def _at(self, values: Sequence[float], num_bytes: float) -> float:
        x = np.log2(np.asarray(self.sizes_bytes, dtype=np.float64))
        return float(np.interp(np.log2(max(float(num_bytes), 1.0)), x, np.asarray(values)))

    def comm_factor(self, num_bytes: float) -> float:
        """Slowdown of an all-reduce of ``num_bytes`` while compute runs."""
        return self._at(self.comm_slowdown, num_bytes)

    def compute_factor(self, num_bytes: float) -> float:
        """Slowdown of compute while an all-reduce of ``num_bytes`` runs."""
        return self._at(self.compute_slowdown, num_bytes)

    def shifted(self, sign: float) -> Interference:
        """Factors moved by ``sign`` times their spread (floored at 1e-3; no spread: same)."""
        zeros = (0.0,) * len(self.sizes_bytes)
        comm = self.comm_spread or zeros
        comp = self.compute_spread or zeros
        return Interference(
            sizes_bytes=self.sizes_bytes,
            comm_slowdown=tuple(
                max(1e-3, f + sign * s) for f, s in zip(self.comm_slowdown, comm, strict=True)
            ),
            compute_slowdown=tuple(
                max(1e-3, f + sign * s) for f, s in zip(self.compute_slowdown, comp, strict=True)
            ),
        )


NO_INTERFERENCE = Interference(sizes_bytes=(1.0,), comm_slowdown=(1.0,), compute_slowdown=(1.0,))
"""Overlap costs nothing: the model the idle ring estimate assumes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BucketTiming:
    """One bucket on the simulated step (ns from backward start)."""

    index: int
    """Launch order."""
    num_bytes: int
    """Gradient bytes."""
    ready_ns: float
    """Hook entry: its gradients are ready and earlier buckets are handed over."""
    start_ns: float
    """Its all-reduce starts being served."""
    end_ns: float
    """Its all-reduce is complete."""
    service_ns: float
    """Its all-reduce time on an idle link (the input)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepPrediction:
    """The simulated step."""

    step_ns: float
    """forward + backward + optimizer + other."""
    backward_ns: float
    """Backward start to the end of the last all-reduce or of compute, whichever is later."""
    compute_end_ns: float
    """When backward compute (and the last hook) ended, interference included."""
    exposed_ns: float
    """Communication after the last hook entry (the hook's compute end): ``max(0, last end -
    last ready)``."""
    comm_busy_ns: float
    """Communication as the hook measures it: ``|union of [ready_k, end_k)|``."""
    overlap_efficiency: float
    """(comm_busy - exposed) / comm_busy; NaN without communication."""
    host_residual_ns: float = 0.0
    """Of ``step_ns``: the calibrated host residual (``step_model.predict_step``); 0 as
    simulated."""
    exposed_residual_ns: float = 0.0
    """Of ``exposed_ns``: the calibrated exposed residual as applied
    (``step_model.with_exposed_residual``); 0 as simulated."""
    buckets: tuple[BucketTiming, ...] = field(default=())
    """Per-bucket timeline."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (NaN efficiency as None)."""
        out = asdict(self)
        if not math.isfinite(self.overlap_efficiency):
            out["overlap_efficiency"] = None
        return out


def _check(
    ready_work_ns: Sequence[float], service_ns: Sequence[float], nbytes: Sequence[int]
) -> None:
    if not (len(ready_work_ns) == len(service_ns) == len(nbytes)):
        raise ValueError(
            f"ready_work_ns ({len(ready_work_ns)}), service_ns ({len(service_ns)}) and "
            f"num_bytes ({len(nbytes)}) need one entry per bucket"
        )
    for name, values in (("ready_work_ns", ready_work_ns), ("service_ns", service_ns)):
        bad = [v for v in values if not (math.isfinite(float(v)) and float(v) >= 0)]
        if bad:
            raise ValueError(f"{name} must be finite and >= 0, got {bad[:3]}")


def simulate_step(
    *,
    ready_work_ns: Sequence[float],
    service_ns: Sequence[float],
    num_bytes: Sequence[int],
    compute_work_ns: float | None = None,
    num_channels: int = 1,
    interference: Interference = NO_INTERFERENCE,
    launch_overhead_ns: float | Sequence[float] = 0.0,
    forward_ns: float = 0.0,
    optimizer_ns: float = 0.0,
    other_ns: float = 0.0,
) -> StepPrediction:
    """Play one DDP step forward (module docstring).

    Args:
        ready_work_ns: Per bucket, in launch order: backward compute work (idle ns from
            backward start) after which its gradients are ready.
        service_ns: Per bucket: its all-reduce time on an idle link.
        num_bytes: Per bucket: its bytes (selects the interference factors).
        compute_work_ns: Total backward compute work, hooks excluded; default the last ready
            work (the last bucket's gradients are the last ones autograd produces).
        num_channels: Collectives the backend runs at once (:data:`BACKEND_CHANNELS`).
        interference: Slowdown factors; :data:`NO_INTERFERENCE` for none.
        launch_overhead_ns: Training-thread time of each hook (one for all, or one per
            bucket): the enqueue, and for PyTorch's ``allreduce_hook`` the division of the
            bucket by the world size, which grows with the bucket's bytes.
        forward_ns: Forward time, added to the step.
        optimizer_ns: Optimizer time, added to the step.
        other_ns: Anything else in the step (added as is).

    Returns:
        The prediction.
    """
    _check(ready_work_ns, service_ns, num_bytes)
    if num_channels < 1:
        raise ValueError(f"num_channels must be >= 1, got {num_channels}")
    nb = len(service_ns)
    hooks = np.broadcast_to(np.asarray(launch_overhead_ns, dtype=np.float64), (nb,))
    if np.any(hooks < 0) or not np.all(np.isfinite(hooks)):
        raise ValueError(f"launch_overhead_ns must be finite and >= 0, got {launch_overhead_ns}")
    work = np.maximum.accumulate(np.asarray(ready_work_ns, dtype=np.float64)) if nb else np.zeros(0)
    total = float(work[-1]) if nb else 0.0
    if compute_work_ns is not None:
        if compute_work_ns < total:
            raise ValueError(
                f"compute_work_ns ({compute_work_ns}) is less than the last ready work ({total})"
            )
        total = float(compute_work_ns)
    # Compute-thread milestones: bucket k's hook is entered once work[k] and the earlier hooks
    # are done, and hands the bucket over after its own hook time; compute ends after both.
    before = np.concatenate([[0.0], np.cumsum(hooks)])
    milestones: list[tuple[float, int]] = []
    for k in range(nb):
        milestones.append((float(work[k] + before[k]), k))  # hook entered
        milestones.append((float(work[k] + before[k + 1]), nb + k))  # handed over
    milestones.append((total + float(before[-1]), 2 * nb))  # compute ends, after every hook
    timeline = _play(milestones, service_ns, num_bytes, num_channels, interference)
    ready, start, end, compute_end = timeline
    comm_end = max(end) if nb else 0.0
    exposed = max(0.0, comm_end - ready[-1]) if nb else 0.0
    busy = hook_comm_ns(ready, end)
    backward = max(compute_end, comm_end)
    return StepPrediction(
        step_ns=forward_ns + backward + optimizer_ns + other_ns,
        backward_ns=backward,
        compute_end_ns=compute_end,
        exposed_ns=exposed,
        comm_busy_ns=busy,
        # clamped: exposed is part of busy, equal up to float rounding where nothing overlaps
        overlap_efficiency=min(1.0, max(0.0, busy - exposed) / busy) if busy > 0 else math.nan,
        buckets=tuple(
            BucketTiming(
                index=k,
                num_bytes=int(num_bytes[k]),
                ready_ns=ready[k],
                start_ns=start[k],
                end_ns=end[k],
                service_ns=float(service_ns[k]),
            )
            for k in range(nb)
        ),
    )


def hook_comm_ns(ready_ns: Sequence[float], end_ns: Sequence[float]) -> float:
    """``|union of [ready_k, end_k)|``: the timing hook's communication time of a step."""
    if not len(ready_ns):
        return 0.0
    order = np.argsort(np.asarray(ready_ns, dtype=np.float64), kind="stable")
    starts = np.asarray(ready_ns, dtype=np.float64)[order]
    ends = np.asarray(end_ns, dtype=np.float64)[order]
    # Sorted by start, interval i adds what reaches past the largest end before it (as
    # analysis.breakdown.union_length does per step).
    before = np.concatenate([[-np.inf], np.maximum.accumulate(ends)[:-1]])
    return float(np.clip(ends - np.maximum(starts, before), 0.0, None).sum())


def _play(
    milestones: list[tuple[float, int]],
    service_ns: Sequence[float],
    num_bytes: Sequence[int],
    num_channels: int,
    interference: Interference,
) -> tuple[list[float], list[float], list[float], float]:
    """The event loop: (ready, start, end per bucket, compute end).

    ``milestones`` are (compute work, event) in order: event k < nb is bucket k's hook entry,
    nb + k its hand-over to the backend, 2 nb the end of compute.
    """
    nb = len(service_ns)
    ready, start, end = [math.nan] * nb, [math.nan] * nb, [math.nan] * nb
    remaining = [float(s) for s in service_ns]
    queue: list[int] = []
    active: list[int] = []
    t, w, compute_end = 0.0, 0.0, math.nan
    pos = 0
    # Each turn: the rates of compute and of every transfer in flight are constant until the
    # next event (a milestone of compute or a transfer's end); advance to it.
    while pos < len(milestones) or queue or active:
        while queue and len(active) < num_channels:
            k = queue.pop(0)
            active.append(k)
            start[k] = t
        computing = pos < len(milestones)
        largest = max((num_bytes[k] for k in active), default=0)
        compute_rate = 1.0 / interference.compute_factor(largest) if active else 1.0
        share = 1.0 / len(active) if active else 0.0
        rates = {
            k: share / (interference.comm_factor(num_bytes[k]) if computing else 1.0)
            for k in active
        }
        dt, hits_milestone = math.inf, False
        if computing:
            dt, hits_milestone = (milestones[pos][0] - w) / compute_rate, True
        for k, rate in rates.items():
            if remaining[k] / rate < dt:
                dt, hits_milestone = remaining[k] / rate, False
        assert math.isfinite(dt), "simulation stalled"  # internal invariant
        t += dt
        for k, rate in rates.items():
            remaining[k] -= dt * rate
        for k in [k for k in active if remaining[k] <= 1e-9 * max(1.0, float(service_ns[k]))]:
            active.remove(k)
            end[k] = t
        if not computing:
            continue
        w = milestones[pos][0] if hits_milestone else w + dt * compute_rate
        while pos < len(milestones) and milestones[pos][0] <= w:
            event = milestones[pos][1]
            if event < nb:
                ready[event] = t
            elif event < 2 * nb:
                queue.append(event - nb)
            else:
                compute_end = t
            pos += 1
    return ready, start, end, (t if math.isnan(compute_end) else compute_end)
