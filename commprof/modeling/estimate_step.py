"""``commprof estimate --fit RESULTS``: the calibrated step simulator on the command line.

With a dataset folder, ``estimate`` calibrates the step simulator on one cell of the model
(``step_advice.load_step_model``) and answers what-ifs with it: another cap
(``--bucket-cap-mb``), world size (``--world-size``; ``--same-host`` when the ranks would share
the calibration's CPU host) or link (``--interconnect``, or ``--cluster``: NCCL's collective
model on that cluster at ``--world-size`` GPUs; the measured compute timeline kept, the link
swapped). The idle ring model (no interference) is printed beside it as the baseline.

JSON (``--json``): ``prediction`` holds ``step_ns``, ``exposed_ns``, ``overlap_efficiency``,
their ``*_low``/``*_high`` under the calibration's uncertainty and ``buckets`` (ready, start,
end per bucket); ``idle_ring`` the baseline; ``calibration`` what it was calibrated on;
``recommendation`` (``--recommend-bucket-cap``) the cap search.

This module imports no torch and no ray.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from commprof.caps import cap_label, cap_number, same_cap
from commprof.modeling.buckets import MIB, ParamSize
from commprof.modeling.cluster_link import ClusterLink
from commprof.modeling.cost_model import LinkParams
from commprof.modeling.interconnects import get_interconnect, load_interconnects
from commprof.modeling.ring_fit import fit_to_dict
from commprof.modeling.step_advice import (
    CapPrediction,
    StepModel,
    in_training,
    load_step_model,
    predict_cap,
    recommend_cap,
)
from commprof.modeling.step_sim import NO_INTERFERENCE


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _prediction_doc(pred: CapPrediction) -> dict[str, Any]:
    return {
        "bucket_cap_mb": pred.bucket_cap_mb,
        "num_buckets": pred.num_buckets,
        "step_ns": round(pred.step_ns),
        "step_ns_low": round(pred.step_ns_range[0]),
        "step_ns_high": round(pred.step_ns_range[1]),
        "exposed_ns": round(pred.exposed_ns),
        "exposed_ns_low": round(pred.exposed_ns_range[0]),
        "exposed_ns_high": round(pred.exposed_ns_range[1]),
        "rank_wait_ns": round(pred.prediction.rank_wait_ns),
        "overlap_efficiency": _finite(pred.overlap_efficiency),
        "compute_end_ns": round(pred.prediction.compute_end_ns),
        "buckets": [
            {k: (round(v) if isinstance(v, float) else v) for k, v in asdict(b).items()}
            for b in pred.prediction.buckets
        ],
    }


def _link(
    args: argparse.Namespace, model: StepModel, cluster: ClusterLink | None, alpha_ns: float
) -> tuple[LinkParams | ClusterLink | None, str]:
    if cluster is not None:  # NCCL's model on the cluster, the measured compute kept
        return cluster, cluster.describe(args.world_size)
    if not args.interconnect:
        cell = model.calibration.cell_id
        interference = NO_INTERFERENCE if args.no_interference else None
        scale, stall, _ = in_training(model, link=None, interference=interference)
        label = f"fit of the microbenchmarks on cell {cell}'s host ({model.link.method})"
        if stall > 0:
            label += f" + {stall / 1e6:.2f} ms stall an all-reduce"
        if scale != 1.0:
            label += f", x {scale:.2f} in training"
        return None, label
    link = get_interconnect(args.interconnect, load_interconnects(args.interconnect_file))
    params = LinkParams.from_bandwidth(
        bandwidth_bytes_per_s=link.per_direction_bytes_per_s, alpha_ns=alpha_ns
    )
    return params, f"{link.name} ({link.per_direction_bytes_per_s / 1e9:.1f} GB/s, alpha assumed)"


def run_step(
    args: argparse.Namespace,
    param_sizes: Sequence[ParamSize],
    *,
    cluster: ClusterLink | None,
    alpha_ns: float,
) -> int:
    """``estimate --fit DIR``: print the simulator's prediction (table or JSON). ``cluster``:
    ``--cluster``'s link (``estimate.check_cluster_flags``), which replaces the calibrated one;
    ``alpha_ns``: the latency of ``--interconnect``'s published link."""
    from commprof.results import load

    if not args.model and not args.cell:
        raise ValueError("--fit DIR with --params-file needs --cell ID (the calibration cell)")
    tables = load(args.fit)
    model = load_step_model(
        tables, args.model or "", world_size=args.world_size, param_sizes=param_sizes,
        backend=args.fit_backend, cell_id=args.cell,
    )  # fmt: skip
    link, label = _link(args, model, cluster, alpha_ns)
    what_if: dict[str, Any] = {"link": link, "same_host": args.same_host}
    if args.no_interference:
        what_if["interference"] = NO_INTERFERENCE
    main = predict_cap(
        model, param_sizes, bucket_cap_mb=args.bucket_cap_mb, world_size=args.world_size, **what_if
    )
    idle = predict_cap(
        model, param_sizes, bucket_cap_mb=args.bucket_cap_mb, world_size=args.world_size,
        link=link, same_host=args.same_host, interference=NO_INTERFERENCE,
    )  # fmt: skip
    cal = model.calibration
    scale, stall, rank_wait = in_training(
        model, link=link, interference=what_if.get("interference")
    )
    doc: dict[str, Any] = {
        "prediction": _prediction_doc(main),
        "idle_ring": {k: v for k, v in _prediction_doc(idle).items() if k != "buckets"},
        "calibration": {
            "cell_id": cal.cell_id,
            "world_size": cal.world_size,
            "link": label,
            "fit": fit_to_dict(model.link) if link is None else None,
            "link_scale": scale,
            "stall_ns": round(stall),
            "rank_wait_ns": round(rank_wait),
            "interference": asdict(model.interference),
            "measured_step_ns": round(cal.measured_step_ns),
        },
        "world_size": args.world_size,
    }
    text = [_table(main, idle, label, args.world_size, cal.cell_id)]
    if args.recommend_bucket_cap:
        advice = recommend_cap(
            model, param_sizes, world_size=args.world_size, in_use_mb=args.bucket_cap_mb,
            **what_if,
        )  # fmt: skip
        doc["recommendation"] = {
            "best_bucket_cap_mb": advice.best_cap_mb,
            "in_use_bucket_cap_mb": args.bucket_cap_mb,
            "curve": [
                {k: v for k, v in _prediction_doc(c).items() if k != "buckets"}
                for c in advice.curve
            ],
        }
        text.append(
            f"\n{'cap MiB':>8} {'buckets':>7} {'step ms':>9} {'range ms':>17} {'exposed ms':>10}"
        )
        for c in advice.curve:
            mark = "  <- best" if same_cap(c.bucket_cap_mb, advice.best_cap_mb) else ""
            mark += "  (in use)" if same_cap(c.bucket_cap_mb, args.bucket_cap_mb) else ""
            cap = cap_number(c.bucket_cap_mb)
            text.append(
                f"{cap:>8} {c.num_buckets:>7} {c.step_ns / 1e6:>9.2f} "
                f"{c.step_ns_range[0] / 1e6:>8.2f}-{c.step_ns_range[1] / 1e6:<8.2f} "
                f"{c.exposed_ns / 1e6:>10.2f}{mark}"
            )
    print(json.dumps(doc) if args.json else "\n".join(text))
    return 0


