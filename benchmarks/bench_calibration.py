"""Accuracy of the ring-model calibration on this machine (gloo, loopback, 2 and 4 ranks).

For each world size: spawn local gloo ranks, run the all-reduce microbenchmark
on sizes 1 KiB .. 64 MiB (x sqrt 2 steps), fit on the even-indexed sizes, predict
the odd-indexed ones, and report the mean absolute percentage error (MAPE) of:

* ``alpha-beta``: joint ring fit weighted by relative error (the measured link);
* ``piecewise-2`` and ``piecewise-3``: ring fits on 2 or 3 size ranges split at the
  best boundaries (loopback gloo runs from cache below about 2 MiB, from memory above);
* ``alpha-only-nvlink4``: the seed's fit with beta from a published link; it is
  meaningless on loopback and shown only to make that visible.

Then a short 2-rank DDP run with commprof's timing hook gives in-training bucket
service times (``transfer_ns``, max over ranks, steps >= 1), and the 2-rank
microbenchmark fits predict them. Prints a table and writes
``benchmarks/results/calibration.json``. Run: ``python benchmarks/bench_calibration.py``.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from commprof.modeling.calibration import (
    CalibrationWarning,
    Fit,
    fit_alpha_beta,
    fit_alpha_only,
    fit_piecewise,
    fit_to_dict,
    holdout_split,
    mape,
)
from commprof.modeling.cost_model import bus_bandwidth_factor
from commprof.modeling.interconnects import get_interconnect
from commprof.profiling.comm_hooks import register_timing_hook
from commprof.training.microbench import MicrobenchConfig, run_allreduce_bench

# Two sizes per octave (x sqrt 2, rounded to whole float32 elements): the held-out sizes sit
# between fitted ones, and the cache-to-memory step of loopback gloo near 2 MiB is resolved.
SIZES_BYTES = tuple(sorted({4 * round(1024 * 2 ** (k / 2) / 4) for k in range(33)}))
PASSES = 4
"""Passes over all sizes, each in a shuffled order; a size's time is the median over passes."""
SMALL_TIMED_ITERS = 200
"""Timed iterations per size up to SMALL_LIMIT_BYTES."""
LARGE_TIMED_ITERS = 16
"""Timed iterations per larger size (bandwidth regime, less noisy relative to its time)."""
SMALL_LIMIT_BYTES = 1 << 20
"""Sizes up to this get more timed iterations (they are cheap and noisy)."""
WORLD_SIZES = (2, 4)
DDP_STEPS = 12
OUT = Path(__file__).resolve().parent / "results" / "calibration.json"


def _init(rank: int, world_size: int, store_path: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=120),
    )


