"""The idle model: DDP's buckets of a parameter list on a link, played on a simple backward.

Pipeline: parameter sizes -> DDP buckets (``buckets.assign_buckets``) -> an all-reduce time per
bucket (the link's prediction: a published link, a calibrated fit or a cluster) -> a simulated
backward timeline -> exposed communication.

Backward timeline (simple per-layer estimate, used unless a measured one is
given): parameter i costs 4 * numel_i * tokens FLOPs of backward (twice the
forward's 2 * numel * tokens; Kaplan et al. 2020, "Scaling laws for neural
language models", section 2.1) at ``device_flops_per_s``; gradients become
ready in reverse registration order, one after another. The timeline is played
by the step simulator (``simulator.simulate_step``) with every correction off,
one channel and no hook time, which reduces to: bucket k launches when its last
gradient is ready AND bucket k-1 has finished (DDP launches in order, and with
one communication stream the all-reduces serialise):

    launch_k = max(ready_k, done_{k-1}),  done_k = launch_k + T_k,
    exposed  = max(0, done_last - backward_end).

``commprof estimate`` without a dataset (:mod:`commprof.commands.estimate`) prints this.
This module imports no torch and no ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from commprof.modeling.buckets import Bucket, ParamSize, assign_buckets
from commprof.modeling.collective.link import Link
from commprof.modeling.step.simulator import simulate_step

DEFAULT_ALPHA_NS = 10_000.0
"""Assumed per-message latency for published links (not a published figure)."""
DEFAULT_DEVICE_FLOPS_PER_S = 100e12
"""Assumed sustained backward FLOP rate of one device (100 TFLOP/s)."""
DEFAULT_BATCH_TOKENS = 8 * 1024
"""Assumed tokens (samples x positions) per rank per step."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BucketEstimate:
    """One bucket on the simulated timeline (times from backward start)."""

    index: int
    """Launch order."""
    num_params: int
    """Parameters in the bucket."""
    num_bytes: int
    """Gradient bytes."""
    ready_ns: int
    """When its last gradient is ready."""
    launch_ns: int
    """When its all-reduce starts."""
    done_ns: int
    """When its all-reduce ends."""
    allreduce_ns: int
    """Predicted all-reduce time."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """Prediction for one configuration."""

    world_size: int
    """Ranks."""
    bucket_cap_mb: float | None
    """DDP cap in MiB (None: DDP default)."""
    link: str
    """Where alpha and beta came from."""
    buckets: tuple[BucketEstimate, ...]
    """Per-bucket timeline."""
    total_comm_ns: int
    """Sum of the all-reduce times."""
    backward_ns: int
    """End of backward compute."""
    exposed_ns: int
    """Communication after backward ends."""

    @property
    def num_buckets(self) -> int:
        """Buckets DDP makes at this cap."""
        return len(self.buckets)

    @property
    def step_ns(self) -> float:
        """What the cap advice minimises here: backward compute and the communication exposed
        after it (forward and optimizer, which this path does not know, are the same at every
        cap)."""
        return float(self.backward_ns + self.exposed_ns)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def backward_ready_ns(
    param_sizes: Sequence[ParamSize],
    *,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    device_flops_per_s: float = DEFAULT_DEVICE_FLOPS_PER_S,
) -> np.ndarray:
    """Per-parameter gradient-ready time in ns from backward start (simple estimate).

    Args:
        param_sizes: ``(name, numel[, element_size])`` in registration order.
        batch_tokens: Tokens (or samples) per rank per step.
        device_flops_per_s: Sustained FLOP rate.

    Returns:
        Ready times indexed by registration order (the last parameter is first).
    """
    if batch_tokens <= 0 or not device_flops_per_s > 0:
        raise ValueError(
            f"batch_tokens ({batch_tokens}) and device_flops_per_s ({device_flops_per_s}) "
            "must be > 0"
        )
    numel = np.array([int(p[1]) for p in param_sizes], dtype=np.float64)
    cost_ns = 4.0 * numel * batch_tokens / device_flops_per_s * 1e9
    return np.cumsum(cost_ns[::-1])[::-1]


def simulate(
    buckets: Sequence[Bucket],
    bucket_time_ns: Sequence[float],
    ready_ns: Sequence[float],
    backward_ns: float,
) -> tuple[list[BucketEstimate], int]:
    """Serialise bucket all-reduces after their gradients are ready: the step simulator
    (``step_sim.simulate_step``) with every correction off, one channel and no hook time.

    Args:
        buckets: Buckets in launch order.
        bucket_time_ns: Predicted all-reduce time of each bucket.
        ready_ns: Per-parameter ready times by registration index.
        backward_ns: End of backward compute.

    Returns:
        The timeline and the exposed time in ns.
    """
    ready = [max(float(ready_ns[i]) for i in b.param_indices) for b in buckets]
    played = simulate_step(
        ready_work_ns=ready,
        service_ns=[float(t) for t in bucket_time_ns],
        num_bytes=[b.num_bytes for b in buckets],
        compute_work_ns=max([float(backward_ns), *ready]),
        num_channels=1,
    )
    out = [
        BucketEstimate(
            index=bucket.index,
            num_params=bucket.num_params,
            num_bytes=bucket.num_bytes,
            ready_ns=round(own),
            launch_ns=round(timing.start_ns),
            done_ns=round(timing.end_ns),
            allreduce_ns=round(timing.service_ns),
        )
        for bucket, own, timing in zip(buckets, ready, played.buckets, strict=True)
    ]
    done = max((timing.end_ns for timing in played.buckets), default=0.0)
    return out, max(0, round(done - backward_ns))


def estimate(
    param_sizes: Sequence[ParamSize],
    *,
    world_size: int,
    bucket_cap_mb: float | None,
    link: Link,
    link_label: str,
    ready_ns: Sequence[float] | np.ndarray | None = None,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    device_flops_per_s: float = DEFAULT_DEVICE_FLOPS_PER_S,
) -> Estimate:
    """Predict per-bucket all-reduce times, total and exposed communication.

    Args:
        param_sizes: ``(name, numel[, element_size])`` in registration order.
        world_size: Ranks (>= 2).
        bucket_cap_mb: DDP cap (MiB); None is DDP's default.
        link: Any link (``collective.link.Link``): published parameters, a calibrated fit, or a
            cluster.
        link_label: Where the link came from (shown in output).
        ready_ns: Measured per-parameter ready times; default the simple estimate.
        batch_tokens: For the simple estimate.
        device_flops_per_s: For the simple estimate.

    Returns:
        The estimate.
    """
    if world_size < 2:
        raise ValueError(
            f"world_size {world_size} is impossible for gradient all-reduce; choose an integer >= 2"
        )
    buckets = assign_buckets(param_sizes, bucket_cap_mb=bucket_cap_mb)
    sizes = np.array([b.num_bytes for b in buckets], dtype=np.float64)
    times = link.predict_ns(sizes, world_size)
    if ready_ns is None:
        ready = backward_ready_ns(
            param_sizes, batch_tokens=batch_tokens, device_flops_per_s=device_flops_per_s
        )
    else:
        ready = np.asarray(ready_ns, dtype=np.float64)
        if ready.size != len(param_sizes):
            raise ValueError(f"ready_ns has {ready.size} entries for {len(param_sizes)} params")
    backward = float(ready.max())
    timeline, exposed = simulate(buckets, times.tolist(), ready.tolist(), backward)
    return Estimate(
        world_size=world_size,
        bucket_cap_mb=bucket_cap_mb,
        link=link_label,
        buckets=tuple(timeline),
        total_comm_ns=round(float(times.sum())),
        backward_ns=round(backward),
        exposed_ns=exposed,
    )
