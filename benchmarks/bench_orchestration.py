"""Benchmark: what the sweep driver itself costs, per cell, over a whole matrix, in memory.

The real driver (``commprof.sweeps.driver.Driver``) runs tiny cells (srn-100k, 2 gloo ranks on CPU,
3 steps, ``benchmarks/matrices/orchestration_*.yaml``) on a real local Ray that this script
starts with ``ray.init(num_cpus=N)``. Three measurements, one run:

a. Overhead per cell with gang reuse (20 cells, one gang). For every finished attempt the
   driver's attempt wall time (``cells.wall_s``: from ``CellExecution`` start to the driver
   seeing the outcome) is paired with the slowest rank's own wall time (``cells.rank_wall_s``,
   from the ``wall_s`` that ``RankActor.run`` returns: TCPStore, process group, training,
   microbenchmark, barrier and destroy). overhead = driver wall - rank wall. The end-to-end share,
   (driver ``run()`` wall - sum of rank walls) / cells, adds what happens between attempts
   (writing Parquet, planning, the first gang's start). For comparison, the same cells run
   directly with ``commprof.training.launcher.run_local``, which starts fresh processes (and
   ``import torch``) every cell while the driver's gang is reused. Goal: overhead <= 0.5 s.
b. Makespan of 40 cells against the ideal, sum of the ranks' cell times / concurrency, where
   concurrency = num_cpus // world_size (2-rank cells, one CPU a rank). Goal: <= 1.15. The
   ratio is given with and without the first gang's start (process start and ``import torch``,
   paid once per driver run).
c. 100 cells with the driver's resident memory sampled from ``/proc/self/status`` (VmRSS)
   every few finished cells: first, last and peak sample.

Also recorded per part: the driver process's CPU time (``getrusage``), which on a small machine
competes with the ranks, and how often the driver called ``ray.cluster_resources()`` (a GCS
round trip), counted by a pass-through wrapper. The driver's own code is not changed by this
script.

Usage::

    python benchmarks/bench_orchestration.py                  # about 2 to 3 min on 2 cores
    python benchmarks/bench_orchestration.py --num-cpus 4     # 2 cells at once
    python benchmarks/bench_orchestration.py --smoke          # seconds: 4 cells a part
"""

from __future__ import annotations

import argparse
import datetime
import functools
import io
import json
import logging
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
# one machine: gloo over loopback (docs/design.md, Measured facts)
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import ledger  # noqa: E402
import ray  # noqa: E402

from commprof import matrix as matrix_mod  # noqa: E402
from commprof import results  # noqa: E402
from commprof.actors.gang import ACTOR_NAMESPACE  # noqa: E402
from commprof.sweeps.driver import Driver, DriverOptions  # noqa: E402
from commprof.training.launcher import run_local  # noqa: E402

MATRICES = HERE / "matrices"
DEFAULT_OUT = HERE / "results" / "orchestration.json"
GOAL_OVERHEAD_S = 0.5
"""Driver overhead per cell (driver attempt wall - rank wall), at most."""
GOAL_MAKESPAN_RATIO = 1.15
"""Makespan / ideal, at most."""
RSS_EVERY_CELLS = 5
"""Sample the driver's RSS after every this many finished cells."""
OBJECT_STORE_BYTES = 256 * 1024**2
"""A small object store: records are kilobytes, and the machine is shared."""


def rss_kib() -> int:
    """Resident set size of this process now (``VmRSS`` in ``/proc/self/status``), KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS line in /proc/self/status (this benchmark needs Linux)")


def cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CallCounter:
    """Counts calls of ``ray.cluster_resources`` and the wall time spent in them."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.calls = 0
        self.seconds = 0.0
        functools.update_wrapper(self, fn)

    def __call__(self) -> dict[str, float]:
        t0 = time.perf_counter()
        try:
            return self.fn()
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - t0


