"""The ``commprof`` command line: check, run, sweep, estimate, collective, analyze, figures,
report.

Each subcommand imports what it needs when it runs, so ``commprof estimate`` starts without
torch or Ray and ``commprof --help`` is instant.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from commprof import __version__, flags


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``commprof`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    # The command is the first word that is no option (the top-level options take no value);
    # only its own module is imported to add its flags, so `commprof --help` loads no pandas.
    chosen = next((word for word in argv if not word.startswith("-")), None)
    from commprof.matrix import REGIMES

    parser = argparse.ArgumentParser(
        prog="commprof",
        description="Where the gradient-communication time of data-parallel training goes.",
    )
    parser.add_argument("--version", action="version", version=f"commprof {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check", help="versions, backends, devices, Ray, a matrix's cells")
    check.add_argument(
        "matrix", nargs="?", help="a matrix YAML file, or a bundled one's name (smoke), to validate"
    )
    check.add_argument("--json", action="store_true", help="print one JSON document")
    check.add_argument(
        "--cells", action="store_true", help="list every cell of the matrix, not only the counts"
    )
    check.set_defaults(func=_check)

    run = sub.add_parser("run", help="run one cell on this machine, without Ray")
    _cell_flags(run)
    run.add_argument(
        "--pg-timeout-s", type=flags.seconds, default=60.0, help="process-group timeout"
    )
    run.add_argument(
        "--run-timeout-s",
        type=flags.seconds,
        help="limit of the whole run (default 4 x pg timeout + 60)",
    )
    run.add_argument("--out", type=Path, required=True, help="dataset folder to write")
    run.add_argument(
        "--max-attempts",
        type=flags.attempts,
        default=2,
        help="attempts of a cell whose failure is transient (a rank crashed or timed out); a "
        "deterministic failure is not run again (default 2, as a matrix's run.max_attempts)",
    )
    run.add_argument(
        "--retry-failed",
        action="store_true",
        help="run the cell again if its last attempt failed, with a fresh attempt budget (as "
        "a sweep's --retry-failed)",
    )
    run.add_argument(
        "--wait-lock",
        type=flags.wait_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another driver using the same --out (default: fail at once)",
    )
    run.set_defaults(func=_run)

    sweep = sub.add_parser("sweep", help="run a matrix on Ray (same as sweeps/run_matrix.py)")
    _optional(chosen == "sweep", "commprof.sweeps.run_matrix", sweep)
    sweep.set_defaults(func=_sweep)

    estimate = sub.add_parser("estimate", help="predict all-reduce and exposed communication")
    _optional(chosen == "estimate", "commprof.commands.estimate", estimate)
    estimate.set_defaults(func=_estimate)

    collective = sub.add_parser("collective", help="predicted nccl-tests table for a cluster")
    _optional(chosen == "collective", "commprof.commands.collective", collective)
    collective.set_defaults(func=_collective)

    analyze = sub.add_parser("analyze", help="overlap metrics from a folder of rank traces")
    analyze.add_argument(
        "trace_dir",
        type=Path,
        help="folder of Kineto/chrome traces, or a sweep's dataset folder (each cell's traces)",
    )
    analyze.add_argument("--out", type=Path, help="write the tables as Parquet here")
    analyze.add_argument(
        "--json", action="store_true", help="print one JSON document (steps, ranks, cross_rank)"
    )
    analyze.add_argument("--regime", choices=(*REGIMES, "cuda-single"), help="force the rule table")
    analyze.add_argument(
        "--workers",
        type=flags.positive_int,
        metavar="N",
        help="local processes parsing traces (default: one per trace, at most one per CPU)",
    )
    analyze.add_argument(
        "--ray",
        action="store_true",
        help="parse the traces as Ray tasks, on the cluster a sweep would use (RAY_ADDRESS, or "
        "the one `ray start` recorded here), else on a Ray of its own",
    )
    analyze.add_argument(
        "--address", help="Ray cluster to parse on (implies --ray; files readable there)"
    )
    analyze.add_argument(
        "--unlaunched",
        choices=("keep", "drop"),
        default="keep",
        help="device kernels with no launch event in the trace (launched before profiling "
        "started): keep them (default) or drop them (HolisticTraceAnalysis' rule)",
    )
    analyze.add_argument(
        "--perfetto",
        type=Path,
        metavar="OUT.json",
        help="write every rank as one trace on one clock (estimated offsets applied, "
        "collectives linked across ranks) for Perfetto or chrome://tracing",
    )
    analyze.add_argument(
        "--rules",
        type=Path,
        metavar="FILE",
        help="YAML file of communication-kernel rules that add to or override the shipped ones "
        "(docs/analyze_rules.md); default: the file COMMPROF_RULES names, if set",
    )
    analyze.set_defaults(func=_analyze)

    for name, help_text in (
        ("figures", "figures and tables from a dataset folder"),
        (
            "report",
            "the two reports from a dataset folder: self-contained HTML pages (always) and PDFs "
            "(where LaTeX is installed)",
        ),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("results", type=Path, help="the dataset folder (results/<sweep>/)")
        cmd.add_argument("--out", type=Path, help="output folder (default RESULTS/report/)")
        if name == "report":
            cmd.add_argument(
                "--pdf",
                choices=("auto", "yes", "no"),  # commprof.reporting.build.PDF_CHOICES
                default="auto",
                help="the PDFs: where LaTeX is installed (auto, the default), required (yes: "
                "exit 1 without LaTeX) or not built (no); the HTML reports are always written",
            )
        cmd.set_defaults(func=_figures if name == "figures" else _report)

    args = parser.parse_args(argv)
    from commprof.extras import MissingExtra, missing_extra

    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError, MissingExtra) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        extra = missing_extra(err, f"commprof {args.command}")
        if extra is None:
            raise
        print(f"error: {extra}", file=sys.stderr)
        return 2


MAX_RANKS_PER_CORE = 8
"""Most ranks ``commprof run`` starts per core of this machine (tests run 4 on 2 cores)."""
RUN_FLAG_DEFAULTS: dict[str, tuple[Any, str]] = {
    "device": (None, "default: cuda for nccl, else cpu"),
    "bucket_cap_mb": (25.0, "default: 25"),
}
"""``commprof run`` defaults that differ from the cell's, with what the help says of them: the
device follows the backend, and the cap (which a matrix must give) is 25 MiB."""


def _cell_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per cell field declared ``flag`` (``commprof.matrix.FieldSpec``)."""
    from commprof.matrix import CELL_FIELDS, Cell, field_types

    defaults = {f.name: f.default for f in dataclasses.fields(Cell)}
    for name, spec in CELL_FIELDS.items():
        if not spec.flag:
            continue
        flag = "--" + name.replace("_", "-")
        default, said = RUN_FLAG_DEFAULTS.get(name, (defaults[name], ""))
        unit = f" ({spec.unit})" if spec.unit else ""
        if field_types(name) == (bool,):
            parser.add_argument(flag, action="store_true", help=spec.help)
            continue
        types = field_types(name)
        value_type = flags.cap if type(None) in types else types[-1]
        kwargs: dict[str, Any] = {"type": value_type, "help": spec.help + unit}
        if said:
            kwargs["help"] += f"; {said}"
        if default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
        if spec.choices:
            kwargs["choices"] = spec.choices
        parser.add_argument(flag, **kwargs)


