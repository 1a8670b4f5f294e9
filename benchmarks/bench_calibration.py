"""Accuracy of the ring-model calibration on this machine (gloo, loopback, 2 and 4 ranks).

For each world size: spawn local gloo ranks, run commprof's all-reduce microbenchmark
on sizes 1 KiB .. 64 MiB (x sqrt 2 steps) in PASSES interleaved passes, fit on the
even-indexed sizes, predict the odd-indexed ones, and report the mean absolute
percentage error (MAPE) of:

* ``alpha-beta``: joint ring fit weighted by relative error (the measured link);
* ``piecewise-2`` and ``piecewise-3``: ring fits on 2 or 3 size ranges split at the
  best boundaries (loopback gloo runs from cache below about 2 MiB, from memory above);
* ``alpha-only-nvlink4``: the seed's fit with beta from a published link; it is
  meaningless on loopback and shown only to make that visible.

Then the in-training error and its cause. A short 2-rank DDP run with commprof's
timing hook gives bucket service times (``transfer_ns``, max over ranks, steps >= 1)
that the idle 2-rank fits predict. The same microbenchmark is run again on 2 ranks
while a thread per rank streams memory (as backward's gradient writes and DDP's bucket
copies do in training): its slowdown over the idle link, the idle fit's error on it, and a
fit on it predicting the in-training buckets show how much of the in-training error
is the CPU contention the idle model leaves out. Prints tables and writes
``benchmarks/results/calibration.json``. Run: ``python benchmarks/bench_calibration.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import ledger
import numpy as np
import torch
import torch.distributed as dist
from bench_env import environment
from torch import nn

from commprof.modeling.collective.dataset_fits import fit_to_dict
from commprof.modeling.collective.fit_scores import holdout_split, leave_one_out_errors, mape
from commprof.modeling.collective.interconnects import get_interconnect
from commprof.modeling.collective.ring_fit import (
    CalibrationWarning,
    Fit,
    fit_alpha_beta,
    fit_alpha_only,
    fit_piecewise,
)
from commprof.profiling.comm_hooks import register_timing_hook
from commprof.training.launcher import process_group, spawn_ranks
from commprof.training.microbench import MicrobenchConfig, run_allreduce_bench

# Two sizes per octave (x sqrt 2, rounded to whole float32 elements): the held-out sizes sit
# between fitted ones, and the cache-to-memory step of loopback gloo near 2 MiB is resolved.
SIZES_BYTES = tuple(sorted({4 * round(1024 * 2 ** (k / 2) / 4) for k in range(33)}))
PASSES = 16
"""Interleaved passes over all sizes (MicrobenchConfig.passes; why 16: benchmarks/README.md)."""
BENCH = MicrobenchConfig(
    sizes_bytes=SIZES_BYTES,
    warmup_iters=5,
    timed_iters=50,
    passes=PASSES,
    large_above_bytes=1 << 20,  # bandwidth regime: few iterations, each long and less noisy
    large_warmup_iters=2,
    large_timed_iters=6,
)
CONTENDED_SIZES_BYTES = tuple(n for n in SIZES_BYTES if 16 << 10 <= n <= 16 << 20)
"""Sizes of the contended run: the range DDP buckets fall in."""
CONTENDED_PASSES = 8
"""Passes of the contended run."""
LOAD_NUMEL = 4 << 20
"""Elements of each float32 tensor the load thread adds (16 MiB, beyond the 4 MiB L2)."""
WORLD_SIZES = (2, 4)
DDP_STEPS = 12
FITS: dict[str, Any] = {
    "alpha-beta": lambda n, t, p: fit_alpha_beta(n, t, p),
    "piecewise-2": lambda n, t, p: fit_piecewise(n, t, p, num_segments=2),
    "piecewise-3": lambda n, t, p: fit_piecewise(n, t, p, num_segments=3),
}
OUT = Path(__file__).resolve().parent / "results" / "calibration.json"


PG_TIMEOUT_S = 120.0
"""Process-group timeout: the largest sizes at p = 4 take about 0.2 s each."""


def _bench_worker(
    rank: int, world_size: int, store_path: str, contended: bool
) -> list[dict[str, Any]] | None:
    stop = threading.Event()
    load = threading.Thread(target=_keep_busy, args=(stop,), daemon=True)
    store = dist.FileStore(store_path, world_size)
    with process_group(
        backend="gloo", rank=rank, world_size=world_size, store=store, timeout_s=PG_TIMEOUT_S
    ):
        try:
            # Discarded pass: the first collectives after start-up are slow.
            run_allreduce_bench(
                MicrobenchConfig(sizes_bytes=(1024,), timed_iters=50),
                rank=rank,
                world_size=world_size,
                device="cpu",
            )
            config = BENCH
            if contended:
                config = dataclasses.replace(
                    BENCH, sizes_bytes=CONTENDED_SIZES_BYTES, passes=CONTENDED_PASSES
                )
                load.start()
            records = run_allreduce_bench(config, rank=rank, world_size=world_size, device="cpu")
        finally:
            stop.set()
    return records if rank == 0 else None


def _keep_busy(stop: threading.Event) -> None:
    """Stream memory until stopped, as backward's gradient writes and bucket copies do."""
    a, b = torch.ones(LOAD_NUMEL), torch.ones(LOAD_NUMEL)
    while not stop.is_set():
        a.add_(b)


