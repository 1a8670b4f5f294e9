"""Does the step simulator predict training out of sample? Side by side with simpler models.

Collection (one run, this machine: gloo over loopback, ranks spawned locally, no Ray): cells
srn-1m, srn-10m and resnet18 at caps 0.25, 1, 4 and 25 MiB on 2 ranks, and srn-10m at 25 MiB on
4 ranks, in interleaved rounds (every cell once per round, the order shuffled per round with a
fixed seed) so that load drifts hit every cap alike; a round's 2-rank cells share one gang of
rank processes (one process group for all), as a sweep's reused gangs do. Every round's 25 MiB
cell of each model (the calibration cells) runs with the defaults of ``commprof run``
(microbenchmark and interference arms); the others with a minimal microbenchmark. Each cell
records the host's load average when it ended (``cells.load_avg_1m``). The raw dataset is kept
compressed (``--archive``: ``results/step_model_data.tar.gz``).

The split, fixed before any error was looked at (the calibrations are in
``step_model_analysis.py``):

* Calibration: per model, its 25 MiB cells at p = 2 (every round's pooled, the headline; round
  0's alone beside it): their timeline and the ring fit of their microbenchmarks; the
  interference factors from every p = 2 calibration cell of the host. Nothing else.
* Validation: every other cap of the model at p = 2 (median over rounds of the measured step
  time and of the per-step exposed communication, both from the timing hook's own records);
  and srn-10m at p = 4, predicted from the p = 2 calibration.

Models compared (all from the same calibration): ``simulator`` (step_sim with interference; its
exposed communication counts a rank's wait for the slowest rank, as the hook's own records do,
``StepCalibration.rank_wait_ns``), ``simulator_median`` (the same with median interference
factors in place of means, an ablation), ``idle_ring`` (the same timeline and fit, no
interference, one channel: ``commprof estimate``'s model), ``bucket_sum`` (compute plus the sum
of the buckets' in-training times from the ``buckets`` fit of the calibration cell, no overlap),
``no_overlap`` (compute plus the sum of idle all-reduce times). Error: step time APE, and
|predicted - measured exposed| / measured step.

Advice by regret: the cap the simulator recommends among the four (calibration only) against the
best measured cap; within 3 % counts as a hit. The headline reading is ``interleaved``: each
round also trains each model's four caps side by side in one gang, step by step in a shuffled
order (``_pairs_gang``, ``PAIR_STEPS`` cycles), so that the host's drift, which moves whole cells
by 6 to 7 % on this host, hits every cap alike; a round's pair is the recommended and the best
measured cap's medians over that round's interleaved steps. Reported beside it, on the cells:
``pairs`` (the two caps' cells of each round), ``round_best`` (against the shortest of the
round's four cells) and ``same_layout`` (two caps that DDP buckets identically count as one
configuration).

Usage: ``python benchmarks/bench_step_model.py [--rounds 10] [--budget-s 1500]`` writes
``benchmarks/results/step_model.json`` and ``benchmarks/results/step_model_data.tar.gz``;
``--analyze-only`` recomputes the report from that archive (or from a folder, ``--data``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ledger  # noqa: E402
import torch  # noqa: E402
from bench_env import environment  # noqa: E402
from step_model_analysis import PAIRS_FILE  # noqa: E402

from commprof import results  # noqa: E402
from commprof.matrix import Cell  # noqa: E402
from commprof.outcomes import merge_rank_records  # noqa: E402
from commprof.training.launcher import spawn_ranks  # noqa: E402

MODELS = {"srn-1m": 8, "srn-10m": 8, "resnet18": 1}
"""Models and their per-rank batch size (resnet18 at 1 keeps a round short on a loaded host)."""
CAPS_MB = (0.25, 1.0, 4.0, 25.0)
CALIBRATION_CAP_MB = 25.0
"""The cap each model is calibrated on (DDP's default size)."""
BIG_WORLD = ("srn-10m", 4, 25.0)
"""(model, world size, cap) predicted from the model's p = 2 calibration."""
STEPS, WARMUP = 22, 2
"""Steps 2 to 21 measured (step 0 never is): 20 a cell; with 4, a cell's median moved by up to
30 % between rounds (a single step of srn-1m at 0.25 MiB took 10 to 30 ms)."""
SEED = 1
PAIR_STEPS = {"srn-1m": 480, "srn-10m": 80, "resnet18": 40}
"""Cycles of the step-interleaved pairs per model and round (each one step of every cap): about
20 to 35 s of steps a model on this host, so that a cap's median over its steps moves by 1 to 2 %
between rounds by the step noise measured on this host (median of n steps: 1.25 sigma /
sqrt(n), per-step sigma about 30 % srn-1m, 8 % srn-10m, 6 % resnet18)."""
ARCHIVE = REPO / "benchmarks/results/step_model_data.tar.gz"
"""The raw dataset of the latest run, compressed (one folder, ``ARCHIVE_ROOT``)."""
ARCHIVE_ROOT = "step_model_data"
SCRATCH = Path(os.environ.get("TMPDIR", "/tmp")) / "commprof-bench" / ARCHIVE_ROOT
"""Where a collection writes the dataset before it is packed."""
MINIMAL_MICROBENCH = {
    "microbench_sizes_bytes": (4096,),
    "microbench_iters": 1,
    "interference_iters": 0,
}
"""Validation cells: no interference arms, one tiny microbenchmark size (bucket sizes are still
measured once each): the model never reads them."""


def _cells(round_index: int, models: dict[str, int]) -> list[Cell]:
    cells = []
    for model, batch in models.items():
        for cap in CAPS_MB:
            calibration = cap == CALIBRATION_CAP_MB
            extra: dict[str, Any] = {} if calibration else dict(MINIMAL_MICROBENCH)
            cells.append(
                Cell(
                    model=model, world_size=2, bucket_cap_mb=cap, batch_size=batch, steps=STEPS,
                    warmup_steps=WARMUP, seed=SEED, repeat=round_index, **extra,
                )
            )  # fmt: skip
    model, world, cap = BIG_WORLD
    cells.append(
        Cell(
            model=model, world_size=world, bucket_cap_mb=cap, batch_size=MODELS[model],
            steps=STEPS, warmup_steps=WARMUP, seed=SEED, repeat=round_index, **MINIMAL_MICROBENCH,
        )
    )  # fmt: skip
    return cells


def _gang(rank: int, world_size: int, store_path: str, cells: list[Cell]) -> list[dict[str, Any]]:
    """One rank running several cells in one process group, as a reused Ray gang does."""
    import torch.distributed as dist

    from commprof.training.launcher import fingerprint, process_group
    from commprof.training.trainer import train_rank

    out = []
    device = torch.device("cpu")
    store = dist.FileStore(store_path, world_size)
    with process_group(backend="gloo", rank=rank, world_size=world_size, store=store):
        for cell in cells:
            out.append({**train_rank(cell, rank=rank, device=device), "env": fingerprint(device)})
    return out


def _pairs_gang(
    rank: int, world_size: int, store_path: str, round_index: int, steps: dict[str, int]
) -> dict[str, dict[str, list[int]]]:
    """One rank of a round's step-interleaved pairs: per model, its four caps trained side by side.

    Four DDP replicas of the model (one per cap, the same initial weights, each with the timing
    hook and its own optimizer) in one process group; two warm-up steps each, then ``steps[model]``
    cycles, each one step of every cap on the same batch, in an order shuffled every cycle (a
    seeded generator, the same on every rank; a rotation would keep each cap's neighbours). The
    steps are timed as a cell's (``trainer._timed_step``). Returns per model and cap the
    measured step times (ns).
    """
    import torch.distributed as dist

    from commprof.profiling.comm_hooks import register_timing_hook
    from commprof.training.data import loss_fn, make_batch
    from commprof.training.launcher import process_group
    from commprof.training.models import build_model
    from commprof.training.trainer import _optimizer, _timed_step

    device = torch.device("cpu")
    out: dict[str, dict[str, list[int]]] = {}
    store = dist.FileStore(store_path, world_size)
    with process_group(backend="gloo", rank=rank, world_size=world_size, store=store):
        for model, cycles in steps.items():
            arms = []
            for cap_mb in CAPS_MB:
                cell = Cell(model=model, world_size=world_size, bucket_cap_mb=cap_mb, seed=SEED)
                torch.manual_seed(SEED)
                ddp = torch.nn.parallel.DistributedDataParallel(
                    build_model(model).to(device), bucket_cap_mb=cap_mb
                )
                state = register_timing_hook(ddp, inner=cell.hook)
                arms.append((str(cap_mb), ddp, state, _optimizer(cell, ddp.parameters())))
            criterion = loss_fn(model)
            times: dict[str, list[int]] = {cap: [] for cap, *_ in arms}
            order = random.Random(SEED + round_index)  # the same on every rank
            for step in range(WARMUP + cycles):
                inputs, targets = make_batch(
                    model, MODELS[model], rank=rank, seed=SEED + round_index, step=step,
                    device=device,
                )  # fmt: skip
                order.shuffle(arms)
                for cap, ddp, state, optimizer in arms:
                    state.step = step
                    t0, _, _, t3 = _timed_step(ddp, optimizer, criterion, inputs, targets, device)
                    state.resolve()
                    if step >= WARMUP:
                        times[cap].append(t3 - t0)
            out[model] = times
    return out


def _commit(data: Path, cells: list[Cell], per_rank: list[list[dict[str, Any]]]) -> None:
    for i, cell in enumerate(cells):
        ranks = [results_of_rank[i] for results_of_rank in per_rank]
        row = results.cell_row(
            cell, sweep="step-model", attempt=1, status="ok", env=ranks[0]["env"],
            load_avg_1m=ranks[0]["env"].get("load_avg_1m"),
        )  # fmt: skip
        results.write_attempt(data, row, merge_rank_records(ranks))


def collect(
    data: Path, rounds: int, budget_s: float, models: dict[str, int], pair_steps: dict[str, int]
) -> dict[str, Any]:
    """Run the rounds into ``data``; stop starting rounds once ``budget_s`` is spent.

    Per round one 2-rank gang (fresh processes) runs the twelve p = 2 cells in a shuffled order
    in one process group, then a 4-rank gang the p = 4 cell: process start (seconds a cell on a
    loaded host) is paid once a round instead of once a cell. A third gang then runs the round's
    step-interleaved pairs (``_pairs_gang``, ``pair_steps`` cycles per model), kept in
    ``data / PAIRS_FILE`` as ``[{"round", "ranks": [{model: {cap: [ns]}}]}]``.
    """
    started = time.monotonic()
    done = 0
    orders = []
    pairs: list[dict[str, Any]] = []
    for r in range(rounds):
        if r > 0 and time.monotonic() - started > budget_s:
            break
        cells = _cells(r, models)
        random.Random(SEED + r).shuffle(cells)
        for world in (2, 4):
            group = [c for c in cells if c.world_size == world]
            per_rank = spawn_ranks(_gang, world, args=(group,), limit_s=1800)
            _commit(data, group, per_rank)
            orders.append([c.cell_id for c in group])
        if pair_steps:
            per_rank_pairs = spawn_ranks(_pairs_gang, 2, args=(r, pair_steps), limit_s=1800)
            pairs.append({"round": r, "ranks": per_rank_pairs})
            (data / PAIRS_FILE).write_text(json.dumps(pairs) + "\n")
        done += 1
        print(f"round {r} done at {time.monotonic() - started:.0f} s", flush=True)
    return {"rounds_done": done, "collect_s": time.monotonic() - started, "orders": orders}


def pack(data: Path, archive: Path) -> None:
    """Write the dataset folder ``data`` to ``archive`` as a .tar.gz under ``ARCHIVE_ROOT``.

    Members are sorted, with no times, owners or modes of this machine, so the archive depends
    only on the files' names and bytes.
    """
    archive.parent.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in data.rglob("*") if p.is_file())
    with (
        archive.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in files:
            info = tarfile.TarInfo(f"{ARCHIVE_ROOT}/{path.relative_to(data).as_posix()}")
            info.size, info.mode = path.stat().st_size, 0o644
            with path.open("rb") as fh:
                tar.addfile(info, fh)


def unpack(archive: Path, into: Path) -> Path:
    """Extract ``archive`` (written by :func:`pack`) into ``into``; returns the dataset folder."""
    if not archive.is_file():
        raise ValueError(f"--archive {archive}: no such file; run the benchmark or pass --data")
    with tarfile.open(archive, "r:gz") as tar:
        stray = [n for n in tar.getnames() if not n.startswith(f"{ARCHIVE_ROOT}/")]
        if stray:
            raise ValueError(
                f"--archive {archive}: {stray[0]!r} is outside {ARCHIVE_ROOT}/; "
                "pass an archive written by this script"
            )
        tar.extractall(into, filter="data")
    return into / ARCHIVE_ROOT


def _report(data: Path) -> dict[str, Any]:
    """The collection's metadata and the analysis of the dataset folder ``data``."""
    from step_model_analysis import analyze

    meta = json.loads((data / "collection.json").read_text())
    report = {**meta, **analyze(data)}
    report.pop("orders", None)
    return report


def headline(report: dict[str, Any]) -> str:
    """The ledger's figures: the simulator's held-out step MAPE and worst exposed error per
    model, its advice hits (interleaved where the run has them), p = 2 to 4, the load average."""
    names = sorted(report["models"])
    summary = report["summary"]

    def per_model(values: list[str]) -> str:
        return " / ".join(values)

    step = per_model([f"{summary[n]['held_out_step_mape_pct']['simulator']:.1f}" for n in names])
    exposed = per_model(
        [f"{summary[n]['held_out_exposed_err_max_pct_of_step']['simulator']:.1f}" for n in names]
    )
    advice = [report["models"][n]["advice"]["simulator"] for n in names]
    reading = "interleaved" if all("interleaved" in a for a in advice) else "cell pairs"
    hits = per_model(
        [str(a["interleaved"]["hits"] if "interleaved" in a else a["hits"]) for a in advice]
    )
    env = report["environment"]
    return (
        f"{per_model(names)}: step MAPE {step} %, worst exposed {exposed} % of the step, advice "
        f"{hits} of {advice[0]['rounds']} ({reading}); p = 2 to 4 "
        f"{summary['p2_to_p4']['same_host']:.1f} %; load {env['load_avg_1m_at_start']:.1f} to "
        f"{env['load_avg_1m_at_end']:.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=1500.0, help="no new round after this")
    parser.add_argument(
        "--data", type=Path, default=None,
        help=f"dataset folder: where a collection writes (default {SCRATCH}), or what "
        "--analyze-only reads in place of --archive",
    )  # fmt: skip
    parser.add_argument("--archive", type=Path, default=ARCHIVE, help="the dataset, compressed")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/step_model.json")
    parser.add_argument("--analyze-only", action="store_true", help="reuse the kept dataset")
    parser.add_argument("--collect-only", action="store_true", help="collect, analyze later")
    parser.add_argument("--smoke", action="store_true", help="srn-10m only (checks the script)")
    ledger.add_change_argument(parser)
    args = parser.parse_args()
    if args.smoke:  # never over the kept result
        if args.out == parser.get_default("out"):
            args.out = SCRATCH.parent / "step_model_smoke.json"
        if args.archive == ARCHIVE:
            args.archive = SCRATCH.parent / "step_model_smoke_data.tar.gz"

    if args.analyze_only:
        if args.data is not None:
            report = _report(args.data)
        else:
            with tempfile.TemporaryDirectory(prefix="commprof-step-model-") as tmp:
                report = _report(unpack(args.archive, Path(tmp)))
    else:
        data = args.data or SCRATCH
        if data.exists():
            shutil.rmtree(data)
        load_at_start = os.getloadavg()[0]
        models = {"srn-10m": MODELS["srn-10m"]} if args.smoke else MODELS
        pair_steps = {m: PAIR_STEPS[m] for m in models}
        meta = collect(data, args.rounds, args.budget_s, models, pair_steps)
        meta["environment"] = {**environment("end"), "load_avg_1m_at_start": load_at_start}
        (data / "collection.json").write_text(json.dumps(meta, indent=1) + "\n")
        pack(data, args.archive)
        print(f"-> {args.archive}")
        if args.collect_only:
            return 0
        report = _report(data)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=1))
    print(f"-> {args.out}")
    if not args.analyze_only:
        ledger.print_row(
            "step_model", change=args.change, figures=headline(report),
            files=[args.out, args.archive],
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
