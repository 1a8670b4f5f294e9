"""``commprof estimate``: predicted DDP gradient communication for a model, link and cap.

Pipeline: parameter sizes -> DDP buckets (``buckets.assign_buckets``) -> an
all-reduce time per bucket (``cost_model``, from a published link or a
calibrated fit) -> a simulated backward timeline -> exposed communication.

Backward timeline (simple per-layer estimate, used unless a measured one is
given): parameter i costs 4 * numel_i * tokens FLOPs of backward (twice the
forward's 2 * numel * tokens; Kaplan et al. 2020, "Scaling laws for neural
language models", section 2.1) at ``device_flops_per_s``; gradients become
ready in reverse registration order, one after another. The timeline is played
by the step simulator (``step_sim.simulate_step``) with every correction off,
one channel and no hook time, which reduces to: bucket k launches when its last
gradient is ready AND bucket k-1 has finished (DDP launches in order, and with
one communication stream the all-reduces serialise):

    launch_k = max(ready_k, done_{k-1}),  done_k = launch_k + T_k,
    exposed  = max(0, done_last - backward_end).

Printed with the estimate: what it assumed (compute rate, tokens, link, latency), each with its
source (a flag, a file, or the built-in default); with ``--recommend-bucket-cap`` a verdict line.
Flags that do not apply to the path taken are errors naming them (:func:`check_step_flags`,
:func:`check_serial_flags`). With a dataset folder, ``--fit DIR`` runs the step simulator
instead (``estimate_step``).

This module imports no torch: the CLI resolves a model name to parameter
sizes (``commprof.catalog.parameter_sizes``, closed form) and passes them in.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from commprof import flags
from commprof.caps import cap_label, cap_number
from commprof.modeling.buckets import MIB, Bucket, ParamSize, assign_buckets
from commprof.modeling.cap_advice import CAP_GRID_MB, search, verdict
from commprof.modeling.cluster_link import (
    ClusterLink,
    add_cluster_arguments,
    cluster_link,
    comm_interval,
    interval_line,
)
from commprof.modeling.cost_model import ALGORITHMS, LinkParams, allreduce_ns
from commprof.modeling.estimate_step import (
    add_step_arguments,
    assumptions_text,
    run_step,
    step_flags_given,
)
from commprof.modeling.interconnects import get_interconnect, load_interconnects
from commprof.modeling.ring_fit import FIT_SOURCES, Fit, fits_from_dataset, load_fits
from commprof.modeling.step_sim import simulate_step
from commprof.modeling.timeline import load_parameter_ready_ns
from commprof.yamlio import load_yaml, read_text, short

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
    link: LinkParams | Fit | ClusterLink,
    link_label: str,
    algorithm: str = "ring",
    ready_ns: Sequence[float] | np.ndarray | None = None,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    device_flops_per_s: float = DEFAULT_DEVICE_FLOPS_PER_S,
) -> Estimate:
    """Predict per-bucket all-reduce times, total and exposed communication.

    Args:
        param_sizes: ``(name, numel[, element_size])`` in registration order.
        world_size: Ranks (>= 2).
        bucket_cap_mb: DDP cap (MiB); None is DDP's default.
        link: Link parameters, a calibrated fit, or a cluster (``cluster_link.ClusterLink``).
        link_label: Where the link came from (shown in output).
        algorithm: Cost model for LinkParams (fits are ring models).
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
    if isinstance(link, LinkParams):
        times = allreduce_ns(sizes, world_size, link, algorithm=algorithm)
    else:
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


def load_param_sizes_file(path: str | Path) -> list[tuple[str, int, int]]:
    """Parameter sizes from YAML or JSON: a list of {name, numel, dtype_bytes?}.

    Args:
        path: The file (registration order).

    Returns:
        ``(name, numel, element_size_bytes)`` tuples (dtype_bytes defaults to 4).
    """
    data = load_yaml(read_text(path, "the parameter file"), str(path))  # JSON is YAML too
    if isinstance(data, dict) and "params" in data:
        data = data["params"]
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty list of {{name, numel, dtype_bytes}}")
    return [_param_entry(path, i, row) for i, row in enumerate(data)]


MAX_NUMEL = 1 << 40
"""Most elements of one parameter: a trillion (4 TiB in fp32), past any model's tensor."""
DTYPE_BYTES = (1, 2, 4, 8)
"""Element sizes a parameter may have (bytes)."""