def _ddp_worker(rank: int, world_size: int, store_path: str) -> list[tuple[int, int, int, int]]:
    store = dist.FileStore(store_path, world_size)
    with process_group(
        backend="gloo", rank=rank, world_size=world_size, store=store, timeout_s=PG_TIMEOUT_S
    ):
        torch.manual_seed(0)
        widths = [512, 1024, 1024, 768, 1536, 512, 256]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU()]
        model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers), bucket_cap_mb=2)
        timing = register_timing_hook(model)
        gen = torch.Generator().manual_seed(rank)
        rows_local: list[dict[str, Any]] = []
        for step in range(DDP_STEPS):
            timing.step = step
            model(torch.randn(32, widths[0], generator=gen)).sum().backward()
            rows_local.extend(timing.resolve())
    # the bucket's own service time: what the ring model predicts (comm_hooks docstring)
    return sorted(
        (r["step"], r["bucket_index"], r["num_bytes"], r["transfer_ns"]) for r in rows_local
    )


def _slowest_rank(per_rank: list[list[tuple[int, int, int, int]]]) -> list[list[int]]:
    """(step, bucket, bytes, service time) rows, the time the longest over the ranks."""
    keys = [row[:3] for row in per_rank[0]]
    if any([row[:3] for row in rows] != keys for rows in per_rank):
        raise RuntimeError("the ranks recorded different buckets")
    return [[*key, max(rows[i][3] for rows in per_rank)] for i, key in enumerate(keys)]


def _heldout(
    records: list[dict[str, Any]], column: str, world_size: int, fits: dict[str, Any]
) -> dict[str, Any]:
    """Every fit on the even sizes, with its MAPE on the odd ones and leave-one-out MAPE.

    Even and odd sizes are the powers of two and the sqrt-2 points between them. On loopback
    gloo from 256 KiB to 2 MiB the time rises in steps at powers of two (a size sqrt 2 above
    one took about as long as it), so the held-out half sits below the fitted half's trend;
    leave-one-out does not depend on which half is held out.
    """
    n = np.array([r["num_bytes"] for r in records], dtype=np.float64)
    t = np.array([r[column] for r in records], dtype=np.float64)
    fit_mask, held = holdout_split(n)
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        for name, make in fits.items():
            fit = make(n[fit_mask], t[fit_mask], world_size)
            loo = 100 * float(np.abs(leave_one_out_errors(n, t, world_size, make)).mean())
            out[name] = (fit, mape(fit.predict_ns(n[held], world_size), t[held]), loo)
    return out


