"""Does ``commprof estimate --recommend-bucket-cap`` pick a cap that beats DDP's default here?

One run, on this machine (gloo over loopback, ranks spawned locally, no Ray):

1. Measure calibration cells at three caps (1, 4 and DDP's default 25 MiB): training steps
   with the timing hook, and (at 25 MiB) the all-reduce microbenchmark over a size range.
2. Fit the ring model twice (``dataset_fits.fits_from_dataset``): to the microbenchmark (the
   link alone) and to the buckets' in-training service times (``--fit-source buckets``); take
   the backward timeline measured at the default cap (``timeline.parameter_ready_ns``).
3. Recommend, with each fit, a cap by the step model's rule (``cap_advice.search``) on the
   predicted backward plus exposed communication: of the caps within 1 % of the shortest the
   fewest buckets, the default kept where it is within 1 % of that one.
4. Run each recommended cap and the default cap interleaved (A, B, A, B, ...) and compare the
   median measured step time and the ratio within each pair: < 1 means the advice helps (a
   fit whose advice is to keep the default has nothing to compare).

Usage: ``python benchmarks/bench_bucket_advice.py [--model srn-10m] [--pairs 10]``; writes
``benchmarks/results/bucket_advice.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ledger  # noqa: E402
from bench_env import environment  # noqa: E402

from commprof import results  # noqa: E402
from commprof.catalog import parameter_sizes  # noqa: E402
from commprof.matrix import Cell, geometric_sizes  # noqa: E402
from commprof.modeling.collective.dataset_fits import FIT_SOURCES, fits_from_dataset  # noqa: E402
from commprof.modeling.collective.ring_fit import (  # noqa: E402
    CalibrationWarning,
    Fit,
    RingFit,
)
from commprof.modeling.step.cap_advice import CAP_GRID_MB, search  # noqa: E402
from commprof.modeling.step.idle import Estimate, estimate  # noqa: E402
from commprof.modeling.step.timeline import load_parameter_ready_ns  # noqa: E402
from commprof.outcomes import merge_rank_records  # noqa: E402
from commprof.training.launcher import run_local  # noqa: E402

DEFAULT_CAP_MB = 25.0
"""DDP's default ``bucket_cap_mb``."""
CALIBRATION_CAPS_MB = (1.0, 4.0, DEFAULT_CAP_MB)
"""Caps of the calibration cells: several bucket sizes for the in-training fit."""


def _run(cell: Cell, out: Path) -> float:
    """Run a cell locally into ``out``; return its median measured step time in ms."""
    per_rank = run_local(cell, timeout_s=120)
    row = results.cell_row(cell, sweep="bucket-advice", attempt=1, status="ok")
    records = merge_rank_records(per_rank)
    results.write_attempt(out, row, records)
    return statistics.median(s["step_ns"] for s in records["steps"] if s["measured"]) / 1e6


def _advice(data: Path, default: Cell, world_size: int) -> dict[str, dict[str, Any]]:
    """Per fit source: the fit, the recommended cap and the predicted curve."""
    sizes = parameter_sizes(default.model)
    ready = load_parameter_ready_ns(data, default.cell_id, sizes)
    advice = {}
    for source in FIT_SOURCES:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CalibrationWarning)
            fit = fits_from_dataset(data, source=source)[("gloo", "cpu-gloo", world_size)]

        def predict(cap: float | None, fit: Fit = fit, source: str = source) -> Estimate:
            return estimate(
                sizes,
                world_size=world_size,
                bucket_cap_mb=cap,
                link=fit,
                link_label=source,
                ready_ns=ready,
            )

        curve, picked, in_use = search(CAP_GRID_MB, predict, DEFAULT_CAP_MB)
        assert in_use is not None
        best = picked.bucket_cap_mb
        assert isinstance(fit, RingFit)
        advice[source] = {
            "alpha_ns": fit.alpha_ns,
            "beta_ns_per_byte": fit.beta_ns_per_byte,
            "fit_warnings": [
                str(w.message) for w in caught if issubclass(w.category, CalibrationWarning)
            ],
            "recommended_cap_mb": best,
            "predicted_exposed_ms": {str(e.bucket_cap_mb): e.exposed_ns / 1e6 for e in curve},
            "predicted_exposed_default_ms": in_use.exposed_ns / 1e6,
        }
    return advice