def _param_entry(path: str | Path, i: int, row: Any) -> tuple[str, int, int]:
    """One entry of a parameter file, checked: the one reading of an entry (see
    :func:`load_param_sizes_file`).

    Raises:
        ValueError: naming the file, the entry, the key and the value.
    """
    if not isinstance(row, dict) or "numel" not in row:
        raise ValueError(f"{path}: entry {i} needs at least 'numel' (and 'name')")
    name = row.get("name", f"param{i}")
    if not isinstance(name, str) or not name or len(name) > 1000:
        raise ValueError(f"{path}: entry {i}: key 'name' is {short(name)}; give the name as text")
    numel, size = row["numel"], row.get("dtype_bytes", 4)
    if isinstance(numel, bool) or not isinstance(numel, int) or not 0 <= numel <= MAX_NUMEL:
        raise ValueError(
            f"{path}: entry {i} ({short(name)}): key 'numel' is {short(numel)}; give a whole "
            f"number of elements in [0, {MAX_NUMEL:,}]"
        )
    if isinstance(size, bool) or size not in DTYPE_BYTES:
        raise ValueError(
            f"{path}: entry {i} ({short(name)}): key 'dtype_bytes' is {short(size)}; give one of "
            f"{', '.join(map(str, DTYPE_BYTES))} (bytes per element)"
        )
    return name, numel, int(size)


