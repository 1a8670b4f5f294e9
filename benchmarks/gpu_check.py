"""GPU check: the CUDA code paths of commprof that a CPU machine cannot run, in one short script.

Checks (each runs in its own spawned processes and is reported, pass or fail, on its own):

1. ``nccl1-allreduce``: a cell on NCCL with world size 1 through ``run_local`` (trainer, timing
   hook around the plain all-reduce, all-reduce microbenchmark). Every bucket row must carry a
   CUDA-event ``device_latency_ns`` > 0; every microbenchmark row ``num_wrong == 0``; the
   interference arms (a GEMM on a side stream) give rows with finite slowdowns > 0.
2. ``nccl1-fp16``: the same with the fp16 compression hook inside the timing wrapper.
3. ``cuda-gloo2``: gloo over CUDA tensors, 2 ranks sharing GPU 0 (the cuda-gloo regime): the
   same record checks.
4. ``golden-cuda-nccl1`` and ``golden-cuda-gloo2``: a profiled cell (``profile: true``) through
   ``run_local``, the trainer's own profiled path (steps 2 to 4 traced, trace metrics computed
   in the ranks, which must give rows): one ``.json.gz`` trace per rank plus the timing hook's
   rows (``hook_buckets_rank{r}.json``) and, when analysis works, ``expected_metrics.json``, in
   the layout of ``tests/data/golden_gloo2``. The trace must hold CUDA kernels; the trace parser's
   detected regime must be the one the run used. NCCL kernels in the nccl1 trace are recorded
   but not required: with one rank NCCL may reduce by a local copy, or not at all.

5. ``attach-nccl1``: ``commprof.attach`` on NCCL, one rank on ``cuda:0``, a model outside the
   catalog, profiler over steps 2 to 4 (the session's CUDA path: events resolved only once they
   have completed, one sync at the end): the dataset must load with one ok cell, bucket rows
   with ``device_latency_ns`` > 0 for every recorded step, and one trace.
6. ``device-choice``: the rank's device from the GPU id a scheduler assigned
   (``launcher.device_for(..., device_index=)``, what a Ray rank actor passes): the last visible
   GPU is taken as given, one past it is a ConfigError naming the id.

Output goes to ``--out`` (default: ``$OUT`` when set, else ``./gpu_check_out``): the golden
trace folders and ``gpu_check.json`` (every check's figures and errors). Without CUDA the
script prints why and exits with status 2, touching nothing. Expected runtime on one H200:
well under a minute after process start-up (each spawn pays ``import torch`` and CUDA init).

Usage::

    python benchmarks/gpu_check.py [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(_ROOT))

from commprof.matrix import Cell  # noqa: E402
from commprof.outcomes import merge_rank_records, merge_rank_traces  # noqa: E402
from commprof.training.launcher import run_local  # noqa: E402

MODEL = "srn-10m"
"""Model of the record checks: 40 MB of gradients, three buckets at DDP's default cap."""
TRACE_MODEL = "srn-1m"
"""Model of the golden traces: small traces, still several buckets at TRACE_BUCKET_CAP_MB."""
TRACE_BUCKET_CAP_MB = 1.0
TRACE_FIRST_STEP, TRACE_STEPS = 2, 5
"""Golden traces: the trainer profiles its measured steps, 2, 3 and 4."""
PG_TIMEOUT_S = 60.0
MICROBENCH_SIZES_BYTES = (1 << 10, 1 << 20, 1 << 26)
"""1 KiB (latency), 1 MiB, 64 MiB (bandwidth)."""
NCCL_KERNEL_PREFIXES = ("ncclKernel", "ncclDevKernel")