class InstrumentedDriver(Driver):
    """The real driver; after each finished attempt it also times the attempt's write and,
    every few cells, samples the driver's RSS."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.finish_s: dict[str, float] = {}
        self.rss_samples: list[tuple[int, int]] = []

    def _finish(
        self, cell: Any, gang: Any, started: float, outcome: Any, attempt: int, queue: Any
    ) -> None:
        t0 = time.perf_counter()
        super()._finish(cell, gang, started, outcome, attempt, queue)
        self.finish_s[cell.cell_id] = time.perf_counter() - t0
        done = len(self.finish_s)
        if done == 1 or done % RSS_EVERY_CELLS == 0:
            self.rss_samples.append((done, rss_kib()))


def run_driver(matrix_file: Path, out_dir: Path, limit: int | None) -> dict[str, Any]:
    """Run a matrix through the instrumented driver into a fresh dataset folder."""
    matrix = matrix_mod.load(matrix_file)
    only: tuple[str, ...] = ()
    if limit is not None:  # smoke: the first `limit` cells, by id prefix
        only = tuple(c.cell_id for c in matrix.cells[:limit])
    driver = InstrumentedDriver(matrix, DriverOptions(out=out_dir, only=only), stream=io.StringIO())
    counter = CallCounter(ray.cluster_resources)
    ray.cluster_resources = counter  # type: ignore[assignment]  # counted, passed through
    rss_start = rss_kib()
    cpu0, t0 = cpu_s(), time.monotonic()
    try:
        summary = driver.run()
    finally:
        ray.cluster_resources = counter.fn  # type: ignore[assignment]
    wall_s, driver_cpu_s = time.monotonic() - t0, cpu_s() - cpu0
    cells = results.load(out_dir)["cells"]
    if summary.failed or len(cells) != len(driver.finish_s):
        raise RuntimeError(f"{matrix_file.name}: {summary.failed} failed cells; see {out_dir}")
    # per attempt, in the order they finished: the driver's and the slowest rank's wall time
    driver_wall_s = dict(zip(cells["cell_id"], cells["wall_s"].astype(float), strict=True))
    rank_wall_s = dict(zip(cells["cell_id"], cells["rank_wall_s"].astype(float), strict=True))
    attempts = [
        {
            "cell_id": cell_id,
            "driver_wall_s": driver_wall_s[cell_id],
            "rank_wall_s": rank_wall_s[cell_id],
            "finish_s": finish_s,
        }
        for cell_id, finish_s in driver.finish_s.items()
    ]
    return {
        "matrix": str(matrix_file.relative_to(HERE.parent)),
        "num_cells": summary.ok,
        "wall_s": wall_s,
        "driver_cpu_s": driver_cpu_s,
        "first_cell_started_unix_s": float(cells["started_unix_s"].min()),
        "last_cell_ended_unix_s": float((cells["started_unix_s"] + cells["wall_s"]).max()),
        "cluster_resources_calls": counter.calls,
        "cluster_resources_s": counter.seconds,
        "rss_start_kib": rss_start,
        "rss_samples": driver.rss_samples,
        "attempts": attempts,
    }


def describe(values: list[float]) -> dict[str, float]:
    """Median, mean, min and max of a list of seconds."""
    return {
        "median": statistics.median(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


def part_overhead(run: dict[str, Any], direct_s: list[float]) -> dict[str, Any]:
    """Part a: driver attempt wall vs the ranks' own wall, and vs ``run_local``."""
    attempts = run["attempts"]
    rank_s = [a["rank_wall_s"] for a in attempts]
    in_attempt = [a["driver_wall_s"] - r for a, r in zip(attempts, rank_s, strict=True)]
    between = (run["wall_s"] - sum(a["driver_wall_s"] for a in attempts)) / len(attempts)
    end_to_end = (run["wall_s"] - sum(rank_s)) / len(attempts)
    return {
        "rank_wall_s": describe(rank_s),
        "driver_attempt_wall_s": describe([a["driver_wall_s"] for a in attempts]),
        "overhead_in_attempt_s": describe(in_attempt),
        "overhead_between_attempts_s_mean": between,
        "overhead_end_to_end_s_mean": end_to_end,
        "finish_write_s": describe([a["finish_s"] for a in attempts]),
        "driver_per_cell_s_mean": run["wall_s"] / len(attempts),
        "run_local_per_cell_s": describe(direct_s) if direct_s else None,
        "run_local_minus_driver_per_cell_s": (
            statistics.fmean(direct_s) - run["wall_s"] / len(attempts) if direct_s else None
        ),
        "driver_cpu_s_per_cell": run["driver_cpu_s"] / len(attempts),
        "pass_overhead_in_attempt": statistics.median(in_attempt) <= GOAL_OVERHEAD_S,
        "pass_overhead_end_to_end": end_to_end <= GOAL_OVERHEAD_S,
    }