def _combine(records: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """One size's passes -> one record: median of the pass medians, overall min and max."""
    p50 = int(statistics.median(r["time_p50_ns"] for r in records))
    algbw = records[0]["num_bytes"] / p50
    return {
        **records[0],
        "num_iters": sum(r["num_iters"] for r in records),
        "time_p50_ns": p50,
        "time_min_ns": min(r["time_min_ns"] for r in records),
        "time_max_ns": max(r["time_max_ns"] for r in records),
        "transfer_p50_ns": int(statistics.median(r["transfer_p50_ns"] for r in records)),
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_bandwidth_factor(world_size),
        "num_wrong": sum(r["num_wrong"] for r in records),
    }


def _bench_worker(rank: int, world_size: int, store_path: str, out_path: str) -> None:
    _init(rank, world_size, store_path)
    try:
        # Discarded pass: the first collectives after start-up are slow.
        run_allreduce_bench(
            MicrobenchConfig(sizes_bytes=(1024,), timed_iters=50),
            rank=rank,
            world_size=world_size,
            device="cpu",
        )
        # PASSES passes over all sizes, each in its own shuffled order (the same on every
        # rank): a burst of outside load then blurs a few iterations of many sizes instead of
        # all iterations of one, and the median over passes sets it aside.
        passes: dict[int, list[dict[str, Any]]] = {}
        for index in range(PASSES):
            order = list(SIZES_BYTES)
            random.Random(index).shuffle(order)
            for size in order:
                small = size <= SMALL_LIMIT_BYTES
                config = MicrobenchConfig(
                    sizes_bytes=(size,),
                    # latency-bound sizes are the noisiest: many cheap iterations
                    warmup_iters=5 if small else 2,
                    timed_iters=(SMALL_TIMED_ITERS if small else LARGE_TIMED_ITERS) // PASSES,
                )
                (record,) = run_allreduce_bench(
                    config, rank=rank, world_size=world_size, device="cpu"
                )
                passes.setdefault(size, []).append(record)
        records = [_combine(passes[n], world_size) for n in sorted(passes)]
        if rank == 0:
            Path(out_path).write_text(json.dumps(records))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _ddp_worker(rank: int, world_size: int, store_path: str, out_path: str) -> None:
    _init(rank, world_size, store_path)
    try:
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
        records = sorted(
            (r["step"], r["bucket_index"], r["num_bytes"], r["transfer_ns"]) for r in rows_local
        )
        local = torch.tensor(records, dtype=torch.int64)
        gathered = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(gathered, local)
        if rank == 0:
            stacked = torch.stack(gathered)
            latency = stacked[:, :, 3].max(dim=0).values
            rows = [
                (int(s), int(b), int(n), int(t))
                for (s, b, n, _), t in zip(stacked[0].tolist(), latency.tolist(), strict=True)
                if s >= 1
            ]
            Path(out_path).write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(fn: Any, world_size: int) -> list[Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(fn, args=(world_size, os.path.join(tmp, "store"), out), nprocs=world_size)
        return list(json.loads(Path(out).read_text()))


def main() -> int:
    """Run the benchmark, print the table, write the JSON."""
    start = time.time()
    nvlink = get_interconnect("nvlink4")
    result: dict[str, Any] = {"sizes_bytes": list(SIZES_BYTES), "world_sizes": {}}
    fits_2: dict[str, Fit] = {}
    print(
        f"{'p':>2} {'time':>9} {'method':>20} {'alpha us':>10} {'GB/s':>8} {'MAPE held-out %':>16}"
    )
    for ws in WORLD_SIZES:
        records = _spawn(_bench_worker, ws)
        n = np.array([r["num_bytes"] for r in records], dtype=np.float64)
        fit_mask, held = holdout_split(n)
        entry: dict[str, Any] = {"records": records, "fits": {}, "transfer_fits": {}}
        # time_p50_ns: max over ranks per iteration (the collective as the slowest rank saw it);
        # transfer_p50_ns: min over ranks (no barrier-exit waiting: what a link model predicts)
        for column, key in (("time_p50_ns", "fits"), ("transfer_p50_ns", "transfer_fits")):
            t = np.array([r[column] for r in records], dtype=np.float64)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CalibrationWarning)
                fits: dict[str, Fit] = {
                    "alpha-beta": fit_alpha_beta(n[fit_mask], t[fit_mask], ws),
                    "piecewise-2": fit_piecewise(n[fit_mask], t[fit_mask], ws, num_segments=2),
                    "piecewise-3": fit_piecewise(n[fit_mask], t[fit_mask], ws, num_segments=3),
                    "alpha-only-nvlink4": fit_alpha_only(
                        n[fit_mask],
                        t[fit_mask],
                        ws,
                        beta_ns_per_byte=1e9 / nvlink.per_direction_bytes_per_s,
                    ),
                }
            for name, fit in fits.items():
                err = mape(fit.predict_ns(n[held], ws), t[held])
                entry[key][name] = {"mape_heldout_pct": err, "fit": fit_to_dict(fit)}
                first = fit.segments[0] if hasattr(fit, "segments") else fit
                print(
                    f"{ws:>2} {key.split('_')[0][:9]:>9} {name:>20} {first.alpha_ns / 1e3:>10.1f} "
                    f"{first.bandwidth_bytes_per_s / 1e9:>8.3f} {err:>16.1f}"
                )
            if ws == 2 and key == "transfer_fits":
                fits_2 = fits
        result["world_sizes"][str(ws)] = entry
    rows = _spawn(_ddp_worker, 2)
    nb = np.array([r[2] for r in rows], dtype=np.float64)
    lat = np.array([r[3] for r in rows], dtype=np.float64)
    result["in_training"] = {"rows_step_bucket_bytes_latency_ns": rows, "mape_pct": {}}
    print(f"in-training bucket latencies (2 ranks, {len(rows)} bucket records, steps >= 1):")
    for name in ("alpha-beta", "piecewise-2", "piecewise-3"):
        err = mape(fits_2[name].predict_ns(nb, 2), lat)
        result["in_training"]["mape_pct"][name] = err
        print(f"   {name:>20} MAPE {err:.1f} %  (measured median {np.median(lat) / 1e6:.2f} ms)")
    result["elapsed_s"] = time.time() - start
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT} in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