def _nccl_version() -> str:
    version = torch.cuda.nccl.version()  # a tuple in recent torch, an int in old ones
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _record_checks(records: dict[str, list[dict[str, Any]]]) -> tuple[list[str], dict[str, Any]]:
    """Problems found in a cell's merged records, and the figures worth reporting."""
    problems: list[str] = []
    buckets = records.get("buckets", [])
    if not buckets:
        problems.append("no bucket rows")
    missing = [r for r in buckets if not isinstance(r["device_latency_ns"], int)]
    if missing:
        problems.append(f"{len(missing)} of {len(buckets)} bucket rows lack device_latency_ns")
    nonpositive = [r for r in buckets if isinstance(r["device_latency_ns"], int)]
    nonpositive = [r for r in nonpositive if r["device_latency_ns"] <= 0]
    if nonpositive:
        problems.append(f"{len(nonpositive)} bucket rows have device_latency_ns <= 0")
    disordered = [r for r in buckets if not r["ready_ns"] <= r["launch_ns"] <= r["done_ns"]]
    if disordered:
        problems.append(f"{len(disordered)} bucket rows break ready <= launch <= done")
    micro = records.get("microbench", [])
    if not micro:
        problems.append("no microbench rows")
    wrong = [r for r in micro if r["num_wrong"] != 0]
    if wrong:
        problems.append(f"microbench sizes with wrong elements: {[r['num_bytes'] for r in wrong]}")
    # the interference arms (on by default): a GEMM on a side stream against the all-reduce
    interference = records.get("interference", [])
    if not interference:
        problems.append("no interference rows")
    bad = [r for r in interference if not 0 < r["slowdown"] < float("inf")]
    if bad:
        problems.append(f"interference rows with a slowdown that is not > 0 and finite: {bad}")
    later = [r for r in buckets if r["step"] >= 1]
    measured = [s for s in records.get("steps", []) if s["measured"]]
    figures = {
        "num_bucket_rows": len(buckets),
        "buckets_per_step": len({r["bucket_index"] for r in later}),
        "bucket_bytes": sorted({r["num_bytes"] for r in later}),
        # host clock span of the hook (on NCCL the future completes at enqueue: expect it far
        # below the device latency, which is what latency_ns holds on CUDA)
        "median_host_latency_ns": _median([r["done_ns"] - r["ready_ns"] for r in later]),
        "median_device_latency_ns": _median(
            [r["device_latency_ns"] for r in later if r["device_latency_ns"] is not None]
        ),
        "median_transfer_ns": _median([r["transfer_ns"] for r in later]),
        "median_exposed_ns": _median([r["exposed_ns"] for r in later]),
        "median_step_ns": _median([s["step_ns"] for s in measured]),
        "microbench": [
            {k: r[k] for k in ("source", "num_bytes", "time_p50_ns", "busbw_gbps", "num_wrong")}
            for r in micro
        ],
        "interference": [
            {k: r[k] for k in ("arm", "num_bytes", "slowdown", "slowdown_q25", "slowdown_q75")}
            for r in interference
        ],
    }
    return problems, figures


def _cell_check(cell: Cell) -> Callable[[Path], tuple[list[str], dict[str, Any]]]:
    def check(_out: Path) -> tuple[list[str], dict[str, Any]]:
        per_rank = run_local(cell, timeout_s=PG_TIMEOUT_S)
        problems, figures = _record_checks(merge_rank_records(per_rank))
        figures["env"] = per_rank[0]["env"]
        return problems, figures

    return check


# ---------------------------------------------------------------------------------------
# Golden traces