def headline(result: dict[str, Any]) -> str:
    """The ledger's figures: the alpha-beta fit's held-out MAPE at p = 2 and 4 (leave-one-out
    in brackets), its in-training MAPE per record and per bucket median, the load average."""
    fits = [
        f"p = {ws} {e['fits']['alpha-beta']['mape_heldout_pct']:.1f} % "
        f"({e['fits']['alpha-beta']['mape_leave_one_out_pct']:.1f})"
        for ws, e in result["world_sizes"].items()
    ]
    training = result["in_training"]
    env = result["environment"]
    return (
        f"held-out MAPE {', '.join(fits)}; in training (idle fit) "
        f"{training['mape_pct']['idle:alpha-beta']:.0f} % a record, "
        f"{training['median_mape_pct']['idle:alpha-beta']:.0f} % a bucket median; load "
        f"{env['load_avg_1m_at_start']:.1f} to {env['load_avg_1m_at_end']:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    ledger.add_change_argument(parser)
    args = parser.parse_args(argv)
    start = time.time()
    nvlink = get_interconnect("nvlink4")

    def seed(n: np.ndarray, t: np.ndarray, p: int) -> Fit:
        """The seed's fit: alpha only, beta from NVLink 4's published bandwidth."""
        return fit_alpha_only(n, t, p, beta_ns_per_byte=1e9 / nvlink.per_direction_bytes_per_s)

    result: dict[str, Any] = {
        "environment": environment("start"),
        "microbench": {
            **dataclasses.asdict(BENCH),
            "contended_sizes_bytes": list(CONTENDED_SIZES_BYTES),
            "contended_passes": CONTENDED_PASSES,
        },
        "world_sizes": {},
    }
    idle_2: dict[str, Fit] = {}
    print(
        f"{'p':>2} {'time':>9} {'method':>20} {'alpha us':>10} {'GB/s':>8} "
        f"{'MAPE held-out %':>16} {'LOO %':>8}"
    )
    for ws in WORLD_SIZES:
        (records, *_) = spawn_ranks(_bench_worker, ws, args=(False,), limit_s=1800)
        entry: dict[str, Any] = {"records": records, "fits": {}, "transfer_fits": {}}
        # time_p50_ns: max over ranks per iteration (the collective as the slowest rank saw it);
        # transfer_p50_ns: min over ranks (no barrier-exit waiting: what a link model predicts)
        for column, key in (("time_p50_ns", "fits"), ("transfer_p50_ns", "transfer_fits")):
            fits = _heldout(records, column, ws, {**FITS, "alpha-only-nvlink4": seed})
            for name, (fit, err, loo) in fits.items():
                entry[key][name] = {
                    "mape_heldout_pct": err,
                    "mape_leave_one_out_pct": loo,
                    "fit": fit_to_dict(fit),
                }
                first = fit.segments[0] if hasattr(fit, "segments") else fit
                print(
                    f"{ws:>2} {key.split('_')[0][:9]:>9} {name:>20} {first.alpha_ns / 1e3:>10.1f} "
                    f"{first.bandwidth_bytes_per_s / 1e9:>8.3f} {err:>16.1f} {loo:>8.1f}"
                )
            if ws == 2 and key == "transfer_fits":
                idle_2 = {name: fit for name, (fit, _, _) in fits.items() if name in FITS}
        result["world_sizes"][str(ws)] = entry
    result["contended"] = _contended(result["world_sizes"]["2"]["records"], idle_2)
    rows = _slowest_rank(spawn_ranks(_ddp_worker, 2))
    result["in_training"] = _in_training(rows, idle_2, result["contended"].pop("fit_objects"))
    result["environment"]["load_avg_1m_at_end"] = os.getloadavg()[0]
    result["elapsed_s"] = time.time() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    print(f"wrote {args.out} in {result['elapsed_s']:.0f} s")
    ledger.print_row("calibration", change=args.change, figures=headline(result), files=[args.out])
    return 0


def _in_training(
    rows: list[list[int]], idle: dict[str, Fit], contended: dict[str, Fit]
) -> dict[str, Any]:
    """The fits' error on in-training bucket service times, per record and per bucket median.

    A bucket's service time moves from step to step at the same size, so no function of the
    size alone has a lower MAPE on the records than the best constant per bucket: the median
    of its times weighted by 1/t (which minimises sum |c - t| / t). That is the floor; the
    plain medians show the level the fits miss.
    """
    nb = np.array([r[2] for r in rows], dtype=np.float64)
    lat = np.array([r[3] for r in rows], dtype=np.float64)
    medians = {b: float(np.median(lat[nb == b])) for b in np.unique(nb)}
    best = {b: _weighted_median(lat[nb == b], 1 / lat[nb == b]) for b in medians}
    sizes = np.array(sorted(medians))
    median_ns = np.array([medians[b] for b in sizes])
    out: dict[str, Any] = {
        "rows_step_bucket_bytes_latency_ns": rows,
        "floor_mape_pct": mape([best[b] for b in nb], lat),
        "median_over_idle_alpha_beta": (
            median_ns / idle["alpha-beta"].predict_ns(sizes, 2)
        ).tolist(),
        "mape_pct": {},
        "median_mape_pct": {},
    }
    print(f"in-training bucket service times (2 ranks, {len(rows)} bucket records, steps >= 1):")
    for label, fits in (("idle", idle), ("contended", contended)):
        for name, fit in fits.items():
            err = mape(fit.predict_ns(nb, 2), lat)
            err_median = mape(fit.predict_ns(sizes, 2), median_ns)
            out["mape_pct"][f"{label}:{name}"] = err
            out["median_mape_pct"][f"{label}:{name}"] = err_median
            print(
                f"   {label:>9} fit {name:>12} MAPE {err:6.1f} % on records, "
                f"{err_median:6.1f} % on bucket medians"
            )
    print(
        f"   floor of any size-only model: MAPE {out['floor_mape_pct']:.1f} % on records; "
        "bucket medians / idle alpha-beta: "
        + ", ".join(f"{x:.2f}" for x in out["median_over_idle_alpha_beta"])
        + f"; measured median {np.median(lat) / 1e6:.2f} ms"
    )
    return out


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The smallest value at which the cumulative weight reaches half the total."""
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def _contended(idle: list[dict[str, Any]], idle_fits: dict[str, Fit]) -> dict[str, Any]:
    """The 2-rank microbenchmark with a memory-streaming thread per rank, against the idle one."""
    (records, _) = spawn_ranks(_bench_worker, 2, args=(True,), limit_s=1800)
    idle_ns = {r["num_bytes"]: r["transfer_p50_ns"] for r in idle}
    n = np.array([r["num_bytes"] for r in records], dtype=np.float64)
    t = np.array([r["transfer_p50_ns"] for r in records], dtype=np.float64)
    slowdown = t / np.array([idle_ns[int(b)] for b in n])
    fits = _heldout(records, "transfer_p50_ns", 2, FITS)
    out: dict[str, Any] = {
        "records": records,
        "slowdown_vs_idle": slowdown.tolist(),
        "slowdown_median": float(np.median(slowdown)),
        "idle_fit_mape_pct": {k: mape(f.predict_ns(n, 2), t) for k, f in idle_fits.items()},
        "fits": {
            k: {"mape_heldout_pct": e, "mape_leave_one_out_pct": loo, "fit": fit_to_dict(f)}
            for k, (f, e, loo) in fits.items()
        },
        "fit_objects": {k: f for k, (f, _, _) in fits.items()},
    }
    print(
        f"contended (2 ranks, a memory-streaming thread each, {len(n)} sizes): median slowdown "
        f"{out['slowdown_median']:.2f}x (min {slowdown.min():.2f}, max {slowdown.max():.2f}); "
        "idle alpha-beta fit MAPE "
        f"{out['idle_fit_mape_pct']['alpha-beta']:.1f} %, contended alpha-beta held-out "
        f"{out['fits']['alpha-beta']['mape_heldout_pct']:.1f} %"
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
