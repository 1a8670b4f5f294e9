"""Benchmark: how close ``commprof check``'s sweep estimate comes to the sweep's wall time.

``commprof check sweeps/smoke.yaml --json`` prints the sweep's estimate (``matrix.estimate_s``:
``commprof.sweeps.guard.estimate_sweep_s``, the cells one at a time, a gang per shape, the
driver's start, scaled by this machine's contention at its 1-minute load average); just after
it, the README's demo sweep (``python sweeps/run_matrix.py --matrix sweeps/smoke.yaml``) runs
into a temporary folder, timed from start to exit. Recorded: the estimate, the wall time, their
ratio (wall / estimate; goal: within a factor of 2 either way) and the load average at start
and end, since the estimate is only as good as its load rule on a shared machine.

Each run is one sample at one load: the ledger's rows over time show how the ratio moves.

Usage::

    flock /tmp/commprof-bench.lock python benchmarks/bench_check_estimate.py   # 1 to 2 min
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import ledger  # noqa: E402

DEFAULT_OUT = HERE / "results" / "check_estimate.json"
MATRIX = "sweeps/smoke.yaml"
GOAL_FACTOR = 2.0
"""Goal: the wall time within this factor of the estimate, either way."""
SWEEP_TIMEOUT_S = 1800
"""A sweep that takes longer than this has failed the goal many times over."""


def _env() -> dict[str, str]:
    # this checkout's code wins over any installed commprof; gloo over loopback on one machine
    return {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"}


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout_s
    )


def measure() -> dict[str, Any]:
    """Run the check, then the sweep it estimates; their figures and the loads around them."""
    load_start = os.getloadavg()
    check = _run([sys.executable, "-m", "commprof", "check", MATRIX, "--json"], 300)
    if check.returncode != 0:
        raise SystemExit(f"commprof check failed:\n{check.stderr[-3000:]}")
    found = json.loads(check.stdout)["matrix"]
    with tempfile.TemporaryDirectory(prefix="commprof-bench-estimate-") as tmp:
        sweep = [sys.executable, "sweeps/run_matrix.py", "--matrix", MATRIX, "--out", tmp]
        started = time.monotonic()
        done = _run(sweep, SWEEP_TIMEOUT_S)
        wall_s = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"the sweep failed:\n{done.stderr[-3000:]}")
    summary = [line for line in done.stdout.splitlines() if " ok, " in line]
    return {
        "matrix": MATRIX,
        "num_cells": found["num_cells"],
        "estimate_s": found["estimate_s"],
        "estimate_load_1m": found["estimate_load_1m"],
        "wall_s": round(wall_s, 1),
        "ratio": round(wall_s / found["estimate_s"], 3),
        "within_goal": 1 / GOAL_FACTOR <= wall_s / found["estimate_s"] <= GOAL_FACTOR,
        "sweep_summary": summary[-1] if summary else None,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }


def headline(report: dict[str, Any]) -> str:
    """The ledger's figures: the ratio, the estimate and the wall time, the load last."""
    r = report["result"]
    return (
        f"wall / estimate {r['ratio']:.2f} ({r['wall_s']:.0f} s against {r['estimate_s']:.0f} s, "
        f"{r['num_cells']} cells); load {r['loadavg_start'][0]:.1f} to {r['loadavg_end'][0]:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run once and write the result file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ledger.add_change_argument(parser)
    args = parser.parse_args(argv)
    result = measure()
    report = {
        "benchmark": "check_estimate",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cpu_count": os.cpu_count()},
        "versions": {"python": platform.python_version()},
        "goal_factor": GOAL_FACTOR,
        "result": result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    ledger.print_row(
        "check_estimate", change=args.change, figures=headline(report), files=[args.out]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
