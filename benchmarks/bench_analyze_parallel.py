"""Benchmark: ``commprof analyze`` on 8 rank traces with 1 worker vs 2 workers, side by side.

The folder holds 8 cuda-nccl rank traces built by make_nccl_trace.py (ranks 0 to 7 of one
simulated job, ``--min-events`` events each, about 100,000 by default, so that parsing
dominates). Each timed run is a fresh process that calls
``commprof.traces.analyze.analyze(folder, workers=N)`` (parse every trace, step metrics,
the cross-rank line-up) and reports the wall time of that call alone, imports excluded; the
pool's start (a forkserver and its workers importing the parser) is inside the timed call, as
a user pays it. The sides alternate (1, 2, 1, 2, ...) so that a change of load hits both; the
ratio quoted is median(1 worker) / median(2 workers). Both sides must give the same tables.
Before each pair a control measures what parallelism the machine gives at that moment: two
equal pure-Python loops one after the other vs on two forked processes at once (2.0 on two idle
cores, 1.0 where other work leaves one core's worth).

Usage::

    python benchmarks/bench_analyze_parallel.py                      # ~100k events a rank
    python benchmarks/bench_analyze_parallel.py --min-events 5000 --out /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ledger

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_OUT = HERE / "results" / "analyze_parallel.json"
DEFAULT_TRACE_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "commprof-bench" / "ranks8"
NUM_RANKS = 8
SIDES = (1, 2)
"""Worker counts compared."""


def _worker(trace_dir: Path, workers: int) -> int:
    """Timed side (fresh process): analyze the folder, print wall time and a checksum."""
    from commprof.traces.analyze import analyze

    t0, c0 = time.perf_counter(), os.times()
    result = analyze(trace_dir, workers=workers)
    wall_s, c1 = time.perf_counter() - t0, os.times()
    # CPU seconds of this process and its finished workers: the pool's own cost shows here,
    # while the wall time also moves with the machine's load.
    cpu_s = sum(c1[:4]) - sum(c0[:4])
    steps = result.steps
    assert result.cross is not None
    check = {
        "num_ranks": int(steps["rank"].nunique()),
        "num_steps": len(steps),
        "comm_ns": int(steps["comm_ns"].sum()),
        "overlap_ns": int(steps["overlap_ns"].sum()),
        "num_matched_collectives": len(result.cross.collectives),
    }
    print(json.dumps({"workers": workers, "wall_s": wall_s, "cpu_s": cpu_s, "check": check}))
    return 0


SPIN_ITERATIONS = 10_000_000
"""Pure-Python loop of the control (about 0.5 s of CPU here)."""


def _spin(n: int = SPIN_ITERATIONS) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def _control() -> int:
    """Control (fresh process): two equal CPU-bound tasks one after the other, then on two
    forked processes at once; the ratio of the walls is the parallelism the machine gives now
    (2.0 on two idle cores, 1.0 where the others leave one core's worth)."""
    import multiprocessing

    t0 = time.perf_counter()
    _spin()
    _spin()
    serial_s = time.perf_counter() - t0
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_spin) for _ in range(2)]
    t1 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    parallel_s = time.perf_counter() - t1
    print(json.dumps({"serial_s": serial_s, "parallel_s": parallel_s}))
    return 0


def build_traces(trace_dir: Path, min_events: int) -> list[dict[str, Any]]:
    """Write ranks 0..7 of one simulated job into ``trace_dir`` (one file a rank)."""
    sys.path.insert(0, str(HERE))
    from make_nccl_trace import TraceSpec, write_trace

    trace_dir.mkdir(parents=True, exist_ok=True)
    built = []
    for rank in range(NUM_RANKS):
        with tempfile.TemporaryDirectory(dir=trace_dir.parent) as tmp:
            info = write_trace(TraceSpec(min_events=min_events, rank=rank), Path(tmp))
            src = Path(info["path"])
            shutil.move(src, trace_dir / src.name)
            info["path"] = str(trace_dir / src.name)
        built.append(info)
    return built