class _Given(argparse.Action):
    """Stores the flag's value and that it was given (``<dest>_given``): ``--bucket-cap-mb
    default`` asks ``--trace`` for DDP's default cap, where leaving the flag out asks for none."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


MAX_WORLD_SIZE = 1 << 20
"""Most ranks ``--world-size`` takes: about a million, past any data-parallel job."""
MAX_TFLOPS = 1e9
"""Most ``--device-tflops``: finite, a million times any device (a backward that vanishes, for
a what-if of communication alone)."""


MAX_BATCH_TOKENS = 1 << 40
"""Most ``--batch-tokens``: a trillion tokens a rank a step."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``commprof estimate`` options to a parser."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="reference model name")
    src.add_argument("--params-file", help="YAML/JSON list of {name, numel, dtype_bytes}")
    src.add_argument(
        "--trace",
        metavar="DIR",
        help="a rank trace or a folder of them (Kineto): replay its steps, then the what-if of "
        "--cluster/--interconnect and --world-size (commprof.modeling.trace_replay)",
    )
    parser.add_argument(
        "--world-size",
        type=flags.bounded_int(MAX_WORLD_SIZE, unit="ranks"),
        help="ranks (>= 2); required, but with --trace the trace's own",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--interconnect", help="published link name (see --interconnect-file)")
    where.add_argument(
        "--cluster",
        metavar="NAME|FILE",
        help="a bundled cluster (commprof collective's) or a cluster YAML file: each all-reduce "
        "as NCCL would run it on --world-size GPUs of it, in place of one link",
    )
    add_cluster_arguments(parser)
    parser.add_argument("--interconnect-file", help="YAML file with extra links")
    parser.add_argument(
        "--fit",
        help="a dataset folder: the step simulator calibrated on a cell of --model (see "
        "commprof.modeling.estimate_step); or a fits JSON (save_fits): the idle ring model",
    )
    parser.add_argument("--fit-backend", default="gloo", help="backend of the fit to use")
    parser.add_argument(
        "--fit-source",
        choices=FIT_SOURCES,
        default="microbench",
        help="with --fit DATASET: fit the microbenchmark or the in-training bucket times",
    )
    parser.add_argument(
        "--bucket-cap-mb",
        type=flags.cap,
        action=_Given,
        default=None,
        help="DDP cap (MiB, or 'default': DDP's own); with --trace, the cap to lay the trace's "
        "gradients out at",
    )
    parser.set_defaults(bucket_cap_mb_given=False)
    parser.add_argument(
        "--algorithm", choices=sorted(ALGORITHMS), help="cost model of a published link (ring)"
    )
    parser.add_argument(
        "--alpha-us",
        type=float,
        help=f"assumed latency for a published link (us; default {DEFAULT_ALPHA_NS / 1e3:g})",
    )
    parser.add_argument(
        "--timeline",
        metavar="RESULTS",
        help="take the backward timeline measured in a cell of this dataset (with --cell)",
    )
    parser.add_argument(
        "--cell", help="cell id (or a unique prefix) for --timeline, or to calibrate --fit DIR on"
    )
    parser.add_argument(
        "--batch-tokens",
        type=flags.bounded_int(MAX_BATCH_TOKENS),
        help="tokens (or samples) per rank per step of the simple backward estimate "
        f"(default {DEFAULT_BATCH_TOKENS}; not with --fit DIR or --timeline)",
    )
    parser.add_argument(
        "--device-tflops",
        type=flags.bounded_float(MAX_TFLOPS, unit="TFLOP/s"),
        help="sustained backward TFLOP/s of one device for the simple backward estimate "
        f"(default {DEFAULT_DEVICE_FLOPS_PER_S / 1e12:g}; not with --fit DIR or --timeline)",
    )
    parser.add_argument(
        "--recommend-bucket-cap",
        action="store_true",
        help="search the cap that minimises exposed communication",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    add_step_arguments(parser)


def _batch_tokens(args: argparse.Namespace) -> int:
    return DEFAULT_BATCH_TOKENS if args.batch_tokens is None else int(args.batch_tokens)


def _device_flops_per_s(args: argparse.Namespace) -> float:
    tflops = args.device_tflops
    return DEFAULT_DEVICE_FLOPS_PER_S if tflops is None else float(tflops) * 1e12


def _refuse(given: dict[str, bool], why: str) -> None:
    bad = [flag for flag, present in given.items() if present]
    if bad:
        raise ValueError(f"{', '.join(bad)} do(es) not apply {why}; leave them out")


def check_step_flags(args: argparse.Namespace) -> None:
    """Refuse the flags the step simulator (``--fit DIR``) does not use: it replays the
    calibration cells' measured backward timeline, and its link is the dataset's fit, a
    published one or a cluster."""
    _refuse(
        {
            "--batch-tokens": args.batch_tokens is not None,
            "--device-tflops": args.device_tflops is not None,
            "--timeline": args.timeline is not None,
            "--algorithm": args.algorithm is not None,
        },
        f"to --fit {args.fit} (the step simulator replays the calibration cells' measured "
        "timeline, ring all-reduces)",
    )
    _refuse(
        {
            "--alpha-us": args.alpha_us is not None and not args.interconnect,
            "--interconnect-file": args.interconnect_file is not None and not args.interconnect,
        },
        "without --interconnect (they describe a published link)",
    )


def check_serial_flags(args: argparse.Namespace) -> None:
    """Refuse the flags the serial estimate does not use: the step simulator's, and those of a
    link or a backward timeline it does not have."""
    _refuse(
        {flag: True for flag in step_flags_given(args)},
        "here: they switch parts of the step simulator, which only --fit DIR with the "
        "microbenchmark fit (--fit-source microbench, the default) runs",
    )
    fitted = bool(args.fit)
    _refuse(
        {
            "--alpha-us": args.alpha_us is not None and fitted,
            "--algorithm": args.algorithm is not None and fitted,
            "--interconnect": bool(args.interconnect) and fitted,
            "--interconnect-file": args.interconnect_file is not None and fitted,
        },
        f"to --fit {args.fit} (the fit is the link, a ring with its own latency)",
    )
    _refuse(
        {
            "--fit-backend": args.fit_backend != "gloo" and not fitted,
            "--fit-source": args.fit_source != "microbench" and not fitted,
        },
        "without --fit (they choose which fit of a dataset or fits JSON is the link)",
    )
    _refuse(
        {
            "--batch-tokens": args.batch_tokens is not None and args.timeline is not None,
            "--device-tflops": args.device_tflops is not None and args.timeline is not None,
        },
        "to --timeline (the backward timeline is measured)",
    )


def serial_assumptions(args: argparse.Namespace, label: str) -> dict[str, dict[str, Any]]:
    """What the serial estimate assumed, each with its value and source (flag, file, or
    built-in default): compute rate, tokens, link, latency."""

    def source(flag: str, value: object) -> str:
        return flag if value is not None else f"built-in default; {flag} sets it"

    if args.timeline:
        measured = f"backward timeline measured in {args.timeline} (cell {args.cell})"
        compute = {"value": None, "source": measured}
        tokens = {"value": None, "source": measured}
    else:
        compute = {
            "value": f"{_device_flops_per_s(args) / 1e12:g} TFLOP/s",
            "source": source("--device-tflops", args.device_tflops),
        }
        tokens = {
            "value": f"{_batch_tokens(args)} per rank",
            "source": source("--batch-tokens", args.batch_tokens),
        }
    if args.cluster:
        link_source = f"--cluster {args.cluster}"
        latency: dict[str, Any] = {"value_ns": None, "source": f"{link_source} (its model)"}
    elif args.fit:
        link_source = f"fit from {args.fit}"
        latency = {"value_ns": None, "source": f"{link_source} (alpha of the fit)"}
    else:
        link_source = f"--interconnect {args.interconnect}" + (
            f" (--interconnect-file {args.interconnect_file})" if args.interconnect_file else ""
        )
        latency = {"value_ns": round(alpha_ns(args)), "source": source("--alpha-us", args.alpha_us)}
    return {
        "compute": compute,
        "tokens": tokens,
        "link": {"value": label, "source": link_source},
        "latency": latency,
    }


def alpha_ns(args: argparse.Namespace) -> float:
    """The latency assumed for a published link: ``--alpha-us``, else ``DEFAULT_ALPHA_NS``."""
    return DEFAULT_ALPHA_NS if args.alpha_us is None else args.alpha_us * 1e3


def check_cluster_flags(args: argparse.Namespace) -> ClusterLink | None:
    """The cluster link of ``--cluster`` (None without it), after refusing the flags that do
    not apply to it: those of a published link, a fits JSON or the bucket-time fit as the link,
    and ``--same-host`` (a cluster's ranks have GPUs of their own)."""
    if not args.cluster:
        if args.nccl_tests or args.run:
            raise ValueError("--nccl-tests LOG calibrates a cluster: give --cluster NAME|FILE")
        return None
    given = {
        "--interconnect-file": args.interconnect_file is not None,
        "--alpha-us": args.alpha_us is not None,
        "--algorithm": args.algorithm is not None,
        "--fit FITS_JSON (a fitted link)": bool(args.fit) and not Path(args.fit).is_dir(),
        "--fit-source buckets (a fitted link)": bool(args.fit) and args.fit_source != "microbench",
        "--same-host": bool(getattr(args, "same_host", False)),
    }
    bad = [flag for flag, present in given.items() if present]
    if bad:
        raise ValueError(
            f"--cluster {args.cluster}: {', '.join(bad)} do(es) not apply to a cluster (its "
            "collective model sets the link, latency and algorithm); leave them out"
        )
    return cluster_link(args.cluster, args.world_size, args.nccl_tests or (), args.run)


def _link_from_args(
    args: argparse.Namespace, cluster: ClusterLink | None
) -> tuple[LinkParams | Fit | ClusterLink, str]:
    if cluster is not None:
        return cluster, cluster.describe(args.world_size)
    if args.fit:
        if Path(args.fit).is_dir():
            fits = fits_from_dataset(args.fit, source=args.fit_source)
        else:
            try:
                fits = load_fits(args.fit)
            except (OSError, ValueError, TypeError, KeyError) as err:
                raise ValueError(
                    f"--fit {args.fit}: neither a dataset folder nor a fits JSON (save_fits) "
                    f"({str(err)[:200]})"
                ) from None
        matches = {k: f for k, f in fits.items() if k[0] == args.fit_backend}
        for (backend, regime, ws), fit in matches.items():
            if ws == args.world_size:
                return fit, f"fit {backend}/{regime}/p={ws} ({fit.method})"
        valid = sorted({k[2] for k in matches})
        raise ValueError(
            f"no {args.fit_backend} fit for world size {args.world_size} in {args.fit}; "
            f"fitted world sizes: {valid}"
        )
    if not args.interconnect:
        raise ValueError("give --interconnect NAME, --cluster NAME|FILE or --fit FITS_JSON")
    link = get_interconnect(args.interconnect, load_interconnects(args.interconnect_file))
    params = LinkParams.from_bandwidth(
        bandwidth_bytes_per_s=link.per_direction_bytes_per_s, alpha_ns=alpha_ns(args)
    )
    return params, f"{link.name} ({link.per_direction_bytes_per_s / 1e9:.1f} GB/s, alpha assumed)"


def _table(est: Estimate) -> str:
    lines = [
        f"link: {est.link}   world size: {est.world_size}   "
        f"cap: {cap_label(est.bucket_cap_mb, with_size=True)}",
        f"{'bucket':>6} {'params':>6} {'MiB':>9} {'ready ms':>9} {'launch ms':>9} "
        f"{'done ms':>9} {'allreduce ms':>12}",
    ]
    for b in est.buckets:
        lines.append(
            f"{b.index:>6} {b.num_params:>6} {b.num_bytes / MIB:>9.3f} "
            f"{b.ready_ns / 1e6:>9.3f} {b.launch_ns / 1e6:>9.3f} "
            f"{b.done_ns / 1e6:>9.3f} {b.allreduce_ns / 1e6:>12.3f}"
        )
    lines.append(
        f"total communication {est.total_comm_ns / 1e6:.3f} ms, backward "
        f"{est.backward_ns / 1e6:.3f} ms, exposed {est.exposed_ns / 1e6:.3f} ms"
    )
    return "\n".join(lines)


def _advice(
    run_one: Callable[[float | None], Estimate], in_use_mb: float | None
) -> tuple[dict[str, Any], list[str]]:
    """The cap search of the idle model under the step model's rule (``cap_advice.best_of``,
    on backward plus exposed communication): its document and its lines, the verdict last."""
    curve, best, in_use = search(CAP_GRID_MB, run_one, in_use_mb)
    assert in_use is not None  # a cap is always in use here (None: DDP's default)
    line = verdict(curve, best, in_use, quantity="backward + exposed")
    doc = {
        "best_bucket_cap_mb": best.bucket_cap_mb,
        "in_use_bucket_cap_mb": in_use_mb,
        "kept_cap_in_use": best is in_use,
        "verdict": line,
        "in_use": {"num_buckets": in_use.num_buckets, "exposed_ns": in_use.exposed_ns},
        "curve": [
            {
                "bucket_cap_mb": e.bucket_cap_mb,
                "num_buckets": e.num_buckets,
                "total_comm_ns": e.total_comm_ns,
                "exposed_ns": e.exposed_ns,
                "step_ns": e.step_ns,
            }
            for e in curve
        ],
    }
    worst = max(e.exposed_ns for e in curve) or 1
    lines = [f"\n{'cap MiB':>8} {'buckets':>7} {'exposed ms':>10} {'bwd+exp ms':>10}"]
    for e in curve:
        bar = "#" * math.ceil(40 * e.exposed_ns / worst)
        cap = cap_number(e.bucket_cap_mb)
        mark = "  <- best" if e is best else ""
        mark += "  (in use)" if e is in_use else ""
        lines.append(
            f"{cap:>8} {e.num_buckets:>7} {e.exposed_ns / 1e6:>10.3f} "
            f"{e.step_ns / 1e6:>10.3f} {bar}{mark}"
        )
    return doc, [*lines, line]


def run(args: argparse.Namespace, param_sizes: Sequence[ParamSize]) -> int:
    """Entry of ``commprof estimate``; prints a table or one JSON document.

    Args:
        args: Parsed options of ``add_arguments``.
        param_sizes: Resolved by the CLI from --model or --params-file.

    Returns:
        Process exit status.
    """
    cluster = check_cluster_flags(args)  # before anything runs, on either path
    if args.fit and Path(args.fit).is_dir() and args.fit_source == "microbench":
        check_step_flags(args)
        return run_step(args, param_sizes, cluster=cluster, alpha_ns=alpha_ns(args))
    check_serial_flags(args)
    link, label = _link_from_args(args, cluster)
    ready_ns = None
    if args.timeline or args.cell:
        if not (args.timeline and args.cell):
            raise ValueError("--timeline RESULTS and --cell ID go together")
        ready_ns = load_parameter_ready_ns(args.timeline, args.cell, param_sizes)

    def run_one(cap: float | None) -> Estimate:
        return estimate(
            param_sizes,
            world_size=args.world_size,
            bucket_cap_mb=cap,
            link=link,
            link_label=label,
            algorithm=args.algorithm or "ring",
            ready_ns=ready_ns,
            batch_tokens=_batch_tokens(args),
            device_flops_per_s=_device_flops_per_s(args),
        )

    main = run_one(args.bucket_cap_mb)
    assumed = serial_assumptions(args, label)
    doc: dict[str, Any] = {
        "estimate": main.to_dict(),
        "assumptions": assumed,
        "in_sample": None,  # no calibration cells: --fit DIR has them
    }
    text = [_table(main)]
    if isinstance(link, ClusterLink):
        sizes = [b.num_bytes for b in main.buckets]
        doc["communication_interval"] = comm_interval(link, sizes, main.world_size)
        text.append(interval_line(doc["communication_interval"]))
    text += [
        assumptions_text(assumed),
        "in sample: none (no calibration cells; --fit DIR calibrates on a dataset's cells)",
    ]
    if args.recommend_bucket_cap:
        doc["recommendation"], lines = _advice(run_one, args.bucket_cap_mb)
        text.extend(lines)
    print(json.dumps(doc) if args.json else "\n".join(text))
    return 0
