"""``commprof estimate``: its flags, which of them go together, and the text and JSON it prints.

The idle model it runs without a dataset is :mod:`commprof.modeling.step.idle` (DDP's buckets
on a link, played on a simple backward); with a dataset folder, ``--fit DIR`` runs the step
model instead (:mod:`commprof.commands.estimate_step`); with ``--trace`` the trace what-if
(:mod:`commprof.commands.estimate_trace`).

Printed with the estimate: what it assumed (compute rate, tokens, link, latency), each with its
source (a flag, a file, or the built-in default); with ``--recommend-bucket-cap`` a verdict line.
Flags that do not apply to the path taken are errors naming them (:func:`check_step_flags`,
:func:`check_serial_flags`).

This module imports no torch: the CLI resolves a model name to parameter
sizes (``commprof.catalog.parameter_sizes``, closed form) and passes them in.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from commprof import flags
from commprof.caps import cap_label, cap_number
from commprof.commands.estimate_step import (
    add_step_arguments,
    assumptions_text,
    run_step,
    step_flags_given,
)
from commprof.commands.links import published_link
from commprof.modeling.buckets import MIB, ParamSize
from commprof.modeling.collective.cluster_link import (
    ClusterLink,
    cluster_link,
    comm_interval,
    interval_line,
)
from commprof.modeling.collective.cost_model import ALGORITHMS
from commprof.modeling.collective.link import Link
from commprof.modeling.collective.ring_fit import FIT_SOURCES, fits_from_dataset, load_fits
from commprof.modeling.step.cap_advice import CAP_GRID_MB, search, verdict
from commprof.modeling.step.idle import (
    DEFAULT_ALPHA_NS,
    DEFAULT_BATCH_TOKENS,
    DEFAULT_DEVICE_FLOPS_PER_S,
    Estimate,
    estimate,
)
from commprof.modeling.step.timeline import load_parameter_ready_ns
from commprof.yamlio import load_yaml, read_text, short


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
        "--cluster/--interconnect and --world-size (commprof.modeling.trace_whatif.what_if)",
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
        "commprof.commands.estimate_step); or a fits JSON (save_fits): the idle ring model",
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


def _link_from_args(args: argparse.Namespace, cluster: ClusterLink | None) -> tuple[Link, str]:
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
    params, link = published_link(args, alpha_ns=alpha_ns(args))
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


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """``--nccl-tests LOG ...`` (calibrate ``--cluster`` on its all_reduce_perf logs) and ``--run
    K|all`` (which run of each log)."""
    parser.add_argument(
        "--nccl-tests",
        nargs="+",
        action="extend",
        metavar="LOG",
        help="with --cluster: all_reduce_perf logs of that cluster to calibrate the model on",
    )
    parser.add_argument(
        "--run",
        metavar="K|all",
        help="with --nccl-tests: run K of each log, or 'all' runs (a file of several needs it)",
    )