def _fresh(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _run_side(trace_dir: Path, workers: int) -> dict[str, Any]:
    return _fresh(["--_worker", str(workers), str(trace_dir)])


def headline(result: dict[str, Any]) -> str:
    """The ledger's figures: median wall 1 worker / 2 workers, the control's parallelism, the
    median CPU seconds of each side, the load average."""
    cpu = result["median_cpu_s"]
    load = result["machine"]["loadavg_start"][0], result["machine"]["loadavg_end"][0]
    return (
        f"1 worker / 2 workers {result['speedup_2_vs_1']:.2f} (control "
        f"{result['control_parallelism']:.2f}); CPU s {cpu['1']:.2f} / {cpu['2']:.2f}; "
        f"load {load[0]:.1f} to {load[1]:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR)
    parser.add_argument("--min-events", type=int, default=100_000, help="events per rank trace")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ledger.add_change_argument(parser)
    parser.add_argument("--_worker", nargs=2, metavar=("WORKERS", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--_control", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._control:
        return _control()
    if args._worker:
        return _worker(Path(args._worker[1]), int(args._worker[0]))
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    trace_dir: Path = args.trace_dir
    if args.rebuild and trace_dir.exists():
        shutil.rmtree(trace_dir)
    built: list[dict[str, Any]] = []
    if len(list(trace_dir.glob("*.json.gz"))) != NUM_RANKS:
        built = build_traces(trace_dir, args.min_events)
    files = sorted(trace_dir.glob("*.json.gz"))
    for f in files:  # page cache: both sides read warm files
        f.read_bytes()
    result: dict[str, Any] = {
        "benchmark": "analyze_parallel",
        "what": f"analyze(folder of {NUM_RANKS} rank traces, workers=N), N in {list(SIDES)}",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "num_cpus": os.cpu_count(),
            "loadavg_start": list(os.getloadavg()),
        },
        "traces": {
            "num_files": len(files),
            "bytes_each": [f.stat().st_size for f in files],
            "built": built,
        },
        "runs": [],
    }
    result["control"] = []
    for i in range(args.repeats):
        control = _fresh(["--_control"])
        control["repeat"] = i
        result["control"].append(control)
        for workers in SIDES:
            run = _run_side(trace_dir, workers)
            run["repeat"] = i
            result["runs"].append(run)
            print(
                f"repeat {i} workers={workers}: {run['wall_s']:.2f} s wall, "
                f"{run['cpu_s']:.2f} s CPU, load {os.getloadavg()[0]:.1f}",
                file=sys.stderr,
            )
    checks = {json.dumps(r["check"], sort_keys=True) for r in result["runs"]}
    if len(checks) != 1:
        raise RuntimeError(f"the sides disagree: {sorted(checks)}")
    med = {
        w: statistics.median(r["wall_s"] for r in result["runs"] if r["workers"] == w)
        for w in SIDES
    }
    result["median_wall_s"] = {str(w): med[w] for w in SIDES}
    result["speedup_2_vs_1"] = med[1] / med[2]
    result["control_parallelism"] = statistics.median(
        c["serial_s"] / c["parallel_s"] for c in result["control"]
    )
    result["median_cpu_s"] = {
        str(w): statistics.median(r["cpu_s"] for r in result["runs"] if r["workers"] == w)
        for w in SIDES
    }
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"1 worker {med[1]:.2f} s, 2 workers {med[2]:.2f} s: "
        f"{result['speedup_2_vs_1']:.2f}x (medians of {args.repeats}); the machine's "
        f"parallelism for two CPU-bound processes meanwhile: {result['control_parallelism']:.2f}x "
        f"(2.0 on two idle cores); wrote {args.out}"
    )
    ledger.print_row(
        "analyze_parallel", change=args.change, figures=headline(result), files=[args.out]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
