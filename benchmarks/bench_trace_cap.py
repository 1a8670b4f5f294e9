"""A new bucket cap from a trace (``commprof estimate --trace DIR --bucket-cap-mb MB``) against
the traces measured at that cap.

Records one profiled ``commprof run`` per cap of ``--caps`` (gloo, CPU, ``--rounds`` interleaved
rounds), then predicts from each cap's trace the step at every other cap and scores it against
the trace measured there (the mean trace step over rank-steps, as ``commprof analyze`` counts it
on both sides). The floor beside it is "the cap changes nothing" (the source trace's own step).
Also: the in-sample line (the trace's own buckets replayed with their measured times), and the
cap each source would pick against the measured best (regret).

A source whose buckets are all one size cannot split latency from bandwidth: the command asks for
a link there, and the benchmark counts it as refused.

Usage (from the repository root, the project's venv active, the machine otherwise idle)::

    flock /tmp/commprof-bench.lock python benchmarks/bench_trace_cap.py --change "..."
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import ledger

DEFAULT_OUT = ledger.RESULTS / "trace_cap.json"
CAPS = (0.25, 0.5, 1.0, 2.0, 4.0, 25.0)


def _commprof(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "commprof", *args], capture_output=True, text=True, check=False
    )


def record(out: Path, model: str, cap: float, steps: int, repeat: int) -> Path:
    """One profiled gloo cell at ``cap``; its trace folder."""
    proc = _commprof(
        "run", "--model", model, "--world-size", "2", "--bucket-cap-mb", str(cap),
        "--profile", "--steps", str(steps), "--repeat", str(repeat), "--out", str(out),
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"commprof run at {cap} MiB failed:\n{proc.stderr[-3000:]}")
    found = re.search(r"^cell ([0-9a-f]+) done", proc.stdout + proc.stderr, flags=re.M)
    if found is None:
        raise RuntimeError(f"commprof run at {cap} MiB named no cell:\n{proc.stdout[-2000:]}")
    (trace,) = sorted((out / "traces").glob(f"{found.group(1)}-a*"))[-1:]
    return trace


def estimate(trace: Path, cap: float | None) -> dict[str, Any] | str:
    """``estimate --trace [--bucket-cap-mb] --json``'s document, or its error line."""
    with_cap = [] if cap is None else ["--bucket-cap-mb", str(cap)]
    proc = _commprof("estimate", "--trace", str(trace), *with_cap, "--json")
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return dict(json.loads(proc.stdout))


def mean_step_ms(doc: dict[str, Any], key: str) -> float:
    return float(doc["totals"][key]) / doc["totals"]["num_steps"] / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="srn-1m")
    parser.add_argument("--caps", type=float, nargs="+", default=list(CAPS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ledger.add_change_argument(parser)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-trace-cap-"))
    result: dict[str, Any] = {
        "benchmark": "trace_cap",
        "what": f"{args.model}, 2 gloo ranks on CPU, caps {args.caps} MiB, {args.rounds} rounds",
        "machine": {
            "platform": platform.platform(), "python": platform.python_version(),
            "num_cpus": os.cpu_count(), "loadavg_start": list(os.getloadavg()),
        },
        "rounds": [],
    }  # fmt: skip
    try:
        for r in range(args.rounds):
            traces = {cap: record(work / "ds", args.model, cap, args.steps, r) for cap in args.caps}
            measured = {}
            docs: dict[float, dict[float, Any]] = {}
            for src, trace in traces.items():
                docs[src] = {dst: estimate(trace, dst) for dst in args.caps}
                own = estimate(trace, None)
                assert isinstance(own, dict), own
                measured[src] = mean_step_ms(own, "trace_step_ns")
            rows = []
            for src in args.caps:
                for dst in args.caps:
                    doc = docs[src][dst]
                    row: dict[str, Any] = {"source_cap_mb": src, "cap_mb": dst}
                    if isinstance(doc, str):
                        row["refused"] = doc
                    else:
                        row |= {
                            "predicted_ms": mean_step_ms(doc, "whatif_step_ns"),
                            "measured_ms": measured[dst],
                            "source_ms": measured[src],
                            "own_layout_diff_pct": doc["bucket_cap"]["own_layout_step_diff_pct"],
                            "cost": doc["bucket_cap"]["cost"],
                        }
                    rows.append(row)
            result["rounds"].append({"round": r, "measured_ms": measured, "rows": rows})
            print(f"round {r}: measured {measured}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    result["summary"] = summarise(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    ledger.print_row("trace_cap", change=args.change, figures=headline(result), files=[args.out])
    return 0


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Mean absolute error of the step at other caps, the floor's, the in-sample line, the
    refused sources, and the regret of the cap each source picks."""
    errs, floor, own, regrets = [], [], [], []
    refused = set()
    for rnd in result["rounds"]:
        measured = rnd["measured_ms"]
        best = min(measured.values())
        by_src: dict[float, list[dict[str, Any]]] = {}
        for row in rnd["rows"]:
            by_src.setdefault(row["source_cap_mb"], []).append(row)
        for src, rows in by_src.items():
            if any("refused" in r for r in rows):
                refused.add(src)
                continue
            if rows[0]["own_layout_diff_pct"] is not None:
                own.append(abs(rows[0]["own_layout_diff_pct"]))
            for r in rows:
                if r["cap_mb"] == src:
                    continue
                errs.append(abs(r["predicted_ms"] / r["measured_ms"] - 1) * 100)
                floor.append(abs(r["source_ms"] / r["measured_ms"] - 1) * 100)
            pick = min(rows, key=lambda r: r["predicted_ms"])["cap_mb"]
            regrets.append(measured[pick] / best - 1)
    return {
        "step_mape_other_caps_pct": statistics.fmean(errs) if errs else None,
        "floor_mape_pct": statistics.fmean(floor) if floor else None,
        "own_layout_mean_abs_pct": statistics.fmean(own) if own else None,
        "num_scored": len(errs),
        "refused_sources_mb": sorted(refused),
        "mean_regret_pct": 100 * statistics.fmean(regrets) if regrets else None,
    }


def headline(result: dict[str, Any]) -> str:
    s = result["summary"]
    load = result["machine"]["loadavg_start"][0], result["machine"]["loadavg_end"][0]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1f} %"

    return (
        f"step MAPE at other caps {pct(s['step_mape_other_caps_pct'])} (floor, cap changes "
        f"nothing: {pct(s['floor_mape_pct'])}; {s['num_scored']} pairs); in-sample "
        f"{pct(s['own_layout_mean_abs_pct'])}; regret {pct(s['mean_regret_pct'])}; refused "
        f"sources {s['refused_sources_mb']} MiB; load {load[0]:.1f} to {load[1]:.1f}"
    )


if __name__ == "__main__":
    sys.exit(main())