def headline(report: dict[str, Any]) -> str:
    """The ledger's figures: per fit source the recommended cap and the median per-pair step
    ratio recommended / default (pairs where the recommendation was faster), the load."""
    parts = []
    for source, item in report["advice"].items():
        cap = item["recommended_cap_mb"]
        if "paired_ratio_median" not in item:
            parts.append(f"{source} fit keeps {cap:g} MiB")
            continue
        pairs = len(item["paired_ratios"])
        parts.append(
            f"{source} fit {cap:g} MiB: {item['paired_ratio_median']:.3f} "
            f"({item['pairs_recommended_faster']} of {pairs} faster)"
        )
    env = report["environment"]
    load = f"load {env['load_avg_1m_at_start']:.1f} to {env['load_avg_1m_at_end']:.1f}"
    return f"{'; '.join(parts)}; {load}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="srn-10m")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--pairs", type=int, default=10, help="interleaved A/B rounds")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/bucket_advice.json")
    ledger.add_change_argument(parser)
    args = parser.parse_args()
    started = time.monotonic()
    load_at_start = os.getloadavg()[0]
    common: dict[str, Any] = {"model": args.model, "world_size": args.world_size}
    common["steps"] = args.steps
    with tempfile.TemporaryDirectory(prefix="commprof-advice-") as tmp:
        data = Path(tmp)
        for cap in CALIBRATION_CAPS_MB:
            micro = geometric_sizes(4096, 64 * 2**20, 4) if cap == DEFAULT_CAP_MB else ()
            cell = Cell(
                **common,
                bucket_cap_mb=cap,
                warmup_steps=2,
                microbench_sizes_bytes=micro,
                microbench_iters=5,
                microbench_passes=4,
                seed=1,
            )
            _run(cell, data)
        default = cell  # the last calibration cell has the default cap
        advice = _advice(data, default, args.world_size)
        caps = sorted({a["recommended_cap_mb"] for a in advice.values()} | {DEFAULT_CAP_MB})
        measured: dict[float, list[float]] = {cap: [] for cap in caps}
        for pair in range(args.pairs):
            for cap in caps:
                cell = Cell(**common, bucket_cap_mb=cap, warmup_steps=2, repeat=pair)
                measured[cap].append(_run(cell, data))
    median = {cap: statistics.median(v) for cap, v in measured.items()}
    for item in advice.values():
        if item["recommended_cap_mb"] == DEFAULT_CAP_MB:
            continue  # the advice is to keep the default: nothing to compare
        ratio = median[item["recommended_cap_mb"]] / median[DEFAULT_CAP_MB]
        item["step_time_ratio_recommended_over_default"] = ratio
        # Per pair (the two cells ran back to back, under the same load): the spread of these
        # ratios says whether the medians' ratio is more than the machine's noise.
        paired = [
            rec / dflt
            for rec, dflt in zip(
                measured[item["recommended_cap_mb"]], measured[DEFAULT_CAP_MB], strict=True
            )
        ]
        item["paired_ratios"] = paired
        item["paired_ratio_median"] = statistics.median(paired)
        item["pairs_recommended_faster"] = sum(r < 1 for r in paired)
    report = {
        "environment": {**environment("end"), "load_avg_1m_at_start": load_at_start},
        "model": args.model,
        "world_size": args.world_size,
        "pairs": args.pairs,
        "advice": advice,
        "measured_step_ms": {str(k): v for k, v in measured.items()},
        "median_step_ms": {str(k): v for k, v in median.items()},
        "wall_s": time.monotonic() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for source, item in advice.items():
        if "paired_ratios" not in item:
            print(
                f"fit on {source}: alpha {item['alpha_ns'] / 1e3:.0f} us, keeps the default "
                f"{DEFAULT_CAP_MB} MiB (no cap predicted 1 % faster than it); warnings: "
                f"{item['fit_warnings'] or 'none'}"
            )
            continue
        print(
            f"fit on {source}: alpha {item['alpha_ns'] / 1e3:.0f} us, recommends "
            f"{item['recommended_cap_mb']} MiB; median step time recommended / default = "
            f"{item['step_time_ratio_recommended_over_default']:.3f}; per pair median "
            f"{item['paired_ratio_median']:.3f} (min {min(item['paired_ratios']):.3f}, max "
            f"{max(item['paired_ratios']):.3f}), recommended faster in "
            f"{item['pairs_recommended_faster']} of {len(item['paired_ratios'])} pairs"
        )
    for cap, values in measured.items():
        print(f"  cap {cap:>7} MiB: step ms {', '.join(f'{v:.1f}' for v in values)}")
    print(f"-> {args.out}")
    ledger.print_row(
        "bucket_advice", change=args.change, figures=headline(report), files=[args.out]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