def part_makespan(run: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """Part b: makespan against sum(rank cell time) / concurrency."""
    rank_s = [a["rank_wall_s"] for a in run["attempts"]]
    attempt_s = [a["driver_wall_s"] for a in run["attempts"]]
    ideal = sum(rank_s) / concurrency
    after_gang = run["last_cell_ended_unix_s"] - run["first_cell_started_unix_s"]
    return {
        "concurrency": concurrency,
        "makespan_s": run["wall_s"],
        "makespan_from_first_cell_s": after_gang,
        "ideal_s": ideal,
        "ideal_from_driver_attempts_s": sum(attempt_s) / concurrency,
        "ratio": run["wall_s"] / ideal,
        "ratio_from_first_cell": after_gang / ideal,
        "startup_before_first_cell_s": run["first_cell_started_unix_s"] - run["t0_unix_s"],
        "pass": run["wall_s"] / ideal <= GOAL_MAKESPAN_RATIO,
        "pass_from_first_cell": after_gang / ideal <= GOAL_MAKESPAN_RATIO,
    }


def part_memory(run: dict[str, Any]) -> dict[str, Any]:
    """Part c: the driver's RSS across a long matrix."""
    samples = run["rss_samples"]
    first, last = samples[0][1], samples[-1][1]
    peak = max(kib for _, kib in samples)
    return {
        "rss_before_run_kib": run["rss_start_kib"],
        "rss_first_sample_kib": first,
        "rss_last_sample_kib": last,
        "rss_peak_sample_kib": peak,
        "growth_kib": last - first,
        "growth_kib_per_100_cells": (last - first) * 100 / max(1, samples[-1][0] - samples[0][0]),
        "samples": samples,
    }


def headline(report: dict[str, Any]) -> str:
    """The ledger's figures: driver overhead per cell (inside an attempt, end to end), makespan
    over ideal (with and without the first gang's start), driver RSS, GCS calls, the load."""
    overhead, makespan, memory = report["overhead"], report["makespan"], report["memory"]
    calls = report["driver"]["memory"]
    load = report["machine"]["loadavg_start"][0], report["machine"]["loadavg_end"][0]
    rss_mib = memory["rss_first_sample_kib"] / 1024, memory["rss_last_sample_kib"] / 1024
    return (
        f"overhead {overhead['overhead_in_attempt_s']['median']:.3f} s in an attempt, "
        f"{overhead['overhead_end_to_end_s_mean']:.3f} s end to end a cell; makespan / ideal "
        f"{makespan['ratio']:.2f} ({makespan['ratio_from_first_cell']:.2f} from the first cell); "
        f"RSS {rss_mib[0]:.0f} to {rss_mib[1]:.0f} MiB; cluster_resources "
        f"{calls['cluster_resources_calls']} calls for {calls['num_cells']} cells; "
        f"load {load[0]:.1f} to {load[1]:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the three parts once and write the result file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray")
    parser.add_argument("--direct-cells", type=int, default=5, help="cells run with run_local")
    parser.add_argument("--smoke", action="store_true", help="4 cells a part, no file written")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ledger.add_change_argument(parser)
    args = parser.parse_args(argv)
    limit = 4 if args.smoke else None
    world_size = 2
    concurrency = max(1, args.num_cpus // world_size)
    load_start = os.getloadavg()

    ray.init(
        num_cpus=args.num_cpus,
        include_dashboard=False,
        namespace=ACTOR_NAMESPACE,
        log_to_driver=False,
        logging_level=logging.WARNING,
        object_store_memory=OBJECT_STORE_BYTES,
    )
    runs: dict[str, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="commprof-bench-orch-") as tmp:
            for name in ("overhead", "makespan", "memory"):
                t0_unix = time.time()
                print(f"driver: {name} ...", file=sys.stderr, flush=True)
                matrix_file = MATRICES / f"orchestration_{name}.yaml"
                run = run_driver(matrix_file, Path(tmp) / name, limit)
                run["t0_unix_s"] = t0_unix
                runs[name] = run
                print(f"  {run['num_cells']} cells in {run['wall_s']:.1f} s", file=sys.stderr)
    finally:
        ray.shutdown()

    direct_s: list[float] = []
    cells = matrix_mod.load(MATRICES / "orchestration_overhead.yaml").cells
    for cell in cells[: min(args.direct_cells, limit or args.direct_cells)]:
        t0 = time.monotonic()
        run_local(cell, timeout_s=30)
        direct_s.append(time.monotonic() - t0)
    print(f"run_local: {len(direct_s)} cells in {sum(direct_s):.1f} s", file=sys.stderr)

    report = {
        "benchmark": "orchestration",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "host": platform.node(),
            "cpu_count": os.cpu_count(),
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
        },
        "versions": {"python": platform.python_version(), "ray": ray.__version__},
        "num_cpus": args.num_cpus,
        "goals": {"overhead_s": GOAL_OVERHEAD_S, "makespan_ratio": GOAL_MAKESPAN_RATIO},
        "overhead": part_overhead(runs["overhead"], direct_s),
        "makespan": part_makespan(runs["makespan"], concurrency),
        "memory": part_memory(runs["memory"]),
        "driver": {
            name: {
                "num_cells": r["num_cells"],
                "wall_s": r["wall_s"],
                "driver_cpu_s": r["driver_cpu_s"],
                "cluster_resources_calls": r["cluster_resources_calls"],
                "cluster_resources_s": r["cluster_resources_s"],
            }
            for name, r in runs.items()
        },
        "raw": {name: r["attempts"] for name, r in runs.items()},
    }
    text = json.dumps(report, indent=2)
    if args.smoke:
        print(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    brief = {k: report[k] for k in ("overhead", "makespan", "driver")}
    print(json.dumps({**brief, "memory": {**report["memory"], "samples": "..."}}, indent=2))
    if not args.smoke:
        ledger.print_row(
            "orchestration", change=args.change, figures=headline(report), files=[args.out]
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