def _table(main: CapPrediction, idle: CapPrediction, label: str, ws: int, cell: str) -> str:
    cap = cap_label(main.bucket_cap_mb)
    lines = [
        f"step simulator calibrated on cell {cell}; link: {label}; world size {ws}; cap {cap}; "
        "buckets of the slowest rank",
        f"{'bucket':>6} {'MiB':>9} {'ready ms':>9} {'start ms':>9} {'end ms':>9} {'idle ms':>8}",
    ]
    for b in main.prediction.buckets:
        lines.append(
            f"{b.index:>6} {b.num_bytes / MIB:>9.3f} {b.ready_ns / 1e6:>9.3f} "
            f"{b.start_ns / 1e6:>9.3f} {b.end_ns / 1e6:>9.3f} {b.service_ns / 1e6:>8.3f}"
        )
    eff = main.overlap_efficiency
    wait = main.prediction.rank_wait_ns
    lines.append(
        f"step {main.step_ns / 1e6:.2f} ms ({main.step_ns_range[0] / 1e6:.2f} to "
        f"{main.step_ns_range[1] / 1e6:.2f}), exposed communication {main.exposed_ns / 1e6:.2f} ms "
        f"({main.exposed_ns_range[0] / 1e6:.2f} to {main.exposed_ns_range[1] / 1e6:.2f})"
        + (f" of which {wait / 1e6:.2f} waiting for the slowest rank" if wait else "")
        + f", overlap efficiency {'n/a' if not math.isfinite(eff) else f'{eff:.2f}'}"
    )
    lines.append(
        f"idle ring model (no interference): step {idle.step_ns / 1e6:.2f} ms, exposed "
        f"{idle.exposed_ns / 1e6:.2f} ms"
    )
    return "\n".join(lines)


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the step simulator path."""
    parser.add_argument(
        "--same-host",
        action="store_true",
        help="with --fit DIR and another --world-size: the ranks share the calibration's CPU "
        "host, so compute and gloo's transfers slow by the core share",
    )
    parser.add_argument(
        "--no-interference",
        action="store_true",
        help="with --fit DIR: leave the measured interference factors out (the idle model)",
    )
