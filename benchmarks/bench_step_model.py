"""Does the step simulator predict training out of sample? Side by side with simpler models.

Collection (one run, this machine: gloo over loopback, ranks spawned locally, no Ray): cells
srn-1m, srn-10m and resnet18 at caps 0.25, 1, 4 and 25 MiB on 2 ranks, and srn-10m at 25 MiB on
4 ranks, in interleaved rounds (every cell once per round, the order shuffled per round with a
fixed seed) so that load drifts hit every cap alike. Round 0's 25 MiB cell of each model is run
with the defaults of ``commprof run`` (microbenchmark and interference arms); the others with a
minimal microbenchmark. The raw dataset is kept (``--data``).

The split, fixed here before any error was looked at:

* Calibration: per model, round 0's 25 MiB cell at p = 2 (its timeline, the ring fit of its
  microbenchmark, its interference rows). Nothing else.
* Validation: every other cap of the model at p = 2 (median over rounds of the measured step
  time and of the per-step exposed communication, both from the timing hook's own records);
  and srn-10m at p = 4, predicted from the p = 2 calibration.

Models compared (all from the same calibration): ``simulator`` (step_sim with interference),
``idle_ring`` (the same timeline and fit, no interference, one channel: ``commprof estimate``'s
model), ``bucket_sum`` (compute plus the sum of the buckets' in-training times from the
``buckets`` fit of the calibration cell, no overlap), ``no_overlap`` (compute plus the sum of
idle all-reduce times). Error: step time APE, and |predicted - measured exposed| / measured step.

Advice by regret: per round, the cap the simulator recommends among the four (calibration
only) against the best measured cap of that round; within 3 % counts as a hit.

Usage: ``python benchmarks/bench_step_model.py [--rounds 10] [--budget-s 780]``; writes
``benchmarks/results/step_model.json`` and the dataset under ``benchmarks/results/step_model_data``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_env import environment  # noqa: E402

from commprof import results  # noqa: E402
from commprof.matrix import Cell  # noqa: E402
from commprof.outcomes import merge_rank_records  # noqa: E402
from commprof.training.launcher import run_local  # noqa: E402

MODELS = {"srn-1m": 8, "srn-10m": 8, "resnet18": 2}
"""Models and their per-rank batch size (resnet18 at 2 keeps a round near a minute here)."""
CAPS_MB = (0.25, 1.0, 4.0, 25.0)
CALIBRATION_CAP_MB = 25.0
"""The cap each model is calibrated on (DDP's default size)."""
BIG_WORLD = ("srn-10m", 4, 25.0)
"""(model, world size, cap) predicted from the model's p = 2 calibration."""
STEPS, WARMUP = 7, 2
SEED = 1


def _cells(round_index: int) -> list[Cell]:
    cells = []
    for model, batch in MODELS.items():
        for cap in CAPS_MB:
            calibration = round_index == 0 and cap == CALIBRATION_CAP_MB
            extra: dict[str, Any] = (
                {}
                if calibration
                else {
                    "microbench_sizes_bytes": (4096,),
                    "microbench_iters": 1,
                    "interference_iters": 0,
                }
            )
            cells.append(
                Cell(
                    model=model,
                    world_size=2,
                    bucket_cap_mb=cap,
                    batch_size=batch,
                    steps=STEPS,
                    warmup_steps=WARMUP,
                    seed=SEED,
                    repeat=round_index,
                    **extra,
                )
            )
    model, world, cap = BIG_WORLD
    cells.append(
        Cell(
            model=model,
            world_size=world,
            bucket_cap_mb=cap,
            batch_size=MODELS[model],
            steps=STEPS,
            warmup_steps=WARMUP,
            seed=SEED,
            repeat=round_index,
            microbench_sizes_bytes=(4096,),
            microbench_iters=1,
            interference_iters=0,
        )
    )
    return cells


def collect(data: Path, rounds: int, budget_s: float) -> dict[str, Any]:
    """Run the rounds into ``data``; stop starting rounds once ``budget_s`` is spent."""
    started = time.monotonic()
    done = 0
    order_log = []
    for r in range(rounds):
        if r > 0 and time.monotonic() - started > budget_s:
            break
        cells = _cells(r)
        random.Random(SEED + r).shuffle(cells)
        for cell in cells:
            per_rank = run_local(cell, timeout_s=180)
            row = results.cell_row(cell, sweep="step-model", attempt=1, status="ok")
            results.write_attempt(data, row, merge_rank_records(per_rank))
        order_log.append([c.cell_id for c in cells])
        done += 1
        print(f"round {r} done at {time.monotonic() - started:.0f} s", flush=True)
    return {"rounds_done": done, "collect_s": time.monotonic() - started, "orders": order_log}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=780.0, help="no new round after this")
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks/results/step_model_data")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/step_model.json")
    parser.add_argument("--analyze-only", action="store_true", help="reuse --data as it is")
    parser.add_argument("--collect-only", action="store_true", help="collect, analyze later")
    args = parser.parse_args()

    meta: dict[str, Any] = {}
    if not args.analyze_only:
        if args.data.exists():
            shutil.rmtree(args.data)
        load_at_start = os.getloadavg()[0]
        meta = collect(args.data, args.rounds, args.budget_s)
        meta["environment"] = {**environment("end"), "load_avg_1m_at_start": load_at_start}
        (args.data / "collection.json").write_text(json.dumps(meta, indent=1) + "\n")
        if args.collect_only:
            return 0
    else:
        meta = json.loads((args.data / "collection.json").read_text())
    from step_model_analysis import analyze

    report = {**meta, **analyze(args.data)}
    report.pop("orders", None)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=1))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
