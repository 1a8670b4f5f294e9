"""``commprof estimate``: one request (:mod:`~commprof.commands.estimate_request`), one result.

:func:`predict` answers a validated request in its mode and returns one
:class:`~commprof.modeling.prediction.Prediction`; :func:`main` prints it, as text
(``prediction.render_text``) or one JSON document (docs/prediction.md). The idle model, run
here, is :mod:`commprof.modeling.step.idle` (DDP's buckets on a link, played on a simple or
measured backward); ``--fit DIR`` runs the step model (:mod:`commprof.commands.estimate_step`),
``--trace`` the trace's replay and what-ifs (:mod:`commprof.commands.estimate_trace`).

This module imports no torch: a catalog model's parameter sizes are closed form
(``commprof.catalog.parameter_sizes``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from commprof.caps import cap_label, cap_number
from commprof.commands.estimate_request import EstimateRequest, add_arguments
from commprof.commands.links import ResolvedLink, resolve_link
from commprof.modeling.buckets import MIB, ParamSize
from commprof.modeling.collective.cluster_link import ClusterLink, comm_interval
from commprof.modeling.prediction import Assumption, Interval, Prediction, render_text
from commprof.modeling.step.cap_advice import CAP_GRID_MB, search, verdict
from commprof.modeling.step.idle import Estimate, estimate
from commprof.modeling.step.timeline import load_parameter_ready_ns
from commprof.yamlio import load_yaml, read_text, short

__all__ = ["add_arguments", "load_param_sizes_file", "main", "param_sizes", "predict", "run"]


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


def param_sizes(request: EstimateRequest) -> Sequence[ParamSize]:
    """Parameter sizes of ``--params-file`` or ``--model`` (closed form, torch-free; with ``--fit
    DIR`` a model of the user's own as the dataset recorded it)."""
    from commprof.catalog import is_model_name, parameter_sizes

    if request.params_file:
        return load_param_sizes_file(request.params_file)
    model = request.model or ""
    if request.fit and not is_model_name(model):
        # a model of the user's own (commprof.attach): its sizes as the dataset recorded them
        from commprof.modeling.step.model import param_sizes_for
        from commprof.results import load

        return param_sizes_for(load(request.fit), model)
    return parameter_sizes(model)  # the catalog names what it knows where it does not


def idle_assumptions(request: EstimateRequest, resolved: ResolvedLink) -> tuple[Assumption, ...]:
    """What the idle model assumed, each with its value and source (flag, file, or built-in
    default): compute rate, tokens, link, latency."""

    def source(flag: str, value: object) -> str:
        return flag if value is not None else f"built-in default; {flag} sets it"

    if request.timeline:
        measured = f"backward timeline measured in {request.timeline} (cell {request.cell})"
        compute = Assumption(name="compute", value=None, source=measured)
        tokens = Assumption(name="tokens", value=None, source=measured)
    else:
        compute = Assumption(
            name="compute",
            value=f"{request.device_flops_per_s / 1e12:g} TFLOP/s",
            source=source("--device-tflops", request.device_tflops),
        )
        tokens = Assumption(
            name="tokens",
            value=f"{request.batch_tokens_used} per rank",
            source=source("--batch-tokens", request.batch_tokens),
        )
    latency = None if resolved.latency_ns is None else round(resolved.latency_ns)
    return (
        compute,
        tokens,
        Assumption(name="link", value=resolved.label, source=resolved.source),
        Assumption(name="latency", value=latency, source=resolved.latency_source, unit="ns"),
    )


def predict_idle(request: EstimateRequest, sizes: Sequence[ParamSize]) -> Prediction:
    """The idle model of a validated request: DDP's buckets on its link, played on the simple
    backward (or ``--timeline``'s measured one); with ``--recommend-bucket-cap`` the cap search."""
    world_size = int(request.world_size or 0)
    resolved = resolve_link(request, world_size)
    link, label = resolved.link, resolved.label or ""
    assert link is not None  # validate() asks for one
    ready_ns = None
    if request.timeline and request.cell:
        ready_ns = load_parameter_ready_ns(request.timeline, request.cell, sizes)

    def run_one(cap: float | None) -> Estimate:
        return estimate(
            sizes,
            world_size=world_size,
            bucket_cap_mb=cap,
            link=link,
            link_label=label,
            ready_ns=ready_ns,
            batch_tokens=request.batch_tokens_used,
            device_flops_per_s=request.device_flops_per_s,
        )

    main = run_one(request.bucket_cap_mb)
    body: dict[str, Any] = {
        "estimate": main.to_dict(),
        "in_sample": None,  # no calibration cells: --fit DIR has them
    }
    interval = None
    if isinstance(link, ClusterLink):  # the collective model's 80 % interval on each bucket
        sizes_bytes = [b.num_bytes for b in main.buckets]
        body["communication_interval"] = spread = comm_interval(link, sizes_bytes, world_size)
        interval = Interval(
            quantity="total_comm_ns",
            low_ns=spread["total_comm_ns_low"],
            high_ns=spread["total_comm_ns_high"],
            basis=spread["basis"],
            title="total communication 80 % interval",
        )
    notes = ["in sample: none (no calibration cells; --fit DIR calibrates on a dataset's cells)"]
    if request.recommend_bucket_cap:
        body["recommendation"], lines = _advice(run_one, request.bucket_cap_mb)
        notes.extend(lines)
    return Prediction(
        mode="idle",
        link=label,
        world_size=world_size,
        interval=interval,
        assumptions=idle_assumptions(request, resolved),
        body=body,
        lines=(_table(main),),
        notes=tuple(notes),
    )


def predict(request: EstimateRequest, sizes: Sequence[ParamSize] | None = None) -> Prediction:
    """The prediction of a validated request in its mode (``sizes``: the parameter sizes where
    the caller has them; else from the request)."""
    if request.mode == "trace":
        from commprof.commands.estimate_trace import predict_trace

        return predict_trace(request)
    sizes = param_sizes(request) if sizes is None else sizes
    if request.mode == "step":
        from commprof.commands.estimate_step import predict_step_mode

        return predict_step_mode(request, sizes)
    return predict_idle(request, sizes)


def show(request: EstimateRequest, prediction: Prediction) -> int:
    """Print a prediction as ``--json`` asks: one JSON document or its text."""
    print(json.dumps(prediction.to_dict()) if request.json else render_text(prediction))
    return 0


def main(args: argparse.Namespace) -> int:
    """Entry of ``commprof estimate``: the request of the parsed options, checked before
    anything is read, answered and printed."""
    request = EstimateRequest.from_namespace(args)
    request.validate()
    return show(request, predict(request))


def run(args: argparse.Namespace, sizes: Sequence[ParamSize]) -> int:
    """``commprof estimate`` on parameter sizes the caller resolved (``--model`` or
    ``--params-file``)."""
    request = EstimateRequest.from_namespace(args)
    request.validate()
    return show(request, predict(request, sizes))