def _optional(chosen: bool, module: str, parser: argparse.ArgumentParser) -> None:
    """Let a module add its flags (it owns them), only where its command was chosen."""
    if chosen:
        importlib.import_module(module).add_arguments(parser)


def _check(args: argparse.Namespace) -> int:
    matrix = None
    if args.matrix is not None:  # first: a bad matrix is said before anything is probed
        from commprof.matrix import load
        from commprof.sweeps.run_matrix import matrix_path

        matrix = load(matrix_path(args.matrix))
    report: dict[str, Any] = {"commprof": __version__, "python": platform.python_version()}
    for name in ("torch", "ray", "numpy", "pandas", "pyarrow", "scipy", "matplotlib", "yaml"):
        try:
            report[name] = importlib.import_module(name).__version__
        except ImportError:
            report[name] = None
    report["backends"], report["devices"] = _torch_devices()
    said, report["ray_cluster"], report["ray_nodes"] = (
        _ray_resources()
        if report["ray"]
        else ("none (no ray: pip install commprof[run])", None, [])
    )
    report["ray_cluster_state"] = said
    if matrix is not None:
        from commprof.sweeps.guard import GuardPlan, estimate_cell_s, estimate_sweep_s

        guard = GuardPlan(matrix, local=_local_budgets())
        embedded = report["ray_cluster"] is None  # a sweep would start its own Ray here
        load_1m = os.getloadavg()[0]
        feasible = [(c, guard.num_params(c)) for c in matrix.cells if guard.decide(c).feasible]
        cells = []
        for cell in matrix.cells:
            decision = guard.decide(cell)
            cells.append(
                {
                    "cell_id": cell.cell_id,
                    **{k: getattr(cell, k) for k in ("model", "world_size", "bucket_cap_mb")},
                    **{k: getattr(cell, k) for k in ("backend", "device", "placement", "repeat")},
                    "feasible": decision.feasible,
                    "reason": decision.reason,
                    "guard": decision.explain(),
                    "estimate_s": round(estimate_cell_s(cell, guard.num_params(cell)), 1),
                }
            )
        report["matrix"] = {
            "name": matrix.name,
            "file": matrix.source,
            "num_cells": len(cells),
            "num_rejected": sum(not c["feasible"] for c in cells),
            # the cells one at a time, a gang per shape, the driver's start, at this load
            "estimate_s": round(
                estimate_sweep_s(
                    feasible, embedded=embedded, load_1m=load_1m, num_cpus=os.cpu_count() or 1
                ),
                1,
            ),
            "estimate_load_1m": round(load_1m, 2),
            "cells": cells,
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for key in ("commprof", "python", "torch", "ray", "numpy", "pandas", "pyarrow"):
        print(f"{key:>12}: {report[key]}")
    print(f"{'backends':>12}: {report['backends'] or 'none (no torch: pip install commprof[run])'}")
    print(f"{'devices':>12}: {report['devices']}")
    resources = report["ray_cluster"]
    cpus = (
        f" ({resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs)"
        if resources
        else ""
    )
    print(f"{'ray cluster':>12}: {report['ray_cluster_state']}{cpus}")
    for node in report["ray_nodes"]:
        kind = f" ({node['accelerator']})" if node["accelerator"] else ""
        gpus, cpus = f"{node['gpus']:g} GPUs{kind}", f"{node['cpus']:g} CPUs"
        print(f"{'ray node':>12}: {node['address']}: {gpus}, {cpus}")
    if "matrix" in report:
        from commprof.caps import cap_label

        m = report["matrix"]
        print(
            f"\nmatrix {m['name']!r} ({m['file']}): {m['num_cells']} cells, "
            f"{m['num_rejected']} rejected by the memory guard, "
            f"estimated {m['estimate_s']:.0f} s to run (one cell at a time; this machine's load "
            f"{m['estimate_load_1m']:.1f} on {os.cpu_count()} cores counted where Ray is embedded)"
        )
        reasons = collections.Counter(c["reason"] for c in m["cells"])
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            print(f"  {count:>6} {reason}")
        if not args.cells:
            print("  (--cells lists every cell with the guard's arithmetic)")
            return 0
        for c in m["cells"]:
            mark = "ok      " if c["feasible"] else "REJECTED"
            cap = cap_label(c["bucket_cap_mb"]).replace(" ", "")
            print(
                f"  {c['cell_id']} {mark} {c['model']:>10} ws={c['world_size']} "
                f"cap={cap} {c['backend']}/{c['device']} {c['placement']} "
                f"r{c['repeat']} ~{c['estimate_s']}s"
            )
            if not c["feasible"]:
                print("      " + c["guard"].replace("\n", "\n      "))
    return 0


def _torch_devices() -> tuple[dict[str, bool] | None, dict[str, Any]]:
    """The backends torch.distributed has and the GPUs torch sees (None and none without
    torch: the light install)."""
    devices: dict[str, Any] = {"cpu_count": os.cpu_count(), "cuda": []}
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None, devices
    devices["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available()}, devices


def _local_budgets() -> Any:
    """This machine's memory budgets, its GPUs included where torch is installed."""
    from commprof.modeling import memory

    try:
        from commprof.training.devices import cuda_memory_bytes
    except ImportError:  # the light install has no torch, so no GPU a rank could use
        return memory.detect_budgets()
    return memory.detect_budgets(device_bytes=cuda_memory_bytes())


def _ray_resources() -> tuple[str | None, dict[str, float] | None, list[dict[str, Any]]]:
    """The cluster a sweep would attach to, in words; its resources and the GPUs Ray sees on
    each alive node where it answers. Never starts a cluster; a probe bounds the wait
    (``commprof.ray_address.probe``) where ``ray.init`` would retry for 20 s or more."""
    from commprof.ray_address import NEEDS_TOKEN, cluster_address, negotiate

    address = cluster_address()  # the driver's rule: never another driver's embedded Ray
    if address is None:
        return "none found (sweeps start an embedded one)", None, []
    answer = negotiate(address)  # token authentication as the driver turns it on
    if answer == "unreachable":
        return (
            f"{address}: not reachable (a sweep fails to connect: start the cluster, or unset "
            "RAY_ADDRESS for an embedded Ray)",
            None,
            [],
        )
    if answer == "needs a token":
        return f"{address}: {NEEDS_TOKEN}", None, []
    import ray

    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError) as err:
        return f"{address}: reachable, but ray.init failed: {str(err).splitlines()[0]}", None, []
    try:
        resources = dict(ray.cluster_resources())
        return f"{address}: answers", resources, ray_nodes(ray.nodes())
    finally:
        ray.shutdown()


def ray_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per alive node of ``ray.nodes()``: address, GPUs and CPUs Ray counts, accelerator type."""
    out = []
    for node in nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        kinds = [k.partition(":")[2] for k in resources if k.startswith("accelerator_type:")]
        out.append(
            {
                "address": node.get("NodeManagerAddress"),
                "gpus": float(resources.get("GPU", 0)),
                "cpus": float(resources.get("CPU", 0)),
                "accelerator": ",".join(sorted(kinds)) or None,
            }
        )
    return sorted(out, key=lambda n: str(n["address"]))


def _run(args: argparse.Namespace) -> int:
    from commprof import results
    from commprof.lock import DatasetLock, DatasetLocked
    from commprof.matrix import CELL_FIELDS, Cell
    from commprof.sweeps.guard import GuardPlan

    device = args.device or ("cuda" if args.backend == "nccl" else "cpu")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                f"--device cuda (or --backend nccl) needs a GPU, and torch {torch.__version__} "
                "sees none here; use --backend gloo --device cpu"
            )
    flagged = {name: getattr(args, name) for name, spec in CELL_FIELDS.items() if spec.flag}
    cell = Cell(**{**flagged, "device": device})
    decision = GuardPlan(local=_local_budgets()).decide(cell)
    cores = os.cpu_count() or 1
    if cell.world_size > MAX_RANKS_PER_CORE * cores:
        raise ValueError(
            f"--world-size {cell.world_size}: this machine has {cores} cores, and commprof run "
            f"starts at most {MAX_RANKS_PER_CORE} ranks per core; use a sweep on a cluster"
        )
    if not decision.feasible:
        raise ValueError(
            f"--world-size {cell.world_size} does not fit this machine ({decision.reason}):\n"
            + decision.explain()
        )
    results.check_writable(args.out)  # before any rank starts
    try:
        with DatasetLock(args.out, wait_s=args.wait_lock) as lock:
            return _run_cell(args, cell, decision, lock)
    except DatasetLocked as err:  # LockLost too: taken over, stopped before writing
        print(f"error: {err}", file=sys.stderr)
        return 3
    except results.CommitFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _run_cell(args: argparse.Namespace, cell: Any, decision: Any, lock: Any) -> int:
    """Run one cell into the dataset folder this process owns now (every write under
    ``lock.writing()``: a process that lost the folder stops before writing).

    What runs is decided as a sweep decides it (:mod:`commprof.attempts`): a complete cell is
    not run again, an earlier failure that would repeat or used its attempts stands unless
    ``--retry-failed``, and a transient failure runs again while the attempts last.
    """
    from commprof import results
    from commprof.attempts import FailurePolicy, plan_cells, resume_state
    from commprof.catalog import count_parameters
    from commprof.matrix import RUN_SWEEP
    from commprof.outcomes import RankFailure
    from commprof.training.launcher import run_local

    policy = FailurePolicy(max_attempts=args.max_attempts)
    with lock.writing():  # setting damaged attempts aside moves files
        latest = resume_state(args.out)
    plan = plan_cells([cell], latest, lambda _: True, policy, retry_failed=args.retry_failed)
    if cell.cell_id in plan.skipped:
        print(
            f"cell {cell.cell_id} is already complete in {args.out}; "
            "pass --repeat N for another measurement of it",
            file=sys.stderr,
        )
        return 0
    if not plan.todo:
        if args.retry_failed:  # as a sweep's: it touches failed cells only
            print(f"cell {cell.cell_id} has no failed attempt in {args.out} to run again")
            return 0
        print(
            f"error: cell {cell.cell_id} failed earlier in {args.out} (its error would repeat, "
            "or it used its attempts); pass --retry-failed to run it again",
            file=sys.stderr,
        )
        return 1
    _, attempt = plan.todo[0]
    base = plan.budget_base[cell.cell_id]
    while True:
        started, t0 = time.time(), time.monotonic()
        common: dict[str, Any] = {
            "sweep": RUN_SWEEP,
            "attempt": attempt,
            "num_params": count_parameters(cell.model),
            "guard": decision.to_record(),
            "nodes": [platform.node()],
            "started_unix_s": started,
        }
        try:
            per_rank = run_local(cell, timeout_s=args.pg_timeout_s, limit_s=args.run_timeout_s)
            break
        except RankFailure as err:
            common["wall_s"] = time.monotonic() - t0
            with lock.writing():
                results.commit_attempt(
                    args.out, cell, error=str(err), error_kind=err.kind, **common
                )
            if not policy.retry(err.kind, attempt - base):
                print(
                    f"error: cell {cell.cell_id} failed (attempt {attempt}, {err.kind}): {err}",
                    file=sys.stderr,
                )
                return 1
            print(
                f"cell {cell.cell_id} attempt {attempt} failed (transient); running it again: "
                f"{err}",
                file=sys.stderr,
            )
            attempt += 1
    wall_s = common["wall_s"] = time.monotonic() - t0
    with lock.writing():
        results.commit_attempt(args.out, cell, per_rank=per_rank, **common)
    from commprof.analysis.summary import summary_table

    print(summary_table(results.load(args.out), [cell.cell_id]))
    print(f"cell {cell.cell_id} done in {wall_s:.2f} s; dataset: {args.out}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from commprof.sweeps.run_matrix import run

    return run(args)


def _estimate(args: argparse.Namespace) -> int:
    """``commprof estimate``: one request, checked before anything runs, one prediction
    (``commprof.commands.estimate.main``)."""
    from commprof.commands.estimate import main

    return main(args)


def _collective(args: argparse.Namespace) -> int:
    from commprof.commands.collective import run

    return run(args)


def _figures(args: argparse.Namespace) -> int:
    from commprof.reporting.build import figures_main

    return figures_main(args.results, args.out)


def _report(args: argparse.Namespace) -> int:
    from commprof.reporting.build import report_main

    return report_main(args.results, args.out, pdf=args.pdf)


def _analyze(args: argparse.Namespace) -> int:
    from commprof.traces.analyze import run

    return int(
        run(
            args.trace_dir,
            args.out,
            args.json,
            args.regime,
            workers=args.workers,
            use_ray=args.ray,
            address=args.address,
            unlaunched=args.unlaunched,
            perfetto_out=args.perfetto,
            rules=args.rules,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