def _kernel_summary(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    kernels = [e.get("name", "") for e in events if e.get("cat") == "kernel"]
    nccl = sorted({k for k in kernels if k.startswith(NCCL_KERNEL_PREFIXES)})
    return {
        "num_events": len(events),
        "num_kernels": len(kernels),
        "num_memcpy": sum(1 for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")),
        "nccl_kernel_names": [n[:120] for n in nccl[:10]],
        "num_gloo_annotations": sum(
            1 for e in events if str(e.get("name", "")).startswith("gloo:")
        ),
    }


def inspect_golden(
    trace_dir: Path, *, world_size: int, regime: str
) -> tuple[list[str], dict[str, Any]]:
    """Check a folder of golden traces and hook rows; write its expected_metrics.json.

    Args:
        trace_dir: The folder (``rank{r}_steps*.json.gz`` and ``hook_buckets_rank{r}.json``).
        world_size: Ranks expected.
        regime: The regime the run used; the parser must detect the same.

    Returns:
        Problems found, and figures (per-trace summaries, metrics).
    """
    problems: list[str] = []
    figures: dict[str, Any] = {"dir": str(trace_dir), "traces": {}}
    traces = sorted(trace_dir.glob("rank*.json.gz"))
    if len(traces) != world_size:
        problems.append(f"expected {world_size} traces, found {[p.name for p in traces]}")
    for path in traces:
        summary = _kernel_summary(path)
        summary["bytes"] = path.stat().st_size
        if summary["num_kernels"] == 0:
            problems.append(f"{path.name}: no CUDA kernels in the trace")
        try:
            from commprof.traces.trace_parser import parse_trace

            parsed = parse_trace(path)
            summary.update(
                regime=parsed.regime,
                step_ids=[int(s) for s in parsed.step_ids],
                num_collectives=len(parsed.collectives),
            )
            if parsed.regime != regime:
                problems.append(f"{path.name}: parser detected {parsed.regime}, not {regime}")
        except Exception as err:  # reported, not fatal: the trace itself is the product
            problems.append(f"{path.name}: parse_trace failed: {type(err).__name__}: {err}")
        figures["traces"][path.name] = summary
    for rank in range(world_size):
        rows = json.loads((trace_dir / f"hook_buckets_rank{rank}.json").read_text())
        if not rows or any(not r.get("device_latency_ns") for r in rows):
            problems.append(f"rank {rank}: hook rows missing or without device_latency_ns")
    try:
        from commprof.traces.analyze import analyze_dir
        from commprof.traces.report_text import step_json_rows

        records = step_json_rows(analyze_dir(trace_dir)["steps"])
        (trace_dir / "expected_metrics.json").write_text(json.dumps(records, indent=1) + "\n")
        figures["metrics"] = records
    except Exception as err:
        problems.append(f"analyze_dir failed: {type(err).__name__}: {err}")
    return problems, figures


def _golden_check(
    name: str, backend: str, world_size: int, regime: str, device: str = "cuda"
) -> Callable[[Path], tuple[list[str], dict[str, Any]]]:
    """A profiled cell through ``run_local`` (the trainer's own profiled path), its traces and
    hook rows written in the layout of ``tests/data/golden_gloo2`` and inspected there."""

    def check(out: Path) -> tuple[list[str], dict[str, Any]]:
        trace_dir = out / name
        trace_dir.mkdir(parents=True, exist_ok=True)
        for old in trace_dir.glob("*.json*"):
            old.unlink()
        cell = Cell(
            model=TRACE_MODEL,
            world_size=world_size,
            backend=backend,
            device=device,
            bucket_cap_mb=TRACE_BUCKET_CAP_MB,
            steps=TRACE_STEPS,
            warmup_steps=TRACE_FIRST_STEP,
            profile=True,
        )
        per_rank = run_local(cell, timeout_s=PG_TIMEOUT_S)
        for file_name, data in merge_rank_traces(per_rank).items():
            (trace_dir / file_name).write_bytes(data)
        records = merge_rank_records(per_rank)
        for rank in range(world_size):
            rows = [r for r in records["buckets"] if r["rank"] == rank]
            path = trace_dir / f"hook_buckets_rank{rank}.json"
            path.write_text(json.dumps(rows, indent=1) + "\n")
        problems, figures = inspect_golden(trace_dir, world_size=world_size, regime=regime)
        figures["trace_metrics"] = records.get("trace_metrics", [])
        if not figures["trace_metrics"]:
            problems.append("the profiled cell gave no trace_metrics rows")
        return problems, figures

    return check


# ---------------------------------------------------------------------------------------
# commprof.attach and the device choice

ATTACH_STEPS = 8


def _attach_rank(
    rank: int, world_size: int, store_path: str, out: str, backend: str = "nccl"
) -> dict[str, Any]:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import commprof
    from commprof.training.launcher import process_group

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.FileStore(store_path, world_size)
    with process_group(backend=backend, rank=rank, world_size=world_size, store=store):
        torch.manual_seed(0)
        net = nn.Sequential(
            nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 333), nn.Linear(333, 10)
        )
        ids = [rank] if device.type == "cuda" else None
        model = DistributedDataParallel(net.to(device), device_ids=ids, bucket_cap_mb=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with commprof.attach(model, out, profile_steps=range(2, 5)) as run:
            for _ in range(ATTACH_STEPS):
                x = torch.randn(64, 256, device=device)
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                run.step()
        cell_id = run.cell_id
        del model
    return {"cell_id": cell_id}


def _attach_check(out: Path, backend: str = "nccl") -> tuple[list[str], dict[str, Any]]:
    from commprof import results
    from commprof.training.launcher import spawn_ranks

    folder = out / "attach_nccl1"
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    (ranked,) = spawn_ranks(_attach_rank, 1, args=(str(folder), backend), limit_s=300)
    tables = results.load(folder)
    problems: list[str] = []
    cells = tables["cells"]
    if len(cells) != 1 or cells["status"].iloc[0] != "ok":
        problems.append(f"expected one ok cell, got {cells[['status']].to_dict('records')}")
    buckets = tables["buckets"]
    if buckets.empty or not (buckets["device_latency_ns"].fillna(0) > 0).all():
        problems.append("bucket rows missing or without device_latency_ns > 0")
    steps_with_buckets = sorted(set(buckets["step"])) if not buckets.empty else []
    if steps_with_buckets != list(range(ATTACH_STEPS)):
        problems.append(f"bucket rows for steps {steps_with_buckets}, not 0..{ATTACH_STEPS - 1}")
    traces = sorted((folder / "traces").glob("*/*.json.gz"))
    if len(traces) != 1:
        problems.append(f"expected one trace, found {[t.name for t in traces]}")
    figures = {
        "cell_id": ranked["cell_id"],
        "cells": cells.drop(columns=["checksums_json", "commit_sha256"]).to_dict("records"),
        "median_device_latency_ns": _median(buckets["device_latency_ns"].dropna().tolist()),
        "num_trace_metrics": len(tables["trace_metrics"]),
        "num_microbench": len(tables["microbench"]),
    }
    return problems, figures


def _device_choice_check(_out: Path) -> tuple[list[str], dict[str, Any]]:
    from commprof.training.launcher import ConfigError, device_for

    cell = Cell(model=TRACE_MODEL, world_size=1, bucket_cap_mb=1.0, device="cuda", backend="nccl")
    last = torch.cuda.device_count() - 1
    problems: list[str] = []
    chosen = device_for(cell, 0, device_index=last)
    if chosen != torch.device("cuda", last):
        problems.append(f"device_index {last} gave {chosen}")
    try:
        device_for(cell, 0, device_index=last + 1)
        problems.append(f"device_index {last + 1} was accepted with {last + 1} devices")
    except ConfigError as err:
        if str(last + 1) not in str(err):
            problems.append(f"the error does not name the GPU id: {err}")
    return problems, {"device_count": last + 1, "chosen": str(chosen)}


# ---------------------------------------------------------------------------------------


def _checks() -> list[tuple[str, Callable[[Path], tuple[list[str], dict[str, Any]]]]]:
    common: dict[str, Any] = {
        "model": MODEL,
        "device": "cuda",
        "bucket_cap_mb": 25.0,
        "steps": 8,
        "warmup_steps": 2,
        "batch_size": 32,
        "microbench_iters": 10,
    }
    return [
        (
            "nccl1-allreduce",
            _cell_check(
                Cell(
                    world_size=1,
                    backend="nccl",
                    hook="allreduce",
                    microbench_sizes_bytes=MICROBENCH_SIZES_BYTES,
                    **common,
                )
            ),
        ),
        ("nccl1-fp16", _cell_check(Cell(world_size=1, backend="nccl", hook="fp16", **common))),
        (
            "cuda-gloo2",
            _cell_check(
                Cell(
                    world_size=2,
                    backend="gloo",
                    microbench_sizes_bytes=MICROBENCH_SIZES_BYTES[:2],
                    **common,
                )
            ),
        ),
        ("golden-cuda-nccl1", _golden_check("golden_cuda_nccl1", "nccl", 1, "cuda-nccl")),
        ("golden-cuda-gloo2", _golden_check("golden_cuda_gloo2", "gloo", 2, "cuda-gloo")),
        ("attach-nccl1", _attach_check),
        ("device-choice", _device_choice_check),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = os.environ.get("OUT") or "gpu_check_out"
    parser.add_argument("--out", type=Path, default=Path(default_out))
    parser.add_argument("--only", nargs="*", help="run only the checks with these names")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            f"gpu_check: torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no "
            "CUDA device; run this script on a machine with a GPU.",
            file=sys.stderr,
        )
        return 2
    if not dist.is_nccl_available():
        print("gpu_check: this torch build has no NCCL; install a CUDA build.", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": _nccl_version(),
        "device": torch.cuda.get_device_name(0),
        "device_count": torch.cuda.device_count(),
        "checks": [],
    }
    for name, check in _checks():
        if args.only and name not in args.only:
            continue
        t0 = time.monotonic()
        entry: dict[str, Any] = {"name": name}
        try:
            problems, figures = check(args.out)
            entry.update(ok=not problems, problems=problems, figures=figures)
        except Exception as err:
            entry.update(ok=False, problems=[f"{type(err).__name__}: {err}"])
            entry["traceback"] = traceback.format_exc()
        entry["seconds"] = round(time.monotonic() - t0, 1)
        report["checks"].append(entry)
        status = "ok  " if entry["ok"] else "FAIL"
        print(f"[{status}] {name:<20} {entry['seconds']:6.1f} s  " + "; ".join(entry["problems"]))
        fig = entry.get("figures", {})
        if "median_device_latency_ns" in fig:
            print(
                f"       buckets/step {fig['buckets_per_step']}, median host latency "
                f"{fig['median_host_latency_ns']} ns, device latency "
                f"{fig['median_device_latency_ns']} ns, step {fig['median_step_ns']} ns"
            )
            for row in fig["microbench"]:
                print(
                    f"       microbench {row['source']:>6} {row['num_bytes']:>10} B: "
                    f"p50 {row['time_p50_ns']} ns, busbw {row['busbw_gbps']:.2f} GB/s, "
                    f"wrong {row['num_wrong']}"
                )
        for trace, summary in fig.get("traces", {}).items():
            print(
                f"       {trace}: {summary['bytes']} B, {summary['num_kernels']} kernels, "
                f"regime {summary.get('regime')}, nccl kernels {summary['nccl_kernel_names'][:2]}"
            )
    report["ok"] = all(c["ok"] for c in report["checks"])
    path = args.out / "gpu_check.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"{'all checks passed' if report['ok'] else 'SOME CHECKS FAILED'}; wrote {path}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
